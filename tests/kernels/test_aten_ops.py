"""Rows named after a traced aten operator replay through torch.ops.aten with their recorded arguments.

The rows come from a real torch.profiler trace of operators no kernel type declares (the
operators that were left without a replay in model traces: mean, pow, rsqrt, silu, neg,
argmax ...), ingested with ``perfdb ingest``'s pipeline.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from perf_plugin.database.schema import OP_ARGUMENTS
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.aten_ops import AtenOpReplay
from perf_plugin.replay.registry import get_replay
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import kernel_row, replay_on_cpu


def _model_ops() -> None:
    x = torch.randn(4, 64, 32, dtype=torch.bfloat16)
    w = torch.randn(32, dtype=torch.float32)
    variance = x.float().pow(2).mean(-1, keepdim=True)
    y = x.float() * torch.rsqrt(variance + 1e-6) * w
    torch.nn.functional.silu(y)
    torch.neg(y)
    torch.argmax(y, dim=-1)
    y.to(torch.bfloat16).sum(dim=1)
    torch.cumsum(y, dim=1)
    torch.logsumexp(y, dim=-1)
    torch.where(y > 0, y, torch.zeros_like(y))


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("aten")
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        _model_ops()
    trace = root / "trace.json"
    prof.export_chrome_trace(str(trace))
    ingest_path(trace, root / "db")
    return root / "db"


def _rows(database: Path, kernel_type: str) -> list[dict[str, str]]:
    with (database / f"{kernel_type}.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


# Operators no kernel type declares; the model's other operators (pow, argmax, where ...) may be
# claimed by dedicated replays, and every row left under an aten.* name must replay too.
UNCLAIMED = ("aten.mean", "aten.rsqrt", "aten.silu", "aten.neg", "aten.sum", "aten.cumsum", "aten.logsumexp")


def test_the_unclaimed_operators_are_rows_named_after_them(database: Path) -> None:
    assert set(UNCLAIMED) <= {path.stem for path in database.glob("aten.*.csv")}


def test_every_traced_aten_row_replays_and_verifies_on_the_cpu(database: Path) -> None:
    replayed = []
    for path in sorted(database.glob("aten.*.csv")):
        kernel_type = path.stem
        assert isinstance(get_replay(kernel_type), AtenOpReplay)
        for cells in _rows(database, kernel_type):
            assert cells[OP_ARGUMENTS], kernel_type
            replay_on_cpu(kernel_type, cells)
            replayed.append(kernel_type)
    assert len(replayed) >= len(UNCLAIMED)


def test_the_recorded_arguments_select_the_overload_and_its_keyword_arguments(database: Path) -> None:
    (row,) = _rows(database, "aten.mean")
    assert row[OP_ARGUMENTS] == '{"overload":"dim","args":[{"tensor":0},[-1],true,null]}'
    assert (row["Input Shapes"], row["Output Shapes"]) == ('"4,64,32"', '"4,64,1"')  # outputs from meta tensors
    (logsumexp,) = _rows(database, "aten.logsumexp")
    assert (logsumexp["Output Shapes"], logsumexp["Output Data Types"]) == ('"4,64"', "FLOAT")


def test_a_row_without_recorded_arguments_cannot_be_built() -> None:
    cells = {"Input Shapes": '"4,8"', "Input Data Types": "FLOAT", "Output Shapes": '"4,8"', "Output Data Types": "FLOAT"}
    with pytest.raises(CaseBuildError, match="no 'Op Arguments' cell"):
        AtenOpReplay().check(kernel_row("aten.gelu", cells))
    with pytest.raises(CaseBuildError, match="torch has no operator aten::no_such_op"):
        AtenOpReplay().check(kernel_row("aten.no_such_op", {**cells, OP_ARGUMENTS: '{"overload":"","args":[{"tensor":0}]}'}))
    with pytest.raises(CaseBuildError, match="the arguments name input slot 1, which the row lacks"):
        AtenOpReplay().check(kernel_row("aten.add", {**cells, OP_ARGUMENTS: '{"overload":"Tensor","args":[{"tensor":0},{"tensor":1}]}'}))


def test_a_wrong_result_fails_verification(database: Path) -> None:
    (cells,) = _rows(database, "aten.silu")
    replay = AtenOpReplay()
    row = kernel_row("aten.silu", cells)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    wrong = replay.run(*args) * 1.01
    with pytest.raises(VerificationError, match="relative error"):
        verify_outputs(replay, row, wrong, replay.reference(*args))


def test_random_draws_are_checked_for_shape_dtype_and_finite_values_only(database: Path) -> None:
    (randn,) = [cells for cells in _rows(database, "aten.randn") if cells["Output Data Types"] == "DT_BF16"]
    replay = AtenOpReplay()
    assert not replay.values_verifiable(kernel_row("aten.randn", randn))
    (silu,) = _rows(database, "aten.silu")
    assert replay.values_verifiable(kernel_row("aten.silu", silu))
    outputs, _ = replay_on_cpu("aten.randn", randn)
    broken = outputs.clone()
    broken[0, 0] = float("nan")
    with pytest.raises(VerificationError, match="not finite everywhere"):
        verify_outputs(replay, kernel_row("aten.randn", randn), broken, outputs)


def test_zero_dimensional_tensors_are_empty_shapes_with_a_dtype(tmp_path: Path) -> None:
    x = torch.arange(1, 33)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.floor_divide(x, torch.tensor(3))  # a 0-d tensor argument
        x.float().sum()  # a 0-d result
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    ingest_path(tmp_path / "trace.json", tmp_path / "db")
    (divide,) = _rows(tmp_path / "db", "aten.floor_divide")
    assert (divide["Input Shapes"], divide["Input Data Types"]) == ('"32;"', "INT64;INT64")
    outputs, _ = replay_on_cpu("aten.floor_divide", divide)
    assert tuple(outputs.shape) == (32,)
    (total,) = _rows(tmp_path / "db", "aten.sum")
    assert (total["Output Shapes"], total["Output Data Types"]) == ("", "FLOAT")
    outputs, _ = replay_on_cpu("aten.sum", total)
    assert outputs.dim() == 0


def test_a_keyword_without_default_is_passed_even_when_the_trace_left_it_unset(tmp_path: Path) -> None:
    """``torch.randint(low, high, size, generator=None)`` records the ``low_generator`` overload's
    arguments, whose ``Generator? generator`` has no default: it must be passed as None, not left out."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.randint(0, 1024, (1, 512), generator=None)
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    ingest_path(tmp_path / "trace.json", tmp_path / "db")
    (row,) = _rows(tmp_path / "db", "aten.randint")
    assert (row["Output Shapes"], row["Output Data Types"]) == ('"1,512"', "INT64")
    assert '"overload":"low_generator"' in row[OP_ARGUMENTS]
    outputs, _ = replay_on_cpu("aten.randint", row)
    assert tuple(outputs.shape) == (1, 512) and int(outputs.max()) < 1024


