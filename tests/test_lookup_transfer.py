"""The deviation a family's other series show at the query's value of an axis (``lookup/transfer.py``):
a GEMM library's kernel choice at one token count, carried from weights of a similar size."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from perf_plugin.lookup import hull, lookup, transfer
from perf_plugin.lookup.answer import INTERPOLATED
from tests.test_lookup_families import _database, _gemm, _gemm_csv, _roofline_us

QUERY_WEIGHT = (4096, 4096)
ALIKE = [(8192, 4096), (2048, 4096), (4096, 8192)]  # N * K within 2x of the query's
FAR = (512, 512)  # 64x smaller: another family of kernels


def _rows(alike: list[tuple[int, int]]) -> list[tuple[int, int, int, float]]:
    """Every weight at 2x its roofline at M 128 and 192; at M 160 the alike weights take 3x (the
    library's poor choice there), the far one 1x; the query's weight was not measured at 160."""
    rows = []
    for n, k in [QUERY_WEIGHT, *alike, FAR]:
        for m in (128, 160, 192):
            if (n, k) == QUERY_WEIGHT and m == 160:
                continue
            factor = 2.0 if m != 160 else (1.0 if (n, k) == FAR else 3.0)
            rows.append((m, n, k, factor * _roofline_us(m, n, k)))
    return rows


def test_the_choice_at_a_token_count_is_carried_from_alike_weights(tmp_path: Path) -> None:
    db = _database(tmp_path)
    _gemm_csv(db, _rows(ALIKE))
    answer = lookup(db, _gemm(160, *QUERY_WEIGHT))
    assert answer.provenance == INTERPOLATED
    assert answer.duration_us == pytest.approx(3.0 * _roofline_us(160, *QUERY_WEIGHT), rel=1e-9)
    assert "median deviation at M 160" in answer.column and "of 3 other series" in answer.column
    assert len(answer.rows) == 2 + 3 * 3  # the two neighbours, then each alike weight's three rows


def test_one_alike_weight_is_enough_to_carry_its_choice(tmp_path: Path) -> None:
    db = _database(tmp_path)
    _gemm_csv(db, _rows(ALIKE[:1]))  # one alike weight (and the far one) measured M 160
    answer = lookup(db, _gemm(160, *QUERY_WEIGHT))
    assert answer.provenance == INTERPOLATED and "of 1 other series" in answer.column
    assert answer.duration_us == pytest.approx(3.0 * _roofline_us(160, *QUERY_WEIGHT), rel=1e-9)


def test_without_an_alike_weight_the_interpolation_is_left_alone(tmp_path: Path) -> None:
    db = _database(tmp_path)
    _gemm_csv(db, _rows([]))  # only the far weight measured M 160
    answer = lookup(db, _gemm(160, *QUERY_WEIGHT))
    assert answer.provenance == INTERPOLATED and "deviation" not in answer.column
    # 2x the roofline at both neighbours: 2x at the query, in the log of the efficiency
    assert answer.duration_us == pytest.approx(2.0 * _roofline_us(160, *QUERY_WEIGHT), rel=1e-9)


def test_any_axis_of_a_family_carries_its_series_deviation() -> None:
    """Attention-like points (KV length, batch): the other batches' deviation at KV 192."""
    points = [hull.Point((kv, b), 0.0 if kv != 192 else -0.5, (i,))
              for i, (kv, b) in enumerate((kv, b) for b in (1, 2, 4, 8) for kv in (128, 192, 256))
              if (kv, b) != (192, 2)]
    names = ("KV length", "batch")
    found = hull.estimate(points, (192.0, 2.0), names, (math.log, math.log))
    assert isinstance(found, hull.Estimate) and found.axes == ("KV length",) and found.bracket == (128, 256)
    assert found.value == 0.0
    carried = transfer.carry_deviation(points, (192.0, 2.0), found, names, transfer.every_series)
    assert carried.value == pytest.approx(-0.5) and "of 3 other series" in carried.method
    alike_only = transfer.carry_deviation(points, (192.0, 2.0), found, names, transfer.within(2.0))
    assert alike_only.value == pytest.approx(-0.5) and "of 2 other series" in alike_only.method  # batches 1 and 4
    far_only = transfer.carry_deviation(points, (192.0, 2.0), found, names, lambda mine, other: other[0] > 4)
    assert far_only.value == pytest.approx(-0.5) and "of 1 other series" in far_only.method  # batch 8
    none_alike = transfer.carry_deviation(points, (192.0, 2.0), found, names, lambda mine, other: False)
    assert none_alike.value == found.value


def test_an_estimate_at_a_measured_position_or_over_two_axes_is_unchanged() -> None:
    over_two = hull.Estimate(0.25, (1, 2, 3), ("M", "N"), "barycentric")
    assert transfer.carry_deviation([], (1.0, 2.0, 3.0), over_two, ("M", "N", "K"), transfer.every_series) is over_two


def _edge_rows(same_k: list[tuple[int, int]]) -> list[tuple[int, int, int, float]]:
    """Every weight at 2x its roofline from M 2 up; at M 1 the weights of the query's K take 2.6x
    (another kernel for one row: 1.3x the time of two), those of another K 2x.  The query's weight
    was measured from M 2 up only."""
    rows = []
    for n, k in [QUERY_WEIGHT, *same_k, (4096, 2048), (8192, 2048), (2048, 8192)]:
        for m in (1, 2, 4):
            if (n, k) == QUERY_WEIGHT and m == 1:
                continue
            factor = 2.6 if m == 1 and k == QUERY_WEIGHT[1] else 2.0
            rows.append((m, n, k, factor * _roofline_us(m, n, k)))
    return rows


def test_a_token_count_below_its_weights_rows_steps_from_them_as_weights_of_its_k_step(tmp_path: Path) -> None:
    db = _database(tmp_path)
    _gemm_csv(db, _edge_rows([(8192, 4096), (2048, 4096), (1024, 4096)]))
    answer = lookup(db, _gemm(1, *QUERY_WEIGHT))
    assert answer.provenance == INTERPOLATED
    # its own M 2 row (2x), stepped by the same-K weights' step from M 2 to M 1 (2.6x over 2x)
    assert answer.duration_us == pytest.approx(2.6 * _roofline_us(1, *QUERY_WEIGHT), rel=1e-9)
    assert "nearest row of its series (M 2)" in answer.column and "of 3 other series" in answer.column
    assert len(answer.rows) == 1 + 3 * 2


def test_one_weight_of_its_k_is_enough_to_step_from(tmp_path: Path) -> None:
    db = _database(tmp_path)
    _gemm_csv(db, _edge_rows([(8192, 4096)]))
    answer = lookup(db, _gemm(1, *QUERY_WEIGHT))
    assert answer.provenance == INTERPOLATED and "of 1 other series" in answer.column
    assert answer.duration_us == pytest.approx(2.6 * _roofline_us(1, *QUERY_WEIGHT), rel=1e-9)


def test_without_a_weight_of_its_k_the_edge_is_answered_across_weights(tmp_path: Path) -> None:
    db = _database(tmp_path)
    _gemm_csv(db, _edge_rows([]))
    answer = lookup(db, _gemm(1, *QUERY_WEIGHT))
    assert answer.provenance == INTERPOLATED and "nearest row of its series" not in answer.column
    assert "barycentric" in answer.column or "linear in N" in answer.column or "linear in K" in answer.column
