"""``perfdb ingest`` / ``python -m perf_plugin.ingest``: exit codes, messages, derived paths."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from perf_plugin.cli import main

ASCEND = Path(__file__).parent / "fixtures" / "ascend"
LEVEL2 = ASCEND / "kernel_details_level2_llm_train.csv"
LEVEL1 = ASCEND / "kernel_details_level1.csv"
LEVEL0 = ASCEND / "kernel_details_level0.csv"
REPO = Path(__file__).resolve().parents[1]


def test_explicit_database_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    database = tmp_path / "db"
    assert main(["ingest", "--profiling-path", str(LEVEL2), "--database-path", str(database)]) == 0
    out = capsys.readouterr().out
    assert "derived" not in out
    assert f"database: {database}" in out
    assert "communication rows left out of the compute CSVs: 15 (hcom_allGather_ x3, hcom_allReduce_ x7," in out
    assert "  MatMulV3.csv: created (appended 10, updated 0, unchanged 0)" in out
    with LEVEL2.open(newline="", encoding="utf-8") as handle:
        types = {r["Type"] for r in csv.DictReader(handle) if not r["Type"].startswith("hcom_")}
    assert {p.stem for p in database.glob("*.csv")} == types

    assert main(["ingest", "--profiling-path", str(LEVEL2), "--database-path", str(database)]) == 0
    assert "  MatMulV3.csv: unchanged (appended 0, updated 0, unchanged 10)" in capsys.readouterr().out


def test_derived_ascend_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "ingest",
        "--profiling-path",
        str(LEVEL1),
        "--database-root",
        str(tmp_path),
        "--vllm-version",
        "0.18.0",
        "--torch-version",
        "2.9.0",
        "--cann-version",
        "8.5",
    ]
    assert main(argv) == 0
    expected = tmp_path / "ATLAS_800_A3_752T_128G_DIE" / "vllm_ascend" / "vllm0.18.0_torch2.9.0_cann8.5"
    assert f"database path (derived): {expected}" in capsys.readouterr().out
    assert (expected / "Conv2D.csv").is_file()

    assert main([*argv, "--device", "ATLAS_800_A2_280T_64G"]) == 0
    other = tmp_path / "ATLAS_800_A2_280T_64G" / "vllm_ascend" / "vllm0.18.0_torch2.9.0_cann8.5"
    assert (other / "Conv2D.csv").is_file()


def test_missing_versions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["ingest", "--profiling-path", str(LEVEL1), "--database-root", str(tmp_path), "--torch-version", "2.9.0"]
    code = main(argv)
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("perfdb ingest: error: give --database-path, or --vllm-version, --cann-version")
    assert list(tmp_path.iterdir()) == []


def test_level0_exit_code_and_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["ingest", "--profiling-path", str(LEVEL0), "--database-path", str(tmp_path / "db")])
    assert code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1  # one line, no traceback
    assert lines[0].startswith(f"perfdb ingest: error: {LEVEL0}: not a kernel table ingest can use: missing column(s)")
    assert "ProfilerLevel.Level1" in lines[0] and "AiCMetrics.PipeUtilization" in lines[0]
    assert not (tmp_path / "db").exists()


def test_missing_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ingest", "--profiling-path", str(tmp_path / "nope"), "--database-path", str(tmp_path)]) == 2
    assert "profiling path does not exist" in capsys.readouterr().err


def test_only_communication_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with LEVEL2.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    path = tmp_path / "kernel_details.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([rows[0], *(r for r in rows[1:] if r[6].startswith("hcom_"))])
    assert main(["ingest", "--profiling-path", str(path), "--database-path", str(tmp_path / "db")]) == 2
    assert "no compute kernels to ingest (15 rows read, 15 communication)" in capsys.readouterr().err
    assert not (tmp_path / "db").exists()


def test_dry_run_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ingest", "--profiling-path", str(LEVEL2), "--database-path", str(tmp_path / "db"), "--dry-run"]) == 0
    assert "aggregated rows: 109 in 35 kernel type(s)" in capsys.readouterr().out
    assert not (tmp_path / "db").exists()


def test_trace_derived_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    layer = torch.nn.Linear(8, 4)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        layer(torch.ones(2, 8))
    trace = tmp_path / "run.pt.trace.json"
    prof.export_chrome_trace(str(trace))
    argv = ["ingest", "--profiling-path", str(trace), "--database-root", str(tmp_path / "data")]
    assert main(argv) == 2
    assert "--torch-version" in capsys.readouterr().err
    assert main([*argv, "--torch-version", "2.13.0", "--device", "CPU_X86_64"]) == 0
    expected = tmp_path / "data" / "CPU_X86_64" / "torch" / "torch2.13.0"
    assert f"database path (derived): {expected}" in capsys.readouterr().out
    assert (expected / "MatMulV2.csv").is_file()


def test_python_dash_m(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "perf_plugin.ingest", "--profiling-path", str(LEVEL0), "--database-path", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("perfdb ingest: error:")
    assert "Traceback" not in result.stderr


def test_database_path_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "db.csv"
    target.write_text("x\n", encoding="utf-8")
    assert main(["ingest", "--profiling-path", str(LEVEL1), "--database-path", str(target)]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err


def test_output_piped_to_a_reader_that_stops_early_ends_without_a_traceback(tmp_path: Path) -> None:
    """``perfdb ingest ... | true``: the reader is gone before the first line; the database is
    written all the same, and stderr holds no traceback."""
    db = tmp_path / "db"
    command = (f"{sys.executable} -m perf_plugin.ingest --profiling-path {ASCEND / 'kernel_details_level1.csv'} "
               f"--database-path {db} | true")
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=False, timeout=120,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})  # every line written as printed
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert len(list(db.glob("*.csv"))) == 33
