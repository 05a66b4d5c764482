"""The share of writes in the traffic before a traced operator: ingest computing and writing it,
and the replay leaving as many dirty lines in the cache before every repeat."""

from __future__ import annotations

import csv
import math
import random
from pathlib import Path

import pytest
import torch

from perf_plugin.database.errors import DatabaseError
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.ingest import write_share
from perf_plugin.ingest.write_share import recent_write_shares
from perf_plugin.replay.dirty_lines import WRITE_SHARE_COLUMN, dirty_bytes, dirty_lines
from perf_plugin.replay.tensors import KernelRow, kernel_row_from_cells
from perf_plugin.results import CaseRef
from perf_plugin.run.cases import STATUS_READY, Case
from perf_plugin.run.runner import CaseFailure, ReplayRunner
from perf_plugin.trace.mapped import MappedOp, Slot
from tests.test_cache_modes import RecordingCollector, SmallCacheCpu
from tests.test_code_reuse import _profiled_steps

FIXTURES = Path(__file__).parent / "fixtures"


def _op(read: int, written: int) -> MappedOp:
    """An operator reading ``read`` and writing ``written`` bytes (uint8 slots)."""
    return MappedOp("Add", inputs=(Slot((read,), "UINT8"),), outputs=(Slot((written,), "UINT8"),))


def test_the_share_is_of_the_traffic_before_the_call() -> None:
    ops = [_op(30, 10), _op(10, 50), _op(1, 1)]
    shares = recent_write_shares(ops, window=1000)
    assert math.isnan(shares[0])  # nothing moved before the first call
    # less traffic than the window before: what ran before the profile counts as reads
    assert shares[1] == pytest.approx(10 / 1000) and shares[2] == pytest.approx(60 / 1000)


def test_the_oldest_call_in_the_window_counts_in_proportion() -> None:
    # window 100: the last call's 60 bytes, and 40 of the first call's 80 (half its writes)
    ops = [_op(40, 40), _op(0, 60), _op(1, 1)]
    assert recent_write_shares(ops, window=100)[2] == pytest.approx((20 + 60) / 100)
    # a window the last call fills on its own: only its share
    assert recent_write_shares([_op(40, 40), _op(300, 100), _op(1, 1)], window=100)[2] == pytest.approx(0.25)


def test_the_shares_equal_a_byte_by_byte_count_on_random_sequences() -> None:
    rng = random.Random(5)
    # each operator only reads or only writes, so the order of its bytes does not matter
    ops = [_op(size, 0) if rng.random() < 0.5 else _op(0, size) for size in (rng.randrange(1, 50) for _ in range(300))]
    window = 120
    stream: list[int] = []  # per byte of traffic in order: 1 for a written byte, 0 for a read one
    expected = []
    for op in ops:
        recent = stream[-window:]
        expected.append(sum(recent) / window if recent else math.nan)
        stream += [0] * op.inputs[0].shape[0] + [1] * op.outputs[0].shape[0]  # type: ignore[index]
    found = recent_write_shares(ops, window=window)
    assert all((math.isnan(f) and math.isnan(e)) or f == pytest.approx(e) for f, e in zip(found, expected))


