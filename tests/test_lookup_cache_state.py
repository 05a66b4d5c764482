"""Norm lookups on rows the CUDA replay measured on an H100 in ``rotate`` (never profiled): the
rows whose inputs the rotation kept in the cache and the rows it read from memory are two curves
(``lookup/cache_state.py``).  Fixture: Llama-3.1-8B's, Qwen3-32B's and Llama-3.1-70B's RmsNorm
rows at 48 token counts, and ``perfdb peaks`` of an H100 with its L2's size (source:
``tests/fixtures/cuda/SOURCES.md``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from perf_plugin.lookup import cache_state, lookup
from perf_plugin.lookup.answer import FALLBACK, INTERPOLATED
from perf_plugin.lookup.command import make_query
from perf_plugin.lookup.peaks import PEAKS_FILE, read_peaks
from perf_plugin.lookup.roofline import tensor_bytes
from perf_plugin.lookup.rows import MeasuredRow, read_rows
from perf_plugin.replay.cache_modes import rotation_keeps_inputs_cached, rotation_plan
from tests.held_out import write_without

FIXTURE = Path(__file__).parent / "fixtures" / "cuda" / "h100_norms"
CSV = "RmsNorm.csv"
H100_L2 = 50 * 2**20


def test_the_rotation_keeps_inputs_cached_under_twice_the_cache_over_its_cap() -> None:
    # 1024 copies in 100 MiB: inputs under 100 KiB stay cached, as rotation_plan builds one set
    assert rotation_keeps_inputs_cached(100 * 1024 - 1, H100_L2)
    assert not rotation_keeps_inputs_cached(100 * 1024, H100_L2)
    assert not rotation_keeps_inputs_cached(4 * H100_L2, H100_L2)  # one set, larger than the cache
    for nbytes in (1024, 72 * 1024, 104 * 1024, 8 * 2**20):
        assert rotation_keeps_inputs_cached(nbytes, H100_L2) == (rotation_plan(nbytes, H100_L2, calls=10**6) == (1, False))


def test_the_rule_names_the_step_each_widths_rows_show() -> None:
    """Under 1 MiB of input, the time steps up by more than 1.5x from one token count to the next
    exactly where the rule says the rotation stopped finding the inputs cached (8 to 12 rows of
    4096 and 5120, 4 to 6 of 8192), and nowhere else."""
    peaks = read_peaks(FIXTURE / PEAKS_FILE)
    assert peaks.cache_bytes == H100_L2
    rows = read_rows(FIXTURE / CSV)
    assert len(rows) == 144 and all(cache_state.rotated(row) for row in rows)
    by_width: dict[int, list[tuple[int, float, bool]]] = {}
    for row in rows:
        shape = row.input_shapes[0]
        nbytes = tensor_bytes(row.input_shapes, row.input_dtypes)
        assert shape is not None and nbytes is not None and row.duration_us is not None
        if nbytes < 2**20:
            by_width.setdefault(shape[1], []).append((shape[0], row.duration_us, rotation_keeps_inputs_cached(nbytes, H100_L2)))
    steps = {}
    for width, series in by_width.items():
        series.sort()
        for (m, before, cached), (n, after, still) in zip(series, series[1:]):
            assert (after / before > 1.5) == (cached and not still), (width, m, n)
            if cached and not still:
                steps[width] = (m, n)
    assert steps == {4096: (8, 12), 5120: (8, 12), 8192: (4, 6)}


def _without(tmp_path: Path, shape: str, cache_known: bool) -> tuple[Path, dict[str, str]]:
    (held,) = write_without(FIXTURE / CSV, tmp_path, lambda _, cells: cells["Input Shapes"] == shape)
    peaks = (FIXTURE / PEAKS_FILE).read_text()
    if not cache_known:  # as a peaks file written before perfdb peaks recorded the cache
        peaks = "\n".join(line for line in peaks.splitlines() if not line.startswith("last_level_cache_bytes"))
    (tmp_path / PEAKS_FILE).write_text(peaks)
    return tmp_path, held


def test_a_row_past_the_step_is_answered_from_rows_read_from_memory(tmp_path: Path) -> None:
    """12 rows of 5120 (8.59 us, inputs read from memory) held out: its neighbours along the rows
    are 8 (cached, 4.83 us) and 16; from the rows in its state it is answered across the widths
    at 12 rows, within 5 %.  Without the cache's size, the line from 8 to 16 rows: 21 % short."""
    db, held = _without(tmp_path, "12,5120;5120", cache_known=True)
    measured = float(held["Average Duration(us)"])
    answer = lookup(db, make_query({"Kernel Type": "RmsNorm", **held}))
    assert answer.provenance == INTERPOLATED and "width between 4096 and 8192" in answer.column
    assert answer.duration_us == pytest.approx(measured, rel=0.05)
    before = lookup(_without(tmp_path / "old", "12,5120;5120", cache_known=False)[0],
                    make_query({"Kernel Type": "RmsNorm", **held}))
    assert before.provenance == INTERPOLATED and "rows between 8 and 16" in before.column
    assert before.duration_us is not None and before.duration_us / measured < 0.85


def test_the_last_cached_row_is_not_interpolated_across_the_step(tmp_path: Path) -> None:
    """8 rows of 4096 (4.15 us, cached): between 6 (cached) and 12 (from memory) the line says
    5.2 us; in its own state it lies past its width's last cached row, and the answer says so."""
    db, held = _without(tmp_path, "8,4096;4096", cache_known=True)
    answer = lookup(db, make_query({"Kernel Type": "RmsNorm", **held}))
    assert answer.provenance == FALLBACK and "nearest measured row (rows 8, width 5120)" in answer.column
    assert answer.duration_us == pytest.approx(float(held["Average Duration(us)"]), rel=0.08)


def test_rows_replayed_in_another_mode_stay_one_curve() -> None:
    """A profiled row (its inputs placed as its profile says) is no rotation's: no split."""
    rows = read_rows(FIXTURE / CSV)
    profiled = [type(row)(row.line, row.input_shapes, row.input_dtypes, row.input_formats, row.output_shapes,
                          row.duration_us, row.column, {**row.cells, "Profiling Average Duration(us)": "5.0"})
                for row in rows[:10]]
    assert not any(cache_state.rotated(row) for row in profiled)
    def size(row: MeasuredRow) -> float:
        return float(tensor_bytes(row.input_shapes, row.input_dtypes) or 0)

    assert cache_state.same_state(profiled, 10**6, H100_L2, size) == profiled
    assert cache_state.same_state(rows[:10], 10**6, None, size) == rows[:10]  # cache size unknown
    assert len(cache_state.same_state(rows[:10], 10**6, H100_L2, size)) < 10
