"""Rows split across processes: ``--perf-shard I/N``, and torchrun ranks on two "nodes" of one
machine gathered to rank 0, which alone writes the database and the reports."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from perf_plugin.run.shards import Shard, current_shard, parse_shard, split
from tests.test_comm_torchrun import child_env, free_port

BENCH_FILE = Path(__file__).parents[1] / "bench" / "test_kernels.py"
HEADER = "OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats"
SIZES = (3, 4, 5, 6, 7, 8, 9)


def _database(root: Path) -> Path:
    db = root / "db"
    db.mkdir(parents=True)
    (db / "Abs.csv").write_text(
        "\n".join([HEADER] + [f'dynamic,CPU,"""{n},16""",FLOAT,ND,"""{n},16""",FLOAT,ND' for n in SIZES]) + "\n"
    )
    (db / "Add.csv").write_text(HEADER + '\ndynamic,CPU,"""8,8;8,8""",FLOAT;FLOAT,ND;ND,"""8,8""",FLOAT,ND\n')
    return db


def _measured(db: Path) -> list[str]:
    rows = []
    for path in sorted(db.glob("*.csv")):
        with path.open(newline="") as handle:
            rows += [f"{path.stem}:{r['Input Shapes']}" for r in csv.DictReader(handle) if r.get("Average Duration(us)")]
    return rows


def _pytest(db: Path, *extra: str) -> list[str]:
    return ["-m", "pytest", "bench", "--perf-database-path", str(db), "--perf-repeat-count", "3",
            "--perf-warmup-count", "1", "-p", "no:cacheprovider", "-q", *extra]


def test_shard_option_and_torchrun_ranks_give_the_split() -> None:
    assert parse_shard("1/4") == (1, 4)
    for bad in ("4/4", "-1/2", "1", "a/b", "0/0"):
        with pytest.raises(ValueError):
            parse_shard(bad)
    assert current_shard("0/1") is None  # one shard is the whole database
    assert current_shard(None, {}) is None
    torchrun = {"TORCHELASTIC_RUN_ID": "x", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}
    assert current_shard(None, torchrun) == Shard(3, 4, distributed=True)
    assert current_shard("0/2", torchrun) == Shard(0, 2, distributed=False)  # the option wins
    items = ["c0", "t", "c1", "c2", "c3"]
    is_case = [True, False, True, True, True]
    assert split(items, is_case, Shard(0, 2, False)) == (["c0", "t", "c2"], ["c1", "c3"])
    assert split(items, is_case, Shard(1, 2, False)) == (["c1", "c3"], ["c0", "t", "c2"])
    assert split(items, is_case, Shard(1, 2, True)) == (["t", "c1", "c3"], ["c0", "c2"])  # torchrun: on every rank


def test_two_shards_replay_the_database_between_them(tmp_path: Path) -> None:
    (tmp_path / "bench").mkdir()
    shutil.copy(BENCH_FILE, tmp_path / "bench" / BENCH_FILE.name)
    db = _database(tmp_path)
    first = subprocess.run([sys.executable, *_pytest(db, "--perf-shard", "0/2")], cwd=tmp_path, env=child_env(),
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "4 passed, 4 deselected" in first.stdout
    half = _measured(db)
    assert len(half) == 4
    second = subprocess.run([sys.executable, *_pytest(db, "--perf-shard", "1/2")], cwd=tmp_path, env=child_env(),
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert len(_measured(db)) == len(SIZES) + 1 and set(half) < set(_measured(db))


def test_torchrun_on_two_nodes_of_two_ranks_gathers_to_rank_zero(tmp_path: Path) -> None:
    (tmp_path / "bench").mkdir()
    shutil.copy(BENCH_FILE, tmp_path / "bench" / BENCH_FILE.name)
    db = _database(tmp_path)
    port = free_port()
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
             "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
             *_pytest(db, "--benchmark-json", str(tmp_path / "bench.json"))],
            cwd=tmp_path, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for node in (0, 1)
    ]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(outputs)
    assert len(_measured(db)) == len(SIZES) + 1  # every row, from four ranks
    assert len(list((db / "reports").glob("run_report_*.json"))) == 1  # written once, by rank 0
    assert outputs[0].count("write-back (all): 2 file(s) written, 8 rows updated") == 1
    assert outputs[1].count("went to rank 0") == 2
    # pytest-benchmark gets every rank's cases, from rank 0 alone
    assert len(json.loads((tmp_path / "bench.json").read_text())["benchmarks"]) == len(SIZES) + 1


# ----------------------------------------------------------------------------- collectives and replays in one session
COMM_FILE = Path(__file__).parents[1] / "bench" / "test_collectives.py"
TINY_COMM = ["--bytes-grid", "1K", "--comm-iters", "2", "--comm-warmup", "1", "--comm-timeout", "60"]


def _bench_with_collectives(root: Path) -> Path:
    """A project whose bench/ holds the replay test and the collectives, as the repository's does."""
    (root / "bench").mkdir()
    shutil.copy(BENCH_FILE, root / "bench" / BENCH_FILE.name)
    shutil.copy(COMM_FILE, root / "bench" / COMM_FILE.name)
    return _database(root)


def _torchrun(root: Path, db: Path, *extra: str, timeout: float) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               *_pytest(db, "--comm-output-dir", str(root / "comm"), *TINY_COMM, *extra)]
    return subprocess.run(command, cwd=root, env=child_env(), capture_output=True, text=True, timeout=timeout)


def test_a_comm_session_beside_replay_cases_ends_under_torchrun(tmp_path: Path) -> None:
    """-m comm deselects every replay case: no rank gathers, none waits, the run ends at once."""
    db = _bench_with_collectives(tmp_path)
    done = _torchrun(tmp_path, db, "-m", "comm", timeout=60)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "4 passed, 8 deselected" in done.stdout
    assert done.stdout.count("0 of 0 replay case(s) here") == 2  # each rank says what it really holds
    assert _measured(db) == [] and len(list((tmp_path / "comm").glob("hcom_*.csv"))) == 4


def test_replays_after_collectives_gather_to_rank_zero_through_the_store(tmp_path: Path) -> None:
    """Under torchrun the collectives run beside the replay cases; the collectives' process group
    is gone by the end of the session, and the ranks' results still reach rank 0."""
    db = _bench_with_collectives(tmp_path)
    done = _torchrun(tmp_path, db, timeout=240)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert done.stdout.count("4 of 8 replay case(s) here") >= 2
    assert len(_measured(db)) == len(SIZES) + 1  # both ranks' rows, written once by rank 0
    assert done.stdout.count("went to rank 0") == 1


STALL_CONFTEST = '''
import os
import time


def pytest_sessionfinish(session):
    if os.environ.get("RANK") == "1":
        time.sleep(600)  # a rank that never gets to send its results
'''


def test_a_rank_that_stalls_is_named_and_rank_zero_writes_its_own_share(tmp_path: Path) -> None:
    db = _bench_with_collectives(tmp_path)
    (tmp_path / "conftest.py").write_text(STALL_CONFTEST)
    done = _torchrun(tmp_path, db, "--perf-rank-timeout", "3", timeout=120)
    assert done.returncode != 0
    assert ("rank 1 of 2: results not received: no progress for 3 s; its last step: session end: flushing the "
            "profiler") in done.stdout, done.stdout[-4000:] + done.stderr[-4000:]
    assert len(_measured(db)) == 4  # rank 0's share: every other case