def test_ingest_of_a_real_cuda_trace_writes_the_share_per_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The H100 trace of three quantized residual layers, over a window of 4 KB (the default's
    64 MiB would hold all of it): the kernels after each layer's GEMM, which read a 128 KB
    weight, saw far less writing before them than the element-wise kernels before the GEMM, on
    activations of 512 bytes, and the element-wise kernels after it see the writes come back."""
    monkeypatch.setattr(write_share, "WRITE_WINDOW_BYTES", 4096)
    ingest_path(FIXTURES / "cuda" / "quantize_residual_trace.json", tmp_path)
    shares = {}
    for name in ("Abs", "aten.amax", "RealDiv", "MatMulV2", "Mul", "Add"):
        with (tmp_path / f"{name}.csv").open(newline="") as handle:
            (cells,) = [row[WRITE_SHARE_COLUMN] for row in csv.DictReader(handle)]
        shares[name] = float(cells)
        assert 0.0 <= shares[name] <= 1.0
    before_gemm = min(shares["Abs"], shares["aten.amax"], shares["RealDiv"])
    # right after the GEMM, its weight read fills the window; one kernel later, less of it does
    assert shares["Mul"] < 0.05 * before_gemm and shares["Mul"] < shares["Add"] < before_gemm, shares


def test_a_cpu_trace_has_no_write_share(tmp_path: Path) -> None:
    ingest_path(FIXTURES / "cpu" / "indexing_trace.json", tmp_path)
    for path in tmp_path.glob("*.csv"):
        assert WRITE_SHARE_COLUMN not in path.read_text().splitlines()[0]


def _row(share: str) -> KernelRow:
    cells = {"Input Shapes": '"64,64;64,64"', "Input Data Types": "FLOAT;FLOAT", "Input Formats": "ND;ND",
             "Output Shapes": '"64,64"', "Output Data Types": "FLOAT", "Output Formats": "ND",
             WRITE_SHARE_COLUMN: share}
    return kernel_row_from_cells("Mul", cells)


@pytest.mark.parametrize(("share", "rewritten", "expected"), [
    ("0.5", 1000, 4096 - 1000),  # half the cache, less what the rewrite of the inputs writes
    ("0.1", 1000, 0),
    ("", 0, 0),  # no evidence: a clean cache
    ("1", 0, 8192),
])
def test_the_dirty_bytes_are_the_share_of_the_cache_besides_the_rewrite(share: str, rewritten: int, expected: int) -> None:
    assert dirty_bytes(_row(share), 8192, rewritten) == expected


@pytest.mark.parametrize("cell", ["often", "1.5", "-0.1"])
def test_a_bad_share_is_a_database_error_naming_the_column(cell: str) -> None:
    with pytest.raises(DatabaseError) as error:
        dirty_bytes(_row(cell), 8192, 0)
    assert error.value.column == WRITE_SHARE_COLUMN and repr(cell) in str(error.value)


def test_the_dirty_lines_are_written_at_the_start_of_the_buffer() -> None:
    buffer = torch.zeros(100, dtype=torch.uint8)
    write = dirty_lines(buffer, 30)
    assert write is not None and dirty_lines(buffer, 0) is None
    write()
    assert int(buffer.sum()) == 30 and int(buffer[:30].min()) == 1


def _before_repeat_of(row: KernelRow, mode: str, cache: int = 1 << 16) -> object:
    recording = RecordingCollector()
    runner = ReplayRunner(SmallCacheCpu(cache), collector=recording, repeat_count=2, warmup_count=0,  # type: ignore[arg-type]
                          cache_mode=mode)
    runner.run(Case(CaseRef("mul", "Mul", "Mul.csv", 7, "Mul"), STATUS_READY, row=row, profiled_us=2.0))
    return recording.before_repeat["mul"]


def test_produced_mode_writes_the_dirty_lines_after_the_eviction_and_before_the_rewrite() -> None:
    cache = 1 << 16
    inputs = 2 * 64 * 64 * 4  # both float32 inputs are rewritten
    steps = _profiled_steps(_before_repeat_of(_row("0.75"), "produced", cache))
    eviction = next(i for i, (_, shapes) in enumerate(steps) if shapes[:1] == [[2 * cache // 4]])
    dirty = [i for i, (name, shapes) in enumerate(steps) if name == "aten::fill_" and shapes[:1] == [[int(0.75 * cache) - inputs]]]
    rewrite = [i for i, (name, shapes) in enumerate(steps) if name == "aten::mul_" and shapes[:1] == [[64 * 64 * 4]]]
    assert len(dirty) == 1 and len(rewrite) == 2
    assert eviction < dirty[0] < min(rewrite)


@pytest.mark.parametrize(("share", "mode"), [("", "produced"), ("0.75", "idle")])
def test_no_dirty_lines_without_evidence_or_outside_produced_mode(share: str, mode: str) -> None:
    steps = _profiled_steps(_before_repeat_of(_row(share), mode))
    # (the code eviction's kernels fill 2-d tensors, and one of a single element)
    assert steps and not any(name == "aten::fill_" and len(shapes[0]) == 1 and shapes[0][0] > 1 for name, shapes in steps)


def test_a_bad_share_fails_the_case_naming_file_row_and_column() -> None:
    with pytest.raises(CaseFailure) as failure:
        _before_repeat_of(_row("most"), "produced")
    assert all(part in str(failure.value) for part in ("Mul.csv", "7", WRITE_SHARE_COLUMN, "'most'"))
