"""Shards on hosts that share no file system: each writes its results (--perf-results-out), and
``perfdb merge`` writes them all into one database."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from perf_plugin.cli import main as perfdb
from tests.test_comm_torchrun import child_env
from tests.test_shards import BENCH_FILE, SIZES, _database, _measured, _pytest


def test_two_shards_on_two_copies_merge_into_one_database(tmp_path: Path) -> None:
    copies = []
    for shard in (0, 1):
        host = tmp_path / f"host{shard}"
        (host / "bench").mkdir(parents=True)
        shutil.copy(BENCH_FILE, host / "bench" / BENCH_FILE.name)
        db = _database(host)
        out = host / "results.jsonl"
        done = subprocess.run(
            [sys.executable, *_pytest(db, "--perf-shard", f"{shard}/2", "--perf-results-out", str(out))],
            cwd=host, env=child_env(), capture_output=True, text=True, timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"results: {4 if shard == 0 else 4} measured case(s) in {out}" in done.stdout
        copies.append((db, out))
    target = _database(tmp_path / "central")
    assert _measured(target) == []
    assert perfdb(["merge", str(target), str(copies[0][1]), str(copies[1][1]), "--dry-run"]) == 0
    assert _measured(target) == []
    assert perfdb(["merge", str(target), str(copies[0][1]), str(copies[1][1])]) == 0
    assert len(_measured(target)) == len(SIZES) + 1
    # each row holds the duration its shard measured, and the files are left as they were
    for db, out in copies:
        with (db / "Abs.csv").open(newline="") as handle:
            here = {r["Input Shapes"]: r["Average Duration(us)"] for r in csv.DictReader(handle) if r["Average Duration(us)"]}
        with (target / "Abs.csv").open(newline="") as handle:
            merged = {r["Input Shapes"]: r["Average Duration(us)"] for r in csv.DictReader(handle)}
        assert all(merged[shape] == value for shape, value in here.items())
        assert json.loads(out.read_text().splitlines()[0])["update_mode"] == "all"


def test_a_file_that_is_not_a_result_journal_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = _database(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"not": "a header"}\n')
    assert perfdb(["merge", str(db), str(bad)]) == 2
    assert "not a result journal" in capsys.readouterr().err
