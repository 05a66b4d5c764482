"""Run reports of ``pytest bench``: markdown, duration-gap CSV, JSON run report, coverage table,
environment spec and the optional plot.

The run summary is built by hand from real rows of the Ascend Level2 profile in the fixtures
(MatMulV3, RmsNorm, FlashAttentionScore with their real shapes, dtypes and profiled durations),
with one outcome of every kind: passed, failed, skipped, no replay, quarantined.  Expected
values are written out or computed here with the csv / json / statistics modules, never by the
code under test.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import statistics
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from perf_plugin.database.signature import signature_text
from perf_plugin.replay.registry import signature_of
from perf_plugin.report import environment
from perf_plugin.report.environment import (
    collect_env_spec,
    cpu_model,
    cudnn_text,
    nvidia_driver,
)
from perf_plugin.report.gap import GAP_COLUMNS, write_gap_csv
from perf_plugin.report.markdown import render_replay_report
from perf_plugin.report.plot import plot_gap
from perf_plugin.report.run_json import build_run_report, write_run_report
from perf_plugin.report.tally import tally_cases
from perf_plugin.report.writer import (
    coverage_table,
    format_coverage_table,
    report_timestamp,
    write_reports,
)
from perf_plugin.results import (
    CaseRef,
    CaseResult,
    FileWriteback,
    GapRow,
    KernelTime,
    QuarantinedRow,
    RunSummary,
    SampleStats,
)
from perf_plugin.run.cases import make_case_id

LEVEL2 = Path(__file__).parent / "fixtures" / "ascend" / "kernel_details_level2_llm_train.csv"
DATABASE_DIR = "database/data/ATLAS_800_A3_752T_128G_DIE/vllm_ascend/vllm0.18.0_torch2.9.0_cann8.5"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1_execute_segment_k_off_kernel"
SPLITK = "splitKreduce_kernel"


def _fixture_rows() -> dict[int, dict[str, str]]:
    with LEVEL2.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    header = rows[0]
    return {number: dict(zip(header, cells)) for number, cells in enumerate(rows[1:], start=2)}


ROWS = _fixture_rows()


class Row:
    """One database row taken from a line of the real profile."""

    def __init__(self, fixture_line: int, db_line: int) -> None:
        self.cells = ROWS[fixture_line]
        self.kernel_type = self.cells["Type"]
        self.csv_file = f"{self.kernel_type}.csv"
        self.line = db_line
        self.signature = signature_text(signature_of(self.kernel_type, self.cells))
        self.case_id = make_case_id(self.kernel_type, self.cells)
        self.profiled_us = float(self.cells["Duration(us)"])

    def ref(self, kernel_type: str | None = None) -> CaseRef:
        kernel_type = self.kernel_type if kernel_type is None else kernel_type
        return CaseRef(self.case_id, kernel_type, self.csv_file, self.line, self.signature)

    def result(self, outcome: str, samples: tuple[float, ...] = (), reason: str = "", kernels=()) -> CaseResult:
        return CaseResult(
            self.ref(),
            outcome=outcome,
            reason=reason,
            backend="cuda",
            samples_us=samples,
            kernels=tuple(kernels),
        )

    def gap(self, microbench_us: float | None, profiling_us: float | None = None) -> GapRow:
        profiling = self.profiled_us if profiling_us is None else profiling_us
        return GapRow(self.csv_file, self.line, self.signature, microbench_us, profiling)


# MatMulV3.csv: real rows (fixture lines 10, 33, 36, 38, 887, 891) at database lines 2..7.
MM_A, MM_B, MM_C, MM_D, MM_FAIL, MM_BAD = (
    Row(f, d) for f, d in ((10, 2), (33, 3), (36, 4), (38, 5), (887, 6), (891, 7))
)
# RmsNorm.csv: fixture lines 9, 12, 14 at database lines 2..4; FlashAttentionScore.csv: line 32.
RMS_A, RMS_BAD, RMS_BIG = (Row(f, d) for f, d in ((9, 2), (12, 3), (14, 4)))
FAS = Row(32, 2)

MM_FAIL_REASON = "relative error 0.031 exceeds the BF16 tolerance 0.01 (max abs diff 12.5)"
MM_BAD_REASON = "Input Shapes: slot 1 '6144,1024' does not match Output Shapes '4096,1024' | K differs"
RMS_BAD_REASON = "RmsNorm replay: gamma shape (128,) needs x's last dimension"
RMS_BIG_REASON = "shape needs 34.4 GiB, over the 16 GiB memory budget"
FAS_REASON = "no replay registered for kernel type FlashAttentionScore"
UNMATCHED = "RmsNorm-4096x1x8x128,128-BF16#2"


def make_summary() -> RunSummary:
    results = [
        MM_A.result("passed", (161.0, 162.65), kernels=(KernelTime(GEMM, 150.0, 1.0), KernelTime(SPLITK, 11.825, 1.0))),
        MM_B.result("passed", (78.5, 78.716), kernels=(KernelTime(GEMM, 78.608, 1.0),)),
        MM_C.result("passed", (287.208, 287.208)),
        MM_D.result("passed", (102.6158, 102.8158)),
        MM_FAIL.result("failed", reason=MM_FAIL_REASON),
        # Also in the quarantine list below: must be counted once.
        MM_BAD.result("quarantined", reason=MM_BAD_REASON),
        RMS_A.result("passed", (66.0, 66.24)),
        RMS_BIG.result("skipped", reason=RMS_BIG_REASON),
        FAS.result("no-replay", reason=FAS_REASON),
    ]
    quarantined = [
        QuarantinedRow(MM_BAD.ref(), MM_BAD_REASON),
        QuarantinedRow(RMS_BAD.ref(kernel_type=""), RMS_BAD_REASON),  # the kernel type is then the file's
    ]
    files = [
        FileWriteback("FlashAttentionScore.csv", rows_pruned=1, written=True),
        FileWriteback("MatMulV3.csv", rows_updated=4, rows_quarantined=1, written=True),
        FileWriteback("RmsNorm.csv", rows_updated=1, rows_appended=1, rows_quarantined=1,
                      unmatched_samples=[UNMATCHED], written=True),
    ]
    gaps = [
        MM_A.gap(161.825),  # 161.825 / 170.4 = 0.9497: inside
        MM_B.gap(78.608),  # / 98.26 = 0.8 exactly: the lower bound is inside
        MM_C.gap(287.208),  # / 239.34 = 1.2000000000000002 in floating point, reads 1.2: inside
        MM_D.gap(102.7158),  # / 130.02 = 0.79: flagged
        RMS_A.gap(66.12),  # / 33.06 = 2.0: flagged
        GapRow("RmsNorm.csv", 5, "4096,1,8,128;128 | BF16;BF16 | ND;ND | 4096,1,8,128 | BF16", 43.1, None),
    ]
    return RunSummary(
        started_at="2026-03-02T10:15:00+00:00",
        elapsed_s=84.25,
        backend="cuda",
        device_name="NVIDIA_H100_80GB_HBM3",
        database_dir=DATABASE_DIR,
        update_mode="all",
        repeat_count=20,
        warmup_count=5,
        command=["pytest", "bench", "-k", "MatMulV3 or RmsNorm or FlashAttentionScore", "-n", "2"],
        results=results,
        files=files,
        quarantined=quarantined,
        gaps=gaps,
        device_ids=[0, 1],
        max_concurrency=2,
        env={"backend": "cuda", "torch": {"version": "2.11.0+cu130"}},
        coverage_min=0.9,
        coverage=0.5,
    )


# ----------------------------------------------------------------------------- markdown
def _section(text: str, title: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(f"## {title}") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return [line for line in lines[start:end] if line.strip()]


def _cells(line: str) -> list[str]:
    inner = line.strip()[1:-1]
    return [c.strip().replace("\\|", "|").replace("\\\\", "\\") for c in re.split(r"(?<!\\)\|", inner)]


def _table(lines: list[str], first: int = 0) -> list[dict[str, str]]:
    """The first pipe table at or after ``lines[first]`` as dicts keyed by its header."""
    start = next(i for i in range(first, len(lines)) if lines[i].startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    rows = lines[start:end]
    header = _cells(rows[0])
    assert set(_cells(rows[1])) <= {"---", "---:"}
    table = []
    for line in rows[2:]:
        cells = _cells(line)
        assert len(cells) == len(header), line
        table.append(dict(zip(header, cells)))
    return table


def test_markdown_run_facts_and_case_counts() -> None:
    text = render_replay_report(make_summary())
    facts = {row["run"]: row["value"] for row in _table(text.splitlines())}
    assert facts["backend"] == "cuda"
    assert facts["device"] == "NVIDIA_H100_80GB_HBM3"
    assert facts["database"] == f"`{DATABASE_DIR}`"
    assert facts["update mode"] == "all"
    assert facts["repeats / warm-up"] == "20 / 5"
    assert facts["elapsed"] == "84.2 s"  # 84.25 rounds half to even
    assert facts["workers / device ids"] == "2 / 0, 1"
    assert facts["replay coverage"] == "50.0% (minimum 90.0%)"
    assert facts["command"] == "`pytest bench -k 'MatMulV3 or RmsNorm or FlashAttentionScore' -n 2`"
    # 10 rows: MatMulV3 6 (4 passed, 1 failed, 1 quarantined), RmsNorm 3, FlashAttentionScore 1.
    assert _table(_section(text, "Cases")) == [
        {"cases": "10", "passed": "5", "failed": "1", "skipped": "1", "no replay": "1", "cannot build": "0",
         "quarantined": "2"}
    ]


def test_a_row_the_replay_cannot_build_counts_as_having_no_replay_not_as_quarantined() -> None:
    tally = tally_cases([RMS_BAD.result("unsupported", reason=RMS_BAD_REASON), RMS_A.result("passed", (66.0,))])
    rms = tally.kernels["RmsNorm"]
    assert (rms.rows, rms.unsupported, rms.quarantined, rms.with_replay, rms.passed) == (2, 1, 0, 1, 1)


def test_markdown_kernel_type_table() -> None:
    text = render_replay_report(make_summary())
    rows = {row["kernel type"]: row for row in _table(_section(text, "Kernel types"))}
    assert list(rows) == ["FlashAttentionScore", "MatMulV3", "RmsNorm"]
    median_mm = statistics.median([161.825, 78.608, 287.208, 102.7158])  # 132.2704
    assert rows["MatMulV3"] == {
        "kernel type": "MatMulV3", "rows": "6", "replayed": "5", "passed": "4", "failed": "1", "skipped": "0",
        "no replay": "0", "cannot build": "0", "quarantined": "1",
        "median Average Duration(us)": f"{median_mm:.2f}",
    }
    assert rows["RmsNorm"] == {
        "kernel type": "RmsNorm", "rows": "3", "replayed": "1", "passed": "1", "failed": "0", "skipped": "1",
        "no replay": "0", "cannot build": "0", "quarantined": "1",
        "median Average Duration(us)": "66.12",
    }
    assert rows["FlashAttentionScore"] == {
        "kernel type": "FlashAttentionScore", "rows": "1", "replayed": "0", "passed": "0", "failed": "0",
        "skipped": "0", "no replay": "1", "cannot build": "0", "quarantined": "0",
        "median Average Duration(us)": "",
    }


def test_markdown_writeback_quarantine_and_failures() -> None:
    text = render_replay_report(make_summary())
    section = _section(text, "Write-back")
    assert _table(section) == [
        {"file": "FlashAttentionScore.csv", "updated": "0", "appended": "0", "pruned": "1", "quarantined": "0",
         "unmatched": "0", "written": "yes"},
        {"file": "MatMulV3.csv", "updated": "4", "appended": "0", "pruned": "0", "quarantined": "1",
         "unmatched": "0", "written": "yes"},
        {"file": "RmsNorm.csv", "updated": "1", "appended": "1", "pruned": "0", "quarantined": "1",
         "unmatched": "1", "written": "yes"},
    ]
    unmatched_at = section.index("Measurements that matched no row:")
    assert _table(section, unmatched_at) == [{"file": "RmsNorm.csv", "case": UNMATCHED}]

    # The reason holds a '|': escaped in the cell, read back whole.
    assert _table(_section(text, "Quarantined rows")) == [
        {"file": "MatMulV3.csv", "line": "7", "kernel type": "MatMulV3", "reason": MM_BAD_REASON},
        {"file": "RmsNorm.csv", "line": "3", "kernel type": "RmsNorm", "reason": RMS_BAD_REASON},
    ]
    assert _table(_section(text, "Failed cases")) == [
        {"case": MM_FAIL.case_id, "file": "MatMulV3.csv", "line": "6", "reason": MM_FAIL_REASON}
    ]


def test_markdown_gap_outliers_and_kernel_breakdown() -> None:
    text = render_replay_report(make_summary())
    section = _section(text, "Duration gap outliers")
    assert section[0] == "2 of 5 rows with both durations have a ratio (microbench / profiling) outside [0.8, 1.2]."
    # Furthest from agreement first: |log 2.0| > |log 0.79|; 0.8 and 1.2 are not outliers.
    assert _table(section) == [
        {"file": "RmsNorm.csv", "line": "2", "signature": RMS_A.signature, "microbench (us)": "66.12",
         "profiling (us)": "33.06", "ratio": "2"},
        {"file": "MatMulV3.csv", "line": "5", "signature": MM_D.signature, "microbench (us)": "102.716",
         "profiling (us)": "130.02", "ratio": "0.79"},
    ]
    assert _table(_section(text, "Cases with several kernels")) == [
        {"case": MM_A.case_id, "kernel": GEMM, "mean per repeat (us)": "150", "calls per repeat": "1",
         "share": f"{100 * 150.0 / 161.825:.1f}%"},
        {"case": MM_A.case_id, "kernel": SPLITK, "mean per repeat (us)": "11.825", "calls per repeat": "1",
         "share": f"{100 * 11.825 / 161.825:.1f}%"},
    ]


def test_markdown_of_an_empty_run_says_so_per_section() -> None:
    summary = RunSummary("2026-03-02T10:15:00+00:00", 0.5, "cpu", "CPU_X86_64", "db", "missing-only", 20, 5, [])
    text = render_replay_report(summary)
    assert _section(text, "Kernel types") == ["No cases."]
    assert _section(text, "Write-back") == ["Write-back did not run or changed no file."]
    assert _section(text, "Quarantined rows") == ["No row was quarantined."]
    assert _section(text, "Failed cases") == ["No case failed."]
    assert _section(text, "Duration gap outliers") == [
        "0 of 0 rows with both durations have a ratio (microbench / profiling) outside [0.8, 1.2]."
    ]
    assert _section(text, "Replays that launched other kernels than the profile") == [
        "No row has the kernels of its profile to compare with (a PyTorch trace with device activity records them)."
    ]
    assert _section(text, "Cases with several kernels") == ["No case launched more than one kernel."]


# ----------------------------------------------------------------------------- gap CSV
def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames or ()) == GAP_COLUMNS
        return list(reader)


def test_gap_csv_values_and_flags(tmp_path: Path) -> None:
    path = write_gap_csv(tmp_path / "reports" / "duration_gap_20260302_101500.csv", make_summary().gaps)
    rows = _read_csv(path)
    expected = [
        ("MatMulV3.csv", "2", MM_A.signature, "161.825", "170.4", "0.9497", "false", "", ""),
        ("MatMulV3.csv", "3", MM_B.signature, "78.608", "98.26", "0.8", "false", "", ""),
        ("MatMulV3.csv", "4", MM_C.signature, "287.208", "239.34", "1.2", "false", "", ""),
        ("MatMulV3.csv", "5", MM_D.signature, "102.716", "130.02", "0.79", "true", "", ""),
        ("RmsNorm.csv", "2", RMS_A.signature, "66.12", "33.06", "2", "true", "", ""),
        ("RmsNorm.csv", "5", "4096,1,8,128;128 | BF16;BF16 | ND;ND | 4096,1,8,128 | BF16", "43.1", "", "", "false", "", ""),
    ]
    assert [tuple(r[c] for c in GAP_COLUMNS) for r in rows] == expected
    # The profiled durations are the fixture's own cells.
    assert [r["profiling_us"] for r in rows[:5]] == [
        ROWS[10]["Duration(us)"].rstrip("0").rstrip("."), ROWS[33]["Duration(us)"].rstrip("0").rstrip("."),
        ROWS[36]["Duration(us)"].rstrip("0").rstrip("."), ROWS[38]["Duration(us)"].rstrip("0").rstrip("."),
        ROWS[9]["Duration(us)"].rstrip("0").rstrip("."),
    ]
    assert path.read_bytes().count(b"\r") == 0


@pytest.mark.parametrize(
    ("microbench", "profiling", "ratio", "flagged"),
    [
        (80.0, 100.0, "0.8", "false"),
        (120.0, 100.0, "1.2", "false"),
        (287.208, 239.34, "1.2", "false"),  # 1.2000000000000002 as a float quotient
        (79.0, 100.0, "0.79", "true"),
        (79.99, 100.0, "0.7999", "true"),
        (120.01, 100.0, "1.2001", "true"),
        (50.0, 100.0, "0.5", "true"),
    ],
)
def test_gap_band_is_closed(tmp_path: Path, microbench: float, profiling: float, ratio: str, flagged: str) -> None:
    path = write_gap_csv(tmp_path / "gap.csv", [GapRow("MatMulV3.csv", 2, MM_A.signature, microbench, profiling)])
    [row] = _read_csv(path)
    assert (row["ratio"], row["flagged"]) == (ratio, flagged)


GEMM_NT = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT"
GEMM_NN = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"


def _kernel_gaps() -> list[GapRow]:
    same = f"{GEMM_NT}=161.2;Memset (Device)=0.9"
    return [
        GapRow("MatMulV2.csv", 2, "a", 160.0, 161.0, same, f"{GEMM_NT}=160.0;Memset (Device)=1.1"),
        GapRow("MatMulV2.csv", 3, "b", 140.0, 161.0, same, f"{GEMM_NN}=140.0"),
        GapRow("RmsNorm.csv", 2, "c", 9.0, 4.0, "rms_norm_kernel=4.0", "pow_kernel=3;mean_kernel=3;mul_kernel=3"),
        GapRow("Add.csv", 2, "d", 3.0, 3.1),  # no profiled kernels: nothing to compare
    ]


def test_gap_csv_says_which_rows_launched_other_kernels(tmp_path: Path) -> None:
    rows = _read_csv(write_gap_csv(tmp_path / "gap.csv", _kernel_gaps()))
    assert [(r["kernels_differ"], r["kernel_difference"]) for r in rows] == [
        ("false", ""),  # the workspace memset's time differs, not the kernels
        ("true", f"replay launched {GEMM_NN}; the profile has {GEMM_NT}"),
        ("true", "replay launched pow_kernel, mean_kernel, mul_kernel; the profile has rms_norm_kernel"),
        ("", ""),
    ]


def test_reports_list_the_rows_that_launched_other_kernels() -> None:
    summary = RunSummary("2026-03-02T10:15:00+00:00", 0.5, "cuda", "H100", "db", "all", 30, 5, [], gaps=_kernel_gaps())
    section = _section(render_replay_report(summary), "Replays that launched other kernels than the profile")
    assert section[0].startswith("2 of 3 rows whose profile recorded its kernels launched other kernels")
    assert [row["line"] for row in _table(section, 1)] == ["3", "2"]
    differ = build_run_report(summary)["duration_gap"]["kernels_differ"]
    assert [(d["csv_file"], d["row_line"]) for d in differ] == [("MatMulV2.csv", 3), ("RmsNorm.csv", 2)]


def test_gap_csv_is_replaced_atomically(tmp_path: Path) -> None:
    path = tmp_path / "duration_gap_20260302_101500.csv"
    path.write_text("stale\n", encoding="utf-8")
    write_gap_csv(path, [])
    assert path.read_text(encoding="utf-8") == ",".join(GAP_COLUMNS) + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temporary file left


# ----------------------------------------------------------------------------- JSON run report
REQUIRED_FIELDS = {
    "benchmark": str, "script": str, "workflow": str, "pass_n": int, "ops_count": int, "elapsed_s": float,
    "device_ids": list, "max_concurrency": int, "llm_concurrency": int, "env_spec": dict, "task_log_dir": str,
    "stats": dict,
}


def test_run_report_required_fields_and_stats() -> None:
    report = build_run_report(make_summary())
    for name, kind in REQUIRED_FIELDS.items():
        assert type(report[name]) is kind, name
    assert report["benchmark"] == "perf_plugin.replay:vllm0.18.0_torch2.9.0_cann8.5"
    assert report["script"] == "pytest bench"
    assert report["workflow"] == "replay"
    assert report["pass_n"] == 1
    assert report["ops_count"] == 10
    assert report["elapsed_s"] == 84.25
    assert report["device_ids"] == [0, 1]
    assert report["max_concurrency"] == 2
    assert report["llm_concurrency"] == 0
    assert report["env_spec"] == {"backend": "cuda", "torch": {"version": "2.11.0+cu130"}}
    assert report["task_log_dir"] == f"{DATABASE_DIR}/reports"
    stats = report["stats"]
    assert set(stats) == {"total_ops", "passed_ops", "failed_ops", "pass_rate", "op_results"}
    assert (stats["total_ops"], stats["passed_ops"], stats["failed_ops"]) == (10, 5, 5)
    assert stats["pass_rate"] == round(5 / 10, 3) and type(stats["pass_rate"]) is float
    assert stats["op_results"] == {
        "FlashAttentionScore": {"passed": 0, "total": 1},
        "MatMulV3": {
            "passed": 4, "total": 6,
            "profile": {"median_average_us": statistics.median([161.825, 78.608, 287.208, 102.7158]),
                        "cases_with_duration": 4},
        },
        "RmsNorm": {"passed": 1, "total": 3, "profile": {"median_average_us": 66.12, "cases_with_duration": 1}},
    }
    assert report["outcome_counts"] == {
        "passed": 5, "failed": 1, "skipped": 1, "no_replay": 1, "unsupported": 0, "quarantined": 2
    }


def test_run_report_extra_sections() -> None:
    report = build_run_report(make_summary())
    results = {r["case_id"]: r for r in report["results"]}
    assert len(results) == 9
    first = results[MM_A.case_id]
    assert (first["kernel_type"], first["csv_file"], first["row_line"], first["outcome"]) == (
        "MatMulV3", "MatMulV3.csv", 2, "passed")
    samples = [161.0, 162.65]
    assert first["stats"] == {
        "mean_us": statistics.fmean(samples), "median_us": statistics.median(samples), "min_us": 161.0,
        "std_us": pytest.approx(statistics.pstdev(samples), rel=1e-12), "count": 2,
    }
    assert first["kernels"] == [
        {"name": GEMM, "mean_us": 150.0, "calls_per_repeat": 1.0},
        {"name": SPLITK, "mean_us": 11.825, "calls_per_repeat": 1.0},
    ]
    failed = results[MM_FAIL.case_id]
    assert (failed["outcome"], failed["reason"], failed["stats"]) == ("failed", MM_FAIL_REASON, None)
    assert [(q["csv_file"], q["row_line"], q["kernel_type"], q["reason"]) for q in report["quarantined"]] == [
        ("MatMulV3.csv", 7, "MatMulV3", MM_BAD_REASON), ("RmsNorm.csv", 3, "RmsNorm", RMS_BAD_REASON)]
    assert report["writeback"][2] == {
        "csv_file": "RmsNorm.csv", "rows_updated": 1, "rows_appended": 1, "rows_pruned": 0,
        "rows_quarantined": 1, "unmatched_samples": [UNMATCHED], "written": True,
    }
    assert report["duration_gap"] == {
        "band": [0.8, 1.2], "rows": 6, "compared": 5, "flagged": 2, "kernels_compared": 0, "kernels_differ": []
    }
    assert report["replay_run"]["update_mode"] == "all"
    assert report["replay_run"]["coverage"] == 0.5


def test_run_report_file_round_trips(tmp_path: Path) -> None:
    summary = make_summary()
    path = write_run_report(tmp_path / "reports" / "run_report_20260302_101500.json", summary)
    text = path.read_text(encoding="utf-8")
    expected = build_run_report(summary)
    expected["task_log_dir"] = str(tmp_path / "reports")  # the directory it was written to
    assert json.loads(text) == expected
    # Per-case entries are one line each; the rest is indented.
    case_lines = [line for line in text.splitlines() if line.startswith('    {"case_id": ')]
    assert [json.loads(line.rstrip(","))["case_id"] for line in case_lines] == [r.ref.case_id for r in summary.results]
    assert '\n  "stats": {\n    "total_ops": 10,\n' in text


def test_sample_stats_match_the_statistics_module_on_real_durations() -> None:
    # 20 repeats of the real profiled durations of one MatMulV3 signature (fixture lines 10, 41, ...).
    durations = [float(r["Duration(us)"]) for r in ROWS.values()
                 if r["Type"] == "MatMulV3" and r["Input Shapes"] == ROWS[10]["Input Shapes"]][:20]
    assert len(durations) == 20
    stats = SampleStats.of(durations)
    assert (stats.mean, stats.median, stats.minimum, stats.count) == (
        statistics.fmean(durations), statistics.median(durations), min(durations), 20)
    assert stats.std == pytest.approx(statistics.pstdev(durations), rel=1e-12)


def test_run_report_has_no_nan_and_counts_an_empty_run() -> None:
    summary = make_summary()
    summary.results = [MM_A.result("passed", (float("nan"),))]
    summary.quarantined, summary.gaps, summary.files = [], [], []
    summary.elapsed_s = float("inf")
    text = json.dumps(build_run_report(summary), allow_nan=False)  # raises on NaN / infinity
    loaded = json.loads(text)
    assert loaded["elapsed_s"] is None
    assert loaded["results"][0]["stats"]["mean_us"] is None

    summary.results = []
    stats = build_run_report(summary)["stats"]
    assert stats == {"total_ops": 0, "passed_ops": 0, "failed_ops": 0, "pass_rate": 0.0, "op_results": {}}


# ----------------------------------------------------------------------------- writer / coverage
def _matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_write_reports_names_files_by_timestamp(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    summary = make_summary()
    paths = write_reports(reports, summary, "20260302_101500")
    names = [p.name for p in paths]
    assert names[:3] == ["replay_report_20260302_101500.md", "duration_gap_20260302_101500.csv",
                         "run_report_20260302_101500.json"]
    assert names[3:] == (["duration_gap_20260302_101500.png"] if _matplotlib_available() else [])
    assert sorted(p.name for p in reports.iterdir()) == sorted(names)
    assert paths[0].read_text(encoding="utf-8") == render_replay_report(summary)
    assert len(_read_csv(paths[1])) == 6
    assert json.loads(paths[2].read_text(encoding="utf-8"))["task_log_dir"] == str(reports)


def test_a_failing_plot_costs_only_the_plot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(path: Path, gaps: list[GapRow]) -> Path:
        raise RuntimeError("no usable font")

    monkeypatch.setattr("perf_plugin.report.writer.plot_gap", broken)
    with pytest.warns(UserWarning, match="duration gap plot not written: RuntimeError: no usable font"):
        paths = write_reports(tmp_path, make_summary(), "20260302_101500")
    assert [p.suffix for p in paths] == [".md", ".csv", ".json"]


@pytest.mark.parametrize("timestamp", ["2026-03-02", "../20260302_101500", "20260302_1015", "20260302_101500\n"])
def test_write_reports_rejects_a_bad_timestamp(tmp_path: Path, timestamp: str) -> None:
    with pytest.raises(ValueError, match="is not in the form %Y%m%d_%H%M%S"):
        write_reports(tmp_path / "reports", make_summary(), timestamp)
    assert not (tmp_path / "reports").exists()


def test_report_timestamp_is_utc() -> None:
    one_hour_east = timezone(timedelta(hours=1))
    assert report_timestamp(datetime(2026, 3, 2, 11, 15, 0, tzinfo=one_hour_east)) == "20260302_101500"
    assert re.fullmatch(r"\d{8}_\d{6}", report_timestamp())


def test_coverage_table_and_its_lines() -> None:
    summary = make_summary()
    table = coverage_table(summary)
    assert table == [
        ("FlashAttentionScore", 1, 0, 0, 0.0),
        ("MatMulV3", 6, 5, 4, 4 / 6),
        ("RmsNorm", 3, 2, 1, 1 / 3),
    ]
    assert coverage_table(summary.results, summary.quarantined) == table
    assert format_coverage_table(table) == [
        "kernel type            rows  replay  passed   covered",
        "FlashAttentionScore       1       0       0      0.0%",
        "MatMulV3                  6       5       4     66.7%",
        "RmsNorm                   3       2       1     33.3%",
        "total                    10       7       5     50.0%",
    ]


# ----------------------------------------------------------------------------- plot
def test_plot_gap_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = plot_gap(tmp_path / "gap.png", make_summary().gaps)
    assert path == tmp_path / "gap.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_gap(tmp_path / "none.png", [GapRow("RmsNorm.csv", 5, "s", 43.1, None)]) is None
    assert not (tmp_path / "none.png").exists()


def test_plot_gap_without_matplotlib_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes ``import matplotlib...`` fail
    assert plot_gap(tmp_path / "gap.png", make_summary().gaps) is None
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- environment
def test_env_spec_records_torch_env_vars_and_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    git = shutil.which("git")
    if git is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    repo.mkdir()
    for args in (["init", "-q"], ["-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q",
                                  "--allow-empty", "-m", "first"]):
        subprocess.run([git, *args], cwd=repo, check=True, capture_output=True)
    commit = subprocess.run([git, "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True, text=True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setenv("PERF_REPEAT_COUNT", "7")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    # a generous budget: under a loaded suite (14 workers on a GPU host) 10 s ran out twice,
    # and what this test checks is the content, not the time (the budget has tests of its own)
    spec = collect_env_spec("cpu", cwd=repo, subprocess_budget_s=120.0)
    assert spec["errors"] == {}, spec["errors"]
    assert spec["backend"] == "cpu"
    assert spec["torch"]["version"] == str(torch.__version__)
    assert spec["torch"]["cuda"] == torch.version.cuda
    assert spec["torch"]["imported"] is True
    assert spec["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert spec["env"]["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert spec["env"]["PERF_REPEAT_COUNT"] == "7"
    assert "OMP_NUM_THREADS" not in spec["env"]
    assert spec["git"] == {"commit": commit.stdout.strip(), "branch": spec["git"]["branch"], "dirty": False}
    assert spec["packages"]["pytest"] == pytest.__version__
    assert spec["cpu"]["logical_count"] >= 1
    json.dumps(spec, allow_nan=False)  # JSON-ready as it is


def test_env_spec_without_git_or_imported_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    version = str(torch.__version__)
    cuda = torch.version.cuda
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no git, no nvidia-smi
    monkeypatch.setitem(sys.modules, "torch", None)  # as if the run had not imported torch
    spec = collect_env_spec("cpu", cwd=Path(__file__).parent)
    assert spec["git"] is None
    assert spec["errors"] == {}
    assert (spec["torch"]["version"], spec["torch"]["cuda"], spec["torch"]["imported"]) == (version, cuda, False)


def test_env_spec_reads_gpus_from_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if Path("/proc/driver/nvidia").exists():
        pytest.skip("the driver's /proc entries take precedence over nvidia-smi here")
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\nprintf 'NVIDIA H100 80GB HBM3, 580.159.04\\nNVIDIA H100 80GB HBM3, 580.159.04\\n'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tool.parent))
    monkeypatch.setitem(sys.modules, "torch", None)
    spec = collect_env_spec("cuda", subprocess_budget_s=10.0)
    assert spec["cuda_devices"] == {"source": "nvidia-smi", "count": 2, "names": ["NVIDIA H100 80GB HBM3"] * 2,
                                    "driver": "580.159.04"}
    # Off the CUDA backend nvidia-smi is not run at all.
    assert collect_env_spec("cpu", subprocess_budget_s=10.0)["cuda_devices"] is None


def test_env_spec_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> dict:
        raise OSError("cpuinfo unreadable")

    monkeypatch.setattr(environment, "_cpu", broken)
    monkeypatch.setattr(environment.socket, "gethostname", lambda: 1 / 0)
    spec = collect_env_spec("npu")
    assert spec["cpu"] is None and spec["host"] is None
    assert spec["errors"] == {"cpu": "OSError: cpuinfo unreadable", "host": "ZeroDivisionError: division by zero"}
    assert spec["torch"]["version"]  # the other sections are still there
    # The npu backend always gets an ascend section, even where torch_npu and CANN are absent.
    assert set(spec["ascend"]) >= {"torch_npu", "cann", "toolkit_home"}


def test_cpu_model_and_driver_parsing() -> None:
    x86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n\nprocessor\t: 1\n"
    kunpeng = "processor\t: 0\nBogoMIPS\t: 200.00\nCPU implementer\t: 0x48\nCPU architecture: 8\nCPU part\t: 0xd01\n"
    unknown_arm = "processor\t: 0\nCPU implementer\t: 0x61\nCPU part\t: 0x033\n"
    assert cpu_model(x86) == "Intel(R) Xeon(R) Platinum 8480+"
    assert cpu_model(kunpeng) == "HiSilicon Kunpeng-920"
    assert cpu_model(unknown_arm) == "implementer 0x61 part 0x033"
    assert cpu_model("") is None
    proprietary = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Release Build  "
                   "(dvs-builder@U22-I3-AE18-23-3)  Wed Nov 19 01:53:34 UTC 2025\nGCC version:  gcc version 12\n")
    open_module = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  (root)\n"
    assert nvidia_driver(proprietary) == "580.159.04"
    assert nvidia_driver(open_module) == "570.86.15"
    assert nvidia_driver("garbage") is None


CUDA_TORCH_VERSION_PY = """from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'rocm', 'xpu']
__version__ = '2.11.0+cu130'
debug = False
cuda: Optional[str] = '13.0'
git_version = '70d99e998b4955e0049d13a98d77ae1b14db1f45'
hip: Optional[str] = None
rocm: Optional[str] = None
xpu: Optional[str] = None
"""


def test_torch_build_read_without_importing_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # torch/version.py of a CUDA 13.0 build, as that wheel ships it.
    version_py = tmp_path / "version.py"
    version_py.write_text(CUDA_TORCH_VERSION_PY, encoding="utf-8")
    monkeypatch.setattr(environment, "_torch_version_path", lambda: version_py)
    monkeypatch.setitem(sys.modules, "torch", None)
    torch_spec = collect_env_spec("cuda", subprocess_budget_s=0.0)["torch"]
    assert torch_spec == {"version": "2.11.0+cu130", "cuda": "13.0", "hip": None,
                          "git_version": "70d99e998b4955e0049d13a98d77ae1b14db1f45", "imported": False}


def test_cudnn_version_text() -> None:
    assert cudnn_text(91900) == "9.19.0"  # what torch 2.11+cu130 reports for cuDNN 9.19.0
    assert cudnn_text(90100) == "9.1.0"
    assert cudnn_text(8907) == "8.9.7"


def test_the_run_report_is_written_a_case_at_a_time_and_reads_back_whole(tmp_path: Path) -> None:
    from perf_plugin.report.run_json import iter_run_report, render_run_report, write_run_report

    summary = make_summary()
    pieces = list(iter_run_report(summary, tmp_path))
    case_lines = [p for p in pieces if '"case_id"' in p]
    assert len(case_lines) == len(summary.results) > 1  # one piece per case, not the list at once
    path = write_run_report(tmp_path / "run_report_20260302_101500.json", summary)
    assert path.read_text() == "".join(pieces) == render_run_report(summary, tmp_path)
    loaded = json.loads(path.read_text())
    assert [c["case_id"] for c in loaded["results"]] == [r.ref.case_id for r in summary.results]
