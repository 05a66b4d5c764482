"""LpNormV2: the real Level2 rows (per-gradient 2-norms down to a 0-d output), the torch call that
launches it on an NPU, the chunked float64 reference, rows it cannot build, and a CPU
torch.profiler trace ingested into its rows.

The 220M-element row runs in full on the CPU (about 1 s of random input, 2 passes).  The 155M and
78M rows take the same path at smaller sizes; they are checked with ``meta_outputs`` only, to keep
this file fast, and the numerics of their layout with the other real rows.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.reductions import ORDER, LpNormV2Replay
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import (
    aten_ops_of_run,
    kernel_row,
    level2_rows,
    meta_outputs,
    op_mapping_api,
    replay_of,
    replay_on_cpu,
)

ROWS = level2_rows("LpNormV2")
MEDIUM = {'"155582464"', '"77791232"'}
FULL = [c for c in ROWS if c["Input Shapes"] not in MEDIUM]


def cells(shapes: str, dtypes: str, out_shapes: str, out_dtypes: str) -> dict[str, str]:
    return {
        "Input Shapes": shapes, "Input Data Types": dtypes, "Input Formats": "ND",
        "Output Shapes": out_shapes, "Output Data Types": out_dtypes, "Output Formats": "ND",
    }  # fmt: skip


def test_the_real_rows_are_whole_tensor_norms_with_a_0d_output() -> None:
    assert len(ROWS) == 9 and {c["Output Shapes"] for c in ROWS} == {'""'}
    assert {c["Input Shapes"] for c in ROWS} >= {'"220233216"', '"128"'} | MEDIUM


def test_the_npu_api_is_linalg_vector_norm_of_order_2() -> None:
    replay = replay_of("LpNormV2")
    small = min(ROWS, key=lambda c: int(c["Input Shapes"].strip('"')))
    assert op_mapping_api("LpNormV2") is None and replay.npu_api == "torch.linalg.vector_norm"
    args = replay.make_inputs(kernel_row("LpNormV2", small), torch.device("cpu"), torch.Generator().manual_seed(0))
    assert args[1:] == (ORDER, None) and ORDER == 2.0  # gradient clipping's norm_type, no dtype change
    assert replay.npu_call(kernel_row("LpNormV2", small), args) is None
    assert aten_ops_of_run("LpNormV2", small) == ["aten.linalg_vector_norm"]


def test_large_inputs_on_the_cpu_take_the_norm_of_slice_norms() -> None:
    # torch's CPU kernel sums float32 sequentially (1.8% off at 2.2e8 elements): on the CPU only,
    # large inputs are split; on an NPU or CUDA device run is the one call above.
    row = cells(f'"{1 << 22}"', "FLOAT", '""', "FLOAT")
    assert aten_ops_of_run("LpNormV2", row) == ["aten.view", "aten.linalg_vector_norm", "aten.linalg_vector_norm"]


@pytest.mark.parametrize("row", FULL, ids=lambda c: c["Input Shapes"])
def test_real_rows_replay_and_verify_on_the_cpu(row: dict[str, str]) -> None:
    out, ref = replay_on_cpu("LpNormV2", row)
    assert out.shape == () and out.dtype == torch.float32 and ref.dtype == torch.float64


@pytest.mark.parametrize("row", [c for c in ROWS if c["Input Shapes"] in MEDIUM], ids=lambda c: c["Input Shapes"])
def test_medium_rows_build_the_right_output(row: dict[str, str]) -> None:
    out = meta_outputs("LpNormV2", row)
    assert out.shape == () and out.dtype == torch.float32


def test_half_precision_inputs_and_a_float_output() -> None:
    out, _ = replay_on_cpu("LpNormV2", cells('"4096"', "DT_BF16", '""', "DT_BF16"))
    assert out.dtype == torch.bfloat16
    out, _ = replay_on_cpu("LpNormV2", cells('"4096"', "DT_BF16", '""', "FLOAT"))
    assert out.dtype == torch.float32  # vector_norm(x, 2, dtype=float32)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (cells('"64,32"', "FLOAT", '"64"', "FLOAT"), r"output \[64\] is not 0-d: only whole-tensor norms"),
        (cells('"64"', "INT32", '""', "INT32"), "input dtype INT32 is not floating"),
        (cells('"64"', "FLOAT", '""', "DT_BF16"), "output dtype BF16 is neither the input's FLOAT"),
        (cells('"64;64"', "FLOAT;FLOAT", '""', "FLOAT"), "one input and one output, got 2"),
    ],
)
def test_rows_it_cannot_build_name_the_slot(row: dict[str, str], message: str) -> None:
    with pytest.raises(CaseBuildError, match=message):
        replay_of("LpNormV2").check(kernel_row("LpNormV2", row))


class OneNorm(LpNormV2Replay):
    def run(self, x: torch.Tensor, order: float, dtype: torch.dtype | None) -> torch.Tensor:
        return super().run(x, 1.0, dtype)


class HalfTheTensor(LpNormV2Replay):
    def run(self, x: torch.Tensor, order: float, dtype: torch.dtype | None) -> torch.Tensor:
        return super().run(x[: x.numel() // 2], order, dtype)


@pytest.mark.parametrize("wrong", [OneNorm(), HalfTheTensor()], ids=lambda r: type(r).__name__)
def test_verification_bites_on_a_wrong_norm(wrong: LpNormV2Replay) -> None:
    row = kernel_row("LpNormV2", cells('"3145728"', "FLOAT", '""', "FLOAT"))
    args = wrong.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(VerificationError, match="relative error"):
        verify_outputs(wrong, row, wrong.run(*args), wrong.reference(*args))


def test_a_cpu_trace_becomes_rows_of_the_real_layout(tmp_path: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    from perf_plugin.ingest.pipeline import ingest_path

    grad, bias = torch.randn(1024), torch.randn(64, 2)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(2):
            torch.linalg.vector_norm(grad), torch.norm(grad, 2.0), torch.linalg.vector_norm(bias, 2, dim=1)
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    ingest_path(trace, tmp_path / "db")
    written = list(csv.DictReader((tmp_path / "db" / "LpNormV2.csv").open()))
    assert len(written) == 1 and int(written[0]["Profiling Count"] or 0) in (0, 4)
    real = next(c for c in ROWS if c["Input Shapes"] == '"1024"')
    identity = ("Input Shapes", "Input Data Types", "Output Data Types")
    assert [written[0][c] for c in identity] == [real[c] for c in identity]
    assert written[0]["Output Shapes"] in ("", '""')  # 0-d
    replay_on_cpu("LpNormV2", written[0])
    assert not any(r.get("Input Shapes") == '"64,2"' for r in written)  # a norm over dim 1 is not this row
