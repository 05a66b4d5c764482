"""Range, ZerosLike, OnesLike and MemSet: the real Level2 rows (the 1.5 GB ZerosLike row included,
verified exactly against a broadcast constant), the torch calls that launch them on an NPU, rows
they cannot build (MemSet's always), and a CPU torch.profiler trace ingested into their rows."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.factories import OnesLikeReplay, RangeReplay, ZerosLikeReplay
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import aten_ops_of_run, kernel_row, level2_rows, op_mapping_api, replay_of, replay_on_cpu

# kernel type -> (npu_api, the aten operator run dispatches)
TYPES = {
    "Range": ("torch.arange", "aten.arange"),
    "ZerosLike": ("torch.Tensor.zero_", "aten.zero_"),
    "OnesLike": ("torch.ones_like", "aten.ones_like"),
}
REAL = [(t, c) for t in TYPES for c in level2_rows(t)]


def cells(shapes: str, dtypes: str, out_shapes: str, out_dtypes: str) -> dict[str, str]:
    return {
        "Input Shapes": shapes, "Input Data Types": dtypes, "Input Formats": "ND",
        "Output Shapes": out_shapes, "Output Data Types": out_dtypes, "Output Formats": "ND",
    }  # fmt: skip


def ids(value: object) -> str:
    return value if isinstance(value, str) else str(value["Input Shapes"])  # type: ignore[index]


@pytest.mark.parametrize(("kernel_type", "row"), REAL, ids=ids)
def test_the_npu_api_is_the_torch_call_run_makes(kernel_type: str, row: dict[str, str]) -> None:
    api, aten = TYPES[kernel_type]
    replay = replay_of(kernel_type)
    assert op_mapping_api(kernel_type) is None and replay.npu_api == api
    assert replay.npu_call(kernel_row(kernel_type, row), ()) is None
    if row["Input Shapes"] != '"375815680"':  # dispatching it would fill 1.5 GB for nothing
        assert aten_ops_of_run(kernel_type, row) == [aten]


def test_range_is_arange_from_zero_with_the_scalars_recorded_as_double() -> None:
    (row,) = level2_rows("Range")
    replay = replay_of("Range")
    generator = torch.Generator().manual_seed(0)
    start, end, step, dtype, device = replay.make_inputs(kernel_row("Range", row), torch.device("cpu"), generator)
    assert (start, end, step, dtype) == (0.0, 4096.0, 1.0, torch.float32)
    assert all(isinstance(v, float) for v in (start, end, step))  # DOUBLE slots: float scalars
    out, _ = replay_on_cpu("Range", row)
    assert out.tolist() == list(range(4096))
    ints, _ = replay_on_cpu("Range", cells('";;"', "INT64;INT64;INT64", '"100"', "INT64"))
    assert ints.dtype == torch.int64 and ints[-1] == 99


@pytest.mark.parametrize(("kernel_type", "row"), REAL, ids=ids)
def test_real_rows_replay_and_verify_exactly_on_the_cpu(kernel_type: str, row: dict[str, str]) -> None:
    out, ref = replay_on_cpu(kernel_type, row)
    if kernel_type != "Range":
        assert ref.stride() == (0,) * ref.dim()  # a broadcast constant: no second 1.5 GB buffer
        assert out.view(-1)[:1].item() == (1 if kernel_type == "OnesLike" else 0)


def test_memset_is_never_replayed_and_says_why() -> None:
    (row,) = level2_rows("MemSet")
    assert row["Input Shapes"] == row["Output Shapes"] == "N/A"
    replay = replay_of("MemSet")
    assert not replay.portable
    with pytest.raises(CaseBuildError, match="records no tensors .* how many bytes it clears"):
        replay.check(kernel_row("MemSet", row))
    with pytest.raises(CaseBuildError):
        replay.make_inputs(kernel_row("MemSet", row), torch.device("cpu"), torch.Generator())


@pytest.mark.parametrize(
    ("kernel_type", "row", "message"),
    [
        ("Range", cells('"1;;"', "INT64;INT64;INT64", '"8"', "INT64"), r"three scalar input slots .* got \[1\]"),
        ("Range", cells('";;"', "DOUBLE;DOUBLE;DOUBLE", '"2,4"', "FLOAT"), r"one 1-d output, got \[2,4\]"),
        ("ZerosLike", cells('"8,4"', "FLOAT", '"8,4"', "DT_BF16"), r"output \[8,4\] BF16 differs from the input"),
        ("OnesLike", cells('"8,4"', "FLOAT", '"4,8"', "FLOAT"), r"output \[4,8\] FLOAT differs"),
        ("ZerosLike", cells('"8,4;8,4"', "FLOAT;FLOAT", '"8,4"', "FLOAT"), "one input and one output, got 2"),
    ],
)
def test_rows_it_cannot_build_name_the_slot(kernel_type: str, row: dict[str, str], message: str) -> None:
    with pytest.raises(CaseBuildError, match=message):
        replay_of(kernel_type).check(kernel_row(kernel_type, row))


class ZeroesHalf(ZerosLikeReplay):
    def run(self, x: torch.Tensor) -> torch.Tensor:
        x[: x.shape[0] // 2].zero_()
        return x


class Twos(OnesLikeReplay):
    def run(self, x: torch.Tensor) -> torch.Tensor:
        return torch.full_like(x, 2)


class FromOne(RangeReplay):
    def run(self, start: float, end: float, step: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.arange(start + 1, end + 1, step, dtype=dtype, device=device)


@pytest.mark.parametrize(
    ("wrong", "row"),
    [
        (ZeroesHalf(), cells('"64,8"', "FLOAT", '"64,8"', "FLOAT")),
        (Twos(), level2_rows("OnesLike")[0]),
        (FromOne(), level2_rows("Range")[0]),
    ],
    ids=lambda v: type(v).__name__,
)
def test_verification_bites_on_a_wrong_fill(
    wrong: RangeReplay | ZerosLikeReplay | OnesLikeReplay, row: dict[str, str]
) -> None:
    kernel_type = wrong.kernel_types[0]
    parsed = kernel_row(kernel_type, row)
    args = wrong.make_inputs(parsed, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(VerificationError, match="differ from the reference"):
        verify_outputs(wrong, parsed, wrong.run(*args), replay_of(kernel_type).reference(*args))


def test_a_cpu_trace_becomes_rows_of_the_real_layout(tmp_path: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    from perf_plugin.ingest.pipeline import ingest_path

    buffer, loss = torch.randn(4, 24), torch.randn(1)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(2):
            torch.arange(4096, dtype=torch.float32), torch.zeros_like(buffer), buffer.zero_(), torch.ones_like(loss)
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    ingest_path(trace, tmp_path / "db")
    identity = ("Input Shapes", "Input Data Types", "Output Shapes", "Output Data Types")
    for kernel_type in TYPES:
        written = list(csv.DictReader((tmp_path / "db" / f"{kernel_type}.csv").open()))
        assert len(written) == 1  # zeros_like and zero_ of one buffer are one ZerosLike row
        real = [[r[c] for c in identity] for r in level2_rows(kernel_type)]
        assert [written[0][c] for c in identity] in real  # ";;" DOUBLE... -> "4096" FLOAT, "4,24", "1"
        replay_on_cpu(kernel_type, written[0])
