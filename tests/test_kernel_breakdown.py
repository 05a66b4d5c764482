"""Which device kernels a row's call launched, in the profile and in the replay.

The ingest side reads the real H100 trace in ``tests/fixtures/cuda/rope_cat_trace.json`` (see its
SOURCES.md): its linear layer ran one cuBLAS kernel, its cats two different batched-copy kernels.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from perf_plugin.database.kernel_breakdown import (
    BREAKDOWN_LIMIT,
    format_breakdown,
    kernel_difference,
    parse_breakdown,
)
from perf_plugin.database.signature import signature_text
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.replay.registry import signature_of
from perf_plugin.results import CaseRef, CaseResult, KernelTime
from perf_plugin.run.writeback import WritebackRequest, write_back

TRACE = Path(__file__).parent / "fixtures" / "cuda" / "rope_cat_trace.json"
LEVEL2 = Path(__file__).parent / "fixtures" / "ascend" / "kernel_details_level2_llm_train.csv"
LINEAR_KERNEL = "nvjet_sm90_tst_64x8_64x16_1x2_h_bz_TNT"


def test_a_breakdown_lists_kernels_by_time_and_reads_back() -> None:
    cell = format_breakdown({"small": 1.0, "large": 20.25, "middle": 3.5})
    assert cell == "large=20.25;middle=3.5;small=1"
    assert parse_breakdown(cell) == {"large": 20.25, "middle": 3.5, "small": 1.0}


def test_a_breakdown_keeps_the_longest_kernels_and_names_without_its_separators() -> None:
    cell = format_breakdown({f"k{i}": float(i) for i in range(12)})
    assert list(parse_breakdown(cell)) == [f"k{i}" for i in range(11, 11 - BREAKDOWN_LIMIT, -1)]
    assert parse_breakdown(format_breakdown({"f<a;b>(x=1)": 2.0})) == {"f<a,b>(x:1)": 2.0}


def test_kernels_of_a_negligible_share_are_not_a_difference() -> None:
    profiled = f"{LINEAR_KERNEL}=100;Memset (Device)=1"
    assert kernel_difference(profiled, f"{LINEAR_KERNEL}=98") is None
    assert kernel_difference(profiled, f"{LINEAR_KERNEL}=98;Memset (Device)=0.9") is None


def test_a_composition_standing_in_for_a_fused_kernel_is_a_difference() -> None:
    difference = kernel_difference("rms_norm_kernel=4", "pow_kernel=2;mean_kernel=1.5;mul_kernel=1")
    assert difference is not None
    assert difference.replay_only == ("pow_kernel", "mean_kernel", "mul_kernel")
    assert difference.profile_only == ("rms_norm_kernel",)


@pytest.mark.parametrize(("profiled", "replayed"), [("", "a=1"), ("a=1", ""), ("", "")])
def test_nothing_to_compare_is_no_difference(profiled: str, replayed: str) -> None:
    assert kernel_difference(profiled, replayed) is None


def test_a_cuda_trace_records_the_kernels_each_row_launched(tmp_path: Path) -> None:
    report = ingest_path(TRACE, tmp_path / "db")
    (linear,) = [r for r in report.rows if r.kernel_type == "MatMulV2"]
    assert parse_breakdown(linear.kernels) == {LINEAR_KERNEL: linear.average}
    cats = [parse_breakdown(r.kernels) for r in report.rows if r.kernel_type == "ConcatD"]
    assert [next(iter(c)).split("<")[0] for c in cats] == [
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy",
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy_vectorized",
    ]
    with (tmp_path / "db" / "MatMulV2.csv").open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        (row,) = list(reader)
    header = list(reader.fieldnames or ())
    assert header.index("Profiling Kernels") == header.index("Profiling Count") + 1
    assert row["Profiling Kernels"] == linear.kernels


def test_an_ascend_profile_has_no_kernel_breakdown(tmp_path: Path) -> None:
    report = ingest_path(LEVEL2, tmp_path / "db")
    assert not any(r.kernels for r in report.rows)
    assert "Profiling Kernels" not in (tmp_path / "db" / "MatMulV2.csv").read_text(encoding="utf-8").splitlines()[0]


def _measure_linear(db: Path, backend: str, kernel: str) -> list:
    with (db / "MatMulV2.csv").open(newline="", encoding="utf-8") as handle:
        (cells,) = list(csv.DictReader(handle))
    ref = CaseRef("MatMulV2-case", "MatMulV2", "MatMulV2.csv", 2, signature_text(signature_of("MatMulV2", cells)))
    result = CaseResult(ref, "passed", backend=backend, samples_us=(2.5, 2.7), kernels=(KernelTime(kernel, 2.6, 1.0),))
    _, gaps = write_back(WritebackRequest(db, "all", False, "20261125_100000"), [result], [])
    return gaps


def test_write_back_compares_the_replay_kernels_with_the_profile(tmp_path: Path) -> None:
    ingest_path(TRACE, tmp_path / "db")
    (same,) = _measure_linear(tmp_path / "db", "cuda", LINEAR_KERNEL)
    assert same.replayed_kernels == f"{LINEAR_KERNEL}=2.6" and same.kernel_difference is None
    (other,) = _measure_linear(tmp_path / "db", "cuda", "nvjet_sm90_tst_64x8_64x16_1x2_h_bz_NNT")
    assert other.kernel_difference is not None
    assert other.kernel_difference.profile_only == (LINEAR_KERNEL,)


def test_a_replay_on_another_kind_of_device_is_not_compared(tmp_path: Path) -> None:
    ingest_path(TRACE, tmp_path / "db")
    (gap,) = _measure_linear(tmp_path / "db", "cpu", "aten::mm")
    assert (gap.profiled_kernels, gap.replayed_kernels, gap.kernel_difference) == ("", "", None)
