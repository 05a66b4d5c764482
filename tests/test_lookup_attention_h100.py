"""Attention lookups on rows the CUDA replay measured on an H100: Llama-3.1-8B's causal prefills
(``FusedInferAttentionScore``, even lengths, four head splits, batches 1 to 4, 13 sequence lengths
from 128 to 8192) with the device's peaks (source: ``tests/fixtures/cuda/SOURCES.md``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from perf_plugin.lookup import lookup, transfer
from perf_plugin.lookup.answer import INTERPOLATED
from perf_plugin.lookup.command import make_query
from perf_plugin.lookup.peaks import PEAKS_FILE
from tests.held_out import write_without

FIXTURE = Path(__file__).parent / "fixtures" / "cuda" / "h100_fia_prefill"
CSV = "FusedInferAttentionScore.csv"
# 32 query heads, batch 1: lines 3 to 7 are sequence lengths 192, 256, 384, 512 and 768; the
# kernel's time steps between 512 (12.7 us) and 768 (22.4 us)
QUERY_LINE = 4  # 256 tokens, 8.558 us
# the 256-token rows of batches 3 and 4: only batch 2's series keeps 192, 256 and 768
OTHER_SERIES_AT_256 = (30, 43)


def _without(tmp_path: Path, lines: set[int]) -> tuple[Path, dict[str, str]]:
    """The fixture without ``lines``; the query's row among them."""
    held = write_without(FIXTURE / CSV, tmp_path, lambda line, _: line in lines)
    shutil.copy(FIXTURE / PEAKS_FILE, tmp_path / PEAKS_FILE)
    return tmp_path, held[sorted(lines).index(QUERY_LINE)]


def test_a_gap_across_the_kernels_step_takes_the_one_other_series_that_shows_it(tmp_path: Path) -> None:
    """256 tokens held out with 384 and 512 (a random split's hole): the neighbours are 192 and 768,
    across the step.  Batch 2 alone measured all three lengths; its deviation at 256 is the plan's,
    and carried it answers within 6 %; the straight line between the neighbours is 17 % long."""
    db, row = _without(tmp_path, {QUERY_LINE, 5, 6, *OTHER_SERIES_AT_256})
    measured = float(row["Average Duration(us)"])
    answer = lookup(db, make_query({"Kernel Type": "FusedInferAttentionScore", **row}))
    assert answer.provenance == INTERPOLATED
    assert "between 192 and 768" in answer.column and "of 1 other series" in answer.column
    assert answer.duration_us == pytest.approx(measured, rel=0.06)


def test_without_the_one_series_rule_the_gap_is_answered_on_the_straight_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: requiring three series, as the lookup did, leaves the line."""
    monkeypatch.setattr(transfer, "MIN_SERIES", 3)
    db, row = _without(tmp_path, {QUERY_LINE, 5, 6, *OTHER_SERIES_AT_256})
    answer = lookup(db, make_query({"Kernel Type": "FusedInferAttentionScore", **row}))
    assert answer.provenance == INTERPOLATED and "deviation" not in answer.column
    assert answer.duration_us is not None
    assert answer.duration_us / float(row["Average Duration(us)"]) > 1.15
