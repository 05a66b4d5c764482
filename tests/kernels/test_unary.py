"""Sin, Cos and Abs: the real Level2 rows, the torch call that is their NPU launch, exact or float64
verification, rows they cannot build, and a CPU torch.profiler trace ingested into their rows."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.unary import AbsReplay, SinReplay
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import aten_ops_of_run, kernel_row, level2_rows, op_mapping_api, replay_of, replay_on_cpu

TYPES = {"Sin": "sin", "Cos": "cos", "Abs": "abs"}
REAL = [(t, c) for t in TYPES for c in level2_rows(t)]


def cells(shapes: str, dtypes: str, out_shapes: str, out_dtypes: str) -> dict[str, str]:
    return {
        "Input Shapes": shapes, "Input Data Types": dtypes, "Input Formats": "ND",
        "Output Shapes": out_shapes, "Output Data Types": out_dtypes, "Output Formats": "ND",
    }  # fmt: skip


def test_every_kernel_type_has_a_real_row() -> None:
    assert {t for t, _ in REAL} == set(TYPES)


@pytest.mark.parametrize(("kernel_type", "row"), REAL, ids=lambda v: v if isinstance(v, str) else v["Input Shapes"])
def test_the_npu_api_is_the_torch_operator_run_dispatches(kernel_type: str, row: dict[str, str]) -> None:
    replay = replay_of(kernel_type)
    assert op_mapping_api(kernel_type) is None  # the op_mapping files name none: the aclnn name decides
    assert replay.npu_api == f"torch.{TYPES[kernel_type]}"
    assert replay.npu_call(kernel_row(kernel_type, row), ()) is None  # run is the NPU call
    assert aten_ops_of_run(kernel_type, row) == [f"aten.{TYPES[kernel_type]}"]


@pytest.mark.parametrize(("kernel_type", "row"), REAL, ids=lambda v: v if isinstance(v, str) else v["Input Shapes"])
def test_real_rows_replay_and_verify_on_the_cpu(kernel_type: str, row: dict[str, str]) -> None:
    out, ref = replay_on_cpu(kernel_type, row)
    assert out.shape == ref.shape
    if kernel_type == "Abs":  # "" FLOAT: a 0-d tensor
        assert out.shape == () and out.dtype == torch.float32 and float(out) > 0


def test_integer_inputs_give_float_sin_and_keep_their_dtype_in_abs() -> None:
    out, _ = replay_on_cpu("Sin", cells('"8,4"', "INT64", '"8,4"', "FLOAT"))
    assert out.dtype == torch.float32
    out, _ = replay_on_cpu("Abs", cells('"8,4"', "INT32", '"8,4"', "INT32"))
    assert out.dtype == torch.int32 and bool((out >= 0).all())


@pytest.mark.parametrize(
    ("kernel_type", "row", "message"),
    [
        ("Sin", cells('"8,4"', "FLOAT", '"8,5"', "FLOAT"), r"output \[8,5\] differs from the input \[8,4\]"),
        ("Cos", cells('"8,4"', "DT_BF16", '"8,4"', "FLOAT"), "output dtype FLOAT should be BF16"),
        ("Abs", cells('"8,4;8,4"', "FLOAT;FLOAT", '"8,4"', "FLOAT"), "needs one input and one output, got 2"),
        ("Abs", cells('"8,4"', "FLOAT", "", ""), "got 1 input slot.* and 0 output"),
    ],
)
def test_rows_it_cannot_build_name_the_slot(kernel_type: str, row: dict[str, str], message: str) -> None:
    with pytest.raises(CaseBuildError, match=message):
        replay_of(kernel_type).check(kernel_row(kernel_type, row))


def test_verification_bites_on_a_wrong_operator() -> None:
    class CosInsteadOfSin(SinReplay):
        function = "cos"

    class NegatingAbs(AbsReplay):
        def run(self, x: torch.Tensor) -> torch.Tensor:
            return -x.abs()

    for replay, kernel_type in ((CosInsteadOfSin(), "Sin"), (NegatingAbs(), "Abs")):
        row = kernel_row(kernel_type, level2_rows(kernel_type)[0])
        args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
        with pytest.raises(VerificationError):
            verify_outputs(replay, row, replay.run(*args), replay_of(kernel_type).reference(*args))


def test_a_cpu_trace_becomes_rows_of_the_real_layout(tmp_path: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    from perf_plugin.ingest.pipeline import ingest_path

    angles, norm = torch.randn(64, 1, 1, 16), torch.tensor(-2.5)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(2):
            torch.sin(angles), torch.cos(angles), torch.abs(norm)
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    ingest_path(trace, tmp_path / "db")
    written = {}
    for kernel_type in TYPES:
        (row,) = list(csv.DictReader((tmp_path / "db" / f"{kernel_type}.csv").open()))
        identity = ("Input Shapes", "Input Data Types", "Output Shapes", "Output Data Types")
        written[kernel_type] = tuple(row[c] for c in identity)
        replay_on_cpu(kernel_type, row)  # the ingested row replays
    assert written["Sin"] == written["Cos"] == ('"64,1,1,16"', "FLOAT", '"64,1,1,16"', "FLOAT")
    assert written["Abs"] == ("", "FLOAT", "", "FLOAT")  # 0-d in and out, as the real Abs row
