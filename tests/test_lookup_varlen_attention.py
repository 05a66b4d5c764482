"""Lookups of packed (TND) flash attention rows by batch, request length and length spread
(``perf_plugin.lookup.varlen_attention``), on real rows.

The rows are 15 of the 520 ``FlashAttentionScore`` rows ``bash reproduce/lookup_accuracy_cuda.sh
dense-varlen`` measured on an NVIDIA H200 (torch 2.11, CUDA 13): Llama-3.1-8B's attention at TP 1
(32 query heads, 8 KV heads of 128, causal), 4 packed requests, each total once per length
distribution of the grid (even, ``spread 4``, ``max_mean 4``), the lengths in ``Input Values``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from perf_plugin.database.table import CsvTable
from perf_plugin.lookup import lookup
from perf_plugin.lookup.command import make_query
from perf_plugin.lookup.peaks import PEAKS_FILE, DevicePeaks, write_peaks

H200 = DevicePeaks("NVIDIA_H200", "cuda", {"BF16": 807.4, "FLOAT16": 775.5, "FLOAT": 50.52}, 4195.0)  # perfdb peaks there
IN_TYPES = "DT_BF16;DT_BF16;DT_BF16;DT_BF16;UINT8;DT_BF16;BOOL;INT64;INT64;INT64;INT64;INT64;FLOAT;FLOAT;FLOAT"
# tokens -> (even, spread 4, max_mean 4) microseconds; the lengths as the grid wrote them
MEASURED = {
    2048: (61.05, 84.462, 167.887), 3072: (115.349, 144.051, 312.907), 4096: (172.168, 208.466, 501.677),
    6144: (310.257, 388.357, 1019.252), 8192: (491.915, 609.886, 1702.311),
}
LENGTHS = {  # cumulative ends of the 4 requests
    "spread 4": {2048: "819,1433,1843,2048", 3072: "1229,2151,2765,3072", 4096: "1638,2867,3686,4096",
                 6144: "2458,4301,5530,6144", 8192: "3277,5735,7373,8192"},
    "max_mean 4": {t: f"{t - 3},{t - 2},{t - 1},{t}" for t in MEASURED},
}


def _cells(tokens: int, label: str) -> dict[str, str]:
    cells = {"Input Shapes": f'"{tokens},32,128;{tokens},8,128;{tokens},8,128;;;;2048,2048;;4;4;;;;;"',
             "Input Data Types": IN_TYPES, "Input Formats": ";".join(["ND"] * 15),
             "Output Shapes": f'"{tokens},32,8;{tokens},32,8;;{tokens},32,128"', "Output Data Types": "FLOAT;FLOAT;DT_BF16;DT_BF16"}
    if label != "even":
        cells["Input Values"] = f'";;;;;;;;{LENGTHS[label][tokens]};{LENGTHS[label][tokens]}"'
    return cells


def _database(tmp_path: Path, held_out: tuple[int, str] | None = None) -> Path:
    db = tmp_path / "NVIDIA_H200" / "stack"
    db.mkdir(parents=True)
    write_peaks(tmp_path / "NVIDIA_H200" / PEAKS_FILE, H200)
    table = CsvTable.new(["Input Shapes", "Input Data Types", "Input Formats", "Output Shapes", "Output Data Types",
                          "Input Values", "Average Duration(us)", "MicroBench Backend"])
    for tokens, times in MEASURED.items():
        for label, us in zip(("even", "spread 4", "max_mean 4"), times):
            if (tokens, label) != held_out:
                table.append_row({**_cells(tokens, label), "Average Duration(us)": str(us), "MicroBench Backend": "cuda"})
    table.write(db / "FlashAttentionScore.csv")
    return db


def _query(tokens: int, label: str) -> dict[str, str]:
    return {"Kernel Type": "FlashAttentionScore", **{k: v.strip('"') for k, v in _cells(tokens, label).items()}}


def test_a_query_without_lengths_is_answered_by_the_even_row_only(tmp_path: Path) -> None:
    db = _database(tmp_path)
    answer = lookup(db, make_query(_query(4096, "even")))
    assert answer.provenance == "exact" and answer.duration_us == pytest.approx(172.168)
    spread = lookup(db, make_query(_query(4096, "spread 4")))
    assert spread.provenance == "exact" and spread.duration_us == pytest.approx(208.466)


@pytest.mark.parametrize(("tokens", "label", "within"), [(4096, "spread 4", 0.03), (4096, "max_mean 4", 0.08),
                                                         (4096, "even", 0.08), (3072, "spread 4", 0.06)])
def test_a_held_out_row_is_interpolated_from_the_rows_of_other_totals_and_spreads(
        tmp_path: Path, tokens: int, label: str, within: float) -> None:
    db = _database(tmp_path, held_out=(tokens, label))
    answer = lookup(db, make_query(_query(tokens, label)))
    measured = MEASURED[tokens][("even", "spread 4", "max_mean 4").index(label)]
    assert answer.provenance == "interpolated", answer.reason
    assert answer.duration_us == pytest.approx(measured, rel=within)


def test_the_answer_follows_the_querys_lengths(tmp_path: Path) -> None:
    """One request of 4093 tokens and three of 1 cost 2.9x four of 1024: the answer sees it."""
    db = _database(tmp_path, held_out=(4096, "max_mean 4"))
    skewed = lookup(db, make_query(_query(4096, "max_mean 4")))
    assert skewed.duration_us is not None and skewed.duration_us > 2 * MEASURED[4096][0]


def test_other_layouts_are_not_interpolated(tmp_path: Path) -> None:
    db = _database(tmp_path)
    sbh = make_query({"Kernel Type": "FlashAttentionScore", "Input Shapes": "4096,1,2048;4096,1,1024;4096,1,1024;;;;2048,2048",
                      "Input Data Types": IN_TYPES})
    answer = lookup(db, sbh)
    assert answer.provenance != "interpolated" and answer.provenance != "exact"
