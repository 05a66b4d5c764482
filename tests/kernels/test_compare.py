"""Equal, NotEqual, Greater and Pows: real Level2 rows (0-d operands written as empty slots), the
torch call that launches each on an NPU, exact boolean verification, rows they cannot build, and a
CPU torch.profiler trace ingested into their rows.

The tensor-tensor comparison rows below are written in the real rows' layout (``x;y`` shapes,
BOOL output of the broadcast shape); the profile has only scalar-operand rows of these types.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.compare import POWS_EXPONENT, EqualReplay, GreaterReplay, PowsReplay
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import aten_ops_of_run, kernel_row, level2_rows, op_mapping_api, replay_of, replay_on_cpu

# kernel type -> (torch function, the aten overload the real row's call dispatches)
TYPES = {
    "Equal": ("eq", "aten.eq"),
    "NotEqual": ("ne", "aten.ne"),
    "Greater": ("gt", "aten.gt"),
    "Pows": ("pow", "aten.pow"),
}
REAL = [(t, c) for t in TYPES for c in level2_rows(t)]


def cells(shapes: str, dtypes: str, out_shapes: str, out_dtypes: str) -> dict[str, str]:
    return {
        "Input Shapes": shapes, "Input Data Types": dtypes, "Input Formats": "ND;ND",
        "Output Shapes": out_shapes, "Output Data Types": out_dtypes, "Output Formats": "ND",
    }  # fmt: skip


def ids(value: object) -> str:
    return value if isinstance(value, str) else str(value["Input Shapes"])  # type: ignore[index]


def test_every_kernel_type_has_a_real_row() -> None:
    assert {t for t, _ in REAL} == set(TYPES)


@pytest.mark.parametrize(("kernel_type", "row"), REAL, ids=ids)
def test_the_npu_api_is_the_torch_operator_with_a_host_scalar(kernel_type: str, row: dict[str, str]) -> None:
    function, aten = TYPES[kernel_type]
    replay = replay_of(kernel_type)
    assert op_mapping_api(kernel_type) is None and replay.npu_api == f"torch.{function}"
    parsed = kernel_row(kernel_type, row)
    args = replay.make_inputs(parsed, torch.device("cpu"), torch.Generator().manual_seed(0))
    x, other = args
    # The empty second slot is a host scalar: the Scalar overloads (aclnnEqScalar, aclnnGtScalar,
    # aclnnPowTensorScalar) the real kernels' names carry.
    assert isinstance(other, float) and x.shape == (() if kernel_type != "Greater" else (4,))
    assert replay.npu_call(parsed, args) is None
    assert aten_ops_of_run(kernel_type, row) == [aten]
    if kernel_type == "Pows":
        assert other == POWS_EXPONENT == 2.0


@pytest.mark.parametrize(("kernel_type", "row"), REAL, ids=ids)
def test_real_rows_replay_and_verify_on_the_cpu(kernel_type: str, row: dict[str, str]) -> None:
    out, _ = replay_on_cpu(kernel_type, row)
    assert out.dtype == (torch.float32 if kernel_type == "Pows" else torch.bool)


def test_equality_rows_hold_both_outcomes_and_greater_splits() -> None:
    equal, _ = replay_on_cpu("Equal", level2_rows("Equal")[0])
    assert equal.shape == () and bool(equal)  # the 0-d x holds the planted scalar
    out, _ = replay_on_cpu("Equal", cells('"64,32;64,32"', "FLOAT;FLOAT", '"64,32"', "BOOL"))
    assert 0 < int(out.sum()) < out.numel()  # tensor-tensor: half the elements planted equal
    out, _ = replay_on_cpu("NotEqual", cells('"8,1;1,16"', "DT_BF16;DT_BF16", '"8,16"', "BOOL"))
    assert out.shape == (8, 16)  # broadcast
    out, _ = replay_on_cpu("Greater", cells('"4096;"', "FLOAT;FLOAT", '"4096"', "BOOL"))
    assert 0 < int(out.sum()) < out.numel()
    out, _ = replay_on_cpu("Greater", cells('"4096;"', "INT64;INT64", '"4096"', "BOOL"))
    assert 0 < int(out.sum()) < out.numel()


@pytest.mark.parametrize(
    ("kernel_type", "row", "message"),
    [
        ("Equal", cells('"8,4;8,5"', "FLOAT;FLOAT", '"8,4"', "BOOL"), r"\[8,4\] and other \[8,5\] do not broadcast"),
        ("Equal", cells('"8,4;"', "FLOAT;FLOAT", '"8,4"', "FLOAT"), "output dtype is FLOAT, a comparison gives BOOL"),
        ("Greater", cells('"8,4;"', "FLOAT;FLOAT", '"4,8"', "BOOL"), r"broadcast to \[8,4\], the output is \[4,8\]"),
        ("NotEqual", cells('"8,4"', "FLOAT", '"8,4"', "BOOL"), "needs input slots x;other"),
        ("Pows", cells('"8,4;8,4"', "FLOAT;FLOAT", '"8,4"', "FLOAT"), "exponent .* is a tensor .* Pow kernel"),
        ("Pows", cells('"8,4;"', "INT32;INT32", '"8,4"', "INT32"), "base dtype INT32 is not floating"),
        ("Pows", cells('"8,4;"', "FLOAT;FLOAT", '"8,4"', "DT_BF16"), r"output \[8,4\] BF16 should be the base's"),
    ],
)
def test_rows_it_cannot_build_name_the_slot(kernel_type: str, row: dict[str, str], message: str) -> None:
    with pytest.raises(CaseBuildError, match=message):
        replay_of(kernel_type).check(kernel_row(kernel_type, row))


@pytest.mark.parametrize(
    ("kernel_type", "wrong"),
    [
        ("Equal", type("NeInsteadOfEq", (EqualReplay,), {"function": "ne"})),
        ("Greater", type("LtInsteadOfGt", (GreaterReplay,), {"function": "lt"})),
        ("Pows", type("CubeInsteadOfSquare", (PowsReplay,), {"run": lambda self, x, e: torch.pow(x, e + 1)})),
    ],
)
def test_verification_bites_on_a_wrong_operator(kernel_type: str, wrong: type) -> None:
    replay = wrong()
    row = kernel_row(kernel_type, level2_rows(kernel_type)[0])
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(VerificationError):
        verify_outputs(replay, row, replay.run(*args), replay_of(kernel_type).reference(*args))


def test_a_cpu_trace_becomes_rows_of_the_real_layout(tmp_path: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    from perf_plugin.ingest.pipeline import ingest_path

    norm, flags = torch.tensor(3.0), torch.randn(4)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(2):
            norm == float("inf"), norm != norm, flags > 0.5, torch.pow(norm, 2.0)
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    ingest_path(trace, tmp_path / "db")
    for kernel_type in TYPES:
        (row,) = list(csv.DictReader((tmp_path / "db" / f"{kernel_type}.csv").open()))
        (real,) = level2_rows(kernel_type)
        layout = ("Input Data Types", "Output Data Types")
        assert [row[c] for c in layout] == [real[c] for c in layout]
        assert row["Input Shapes"] == real["Input Shapes"]  # ";" and "4;" as the profile writes them
        replay_on_cpu(kernel_type, row)