def test_fp8_gemms_replay_with_a_float64_reference() -> None:
    """A row as ingest writes it from an H100 trace of an FP8 linear layer (scales 0-d float32,
    the weight column-major); the reference needs no FP8 GEMM on the CPU."""
    cells = {
        "Input Shapes": '"64,128;128,32;;"', "Input Data Types": "FLOAT8_E4M3FN;FLOAT8_E4M3FN;FLOAT;FLOAT",
        "Output Shapes": '"64,32"', "Output Data Types": "DT_BF16", "Input Strides": '"128,1;1,128;;"',
        OP_ARGUMENTS: '{"overload":"default","args":[{"tensor":0},{"tensor":1},{"tensor":2},{"tensor":3},null,null,15,false]}',
    }
    replay = get_replay("aten._scaled_mm")
    assert type(replay).__name__ == "ScaledMmReplay"
    outputs, reference = replay_on_cpu("aten._scaled_mm", cells)
    assert outputs.dtype == torch.bfloat16 and reference.dtype == torch.float64
    # the weight (column-major, the second operand) and its scale are the layer's parameters
    row = kernel_row("aten._scaled_mm", cells)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    weight, weight_scale = replay.parameters(row, args)
    assert weight is args[3][1] and weight.stride() == (1, 128) and weight_scale is args[3][3]


def _complex_rotary_and_mask_scatter() -> None:
    """Llama 4's rotary embedding in complex numbers (``polar``, a complex ``mul``) and
    DeepSeek-V3.2's indexer scattering its top-k into a boolean mask."""
    positions = torch.arange(16, dtype=torch.float32)
    frequencies = torch.outer(positions, 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8)))
    rotations = torch.polar(torch.ones_like(frequencies), frequencies)  # [16, 4] complex64
    queries = torch.view_as_complex(torch.randn(1, 16, 2, 4, 2))  # [1, 16, 2, 4] complex64
    torch.view_as_real(queries * rotations[None, :, None, :])
    scores = torch.randn(1, 16, 33)
    top = scores.topk(4, dim=-1).indices
    torch.zeros(1, 16, 33, dtype=torch.bool).scatter(-1, top, True)


def test_complex_operands_and_a_scatter_into_a_boolean_mask_replay_and_verify(tmp_path: Path) -> None:
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        _complex_rotary_and_mask_scatter()
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    ingest_path(tmp_path / "trace.json", tmp_path / "db")
    replayed = {}
    for kernel_type in ("aten.polar", "Mul", "aten.scatter"):
        for cells in _rows(tmp_path / "db", kernel_type):
            outputs, _ = replay_on_cpu(kernel_type, cells)
            replayed[kernel_type] = outputs.dtype
    assert replayed == {"aten.polar": torch.complex64, "Mul": torch.complex64, "aten.scatter": torch.bool}
