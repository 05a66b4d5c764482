"""Real gloo collectives through torchrun on the CPU, and how the plugin selects, refuses and reports.

The multi-rank tests start ``python -m torch.distributed.run`` (2 and 4 ranks) over a copy of
``bench/test_collectives.py`` and read the CSVs the run wrote with the csv module.  Grids are
tiny and iterations few: 4 gloo ranks on a 2-core CI machine are slow.
"""

from __future__ import annotations

import csv
import importlib.metadata
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH_FILE = REPO / "bench" / "test_collectives.py"
EXPECTED_HEADER = [
    "message_bytes", "num_devices", "dtype", "topology_tier", "Duration(us)", "bandwidth_gbps",
    "bus_bandwidth_gbps", "Median Duration(us)", "iterations", "mode", "backend", "world_size", "timestamp",
    "nccl_tests_bytes",
]
TORCHRUN_VARIABLES = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT",
)
# message_bytes is what the Ascend performance model computes: one rank's chunk for these two,
# nccl_tests_bytes / n (the gathered output / the scattered input)
RANK_CHUNK_FILES = ("hcom_allGather_.csv", "hcom_reduceScatter_.csv")
BUS_FACTOR = {  # nccl-tests: 2(n-1)/n for all-reduce, (n-1)/n otherwise
    "hcom_allReduce_.csv": lambda n: 2 * (n - 1) / n,
    "hcom_allGather_.csv": lambda n: (n - 1) / n,
    "hcom_reduceScatter_.csv": lambda n: (n - 1) / n,
    "hcom_alltoallv_.csv": lambda n: (n - 1) / n,
}


def plugin_args() -> list[str]:
    """Load the plugin by module unless its entry point is installed (loading both is an error)."""
    names = {ep.name for ep in importlib.metadata.entry_points(group="pytest11")}
    return [] if "perf_plugin_comm" in names else ["-p", "perf_plugin.comm.pytest_plugin"]


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES and k != "PYTEST_ADDOPTS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env["OMP_NUM_THREADS"] = "1"
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def bench_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "bench"
    directory.mkdir()
    shutil.copy(BENCH_FILE, directory / BENCH_FILE.name)
    return directory


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=300)


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        return header, [dict(zip(header, row)) for row in reader]


def six_digits(value: float) -> str:
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return text or "0"


def check_row(file_name: str, row: dict[str, str]) -> None:
    size, n, nccl = int(row["message_bytes"]), int(row["num_devices"]), int(row["nccl_tests_bytes"])
    assert nccl == size * (n if file_name in RANK_CHUNK_FILES else 1)
    duration = float(row["Duration(us)"])
    assert duration > 0 and float(row["Median Duration(us)"]) > 0
    assert abs(float(row["bandwidth_gbps"]) - size / (duration * 1e3)) <= 5e-7
    assert row["bus_bandwidth_gbps"] == six_digits(nccl / (duration * 1e3) * BUS_FACTOR[file_name](n))
    assert row["backend"] == "gloo"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", row["timestamp"])


def test_two_ranks_through_torchrun(tmp_path: Path, bench_dir: Path) -> None:
    out = tmp_path / "out"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
        "-m", "pytest", str(bench_dir), "-m", "comm", "-p", "no:cacheprovider", *plugin_args(),
        "--bytes-grid", "1K,4K", "--comm-dtypes", "bf16,int8", "--comm-iters", "3", "--comm-warmup", "1",
        "--comm-timeout", "60", "--comm-output-dir", str(out),
    ]
    proc = run(command, tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "16 passed" in proc.stdout
    assert sorted(p.name for p in out.glob("*.csv")) == sorted(BUS_FACTOR)
    for file_name in BUS_FACTOR:
        header, rows = read_csv(out / file_name)
        assert header == EXPECTED_HEADER
        assert [(r["nccl_tests_bytes"], r["dtype"]) for r in rows] == [
            ("1024", "DT_BF16"), ("4096", "DT_BF16"), ("1024", "DT_INT8"), ("4096", "DT_INT8"),
        ]
        for row in rows:
            check_row(file_name, row)
            assert (row["num_devices"], row["topology_tier"], row["iterations"], row["mode"], row["world_size"]) == (
                "2", "1", "3", "kernel", "2",
            )


def test_four_ranks_subgroups_tiers_and_a_failing_write(tmp_path: Path, bench_dir: Path) -> None:
    """--comm-nproc launches torchrun; a rank-0 write error fails that case on every rank, no hang."""
    out = tmp_path / "out"
    out.mkdir()
    broken = b"message_bytes,num_devices,dtype,topology_tier,Duration(us),bandwidth_gbps\n1024,two,FLOAT,1,5,1\n"
    (out / "hcom_allGather_.csv").write_bytes(broken)
    command = [
        sys.executable, "-m", "pytest", str(bench_dir), "-m", "comm", "-p", "no:cacheprovider", *plugin_args(),
        "--comm-nproc", "4", "--num-devices", "2,4", "--grid-shape", "2x2", "--comm-ops", "all_reduce,all_gather,all_to_all",
        "--comm-dtypes", "fp32", "--bytes-grid", "1K", "--comm-mode", "event", "--comm-iters", "2", "--comm-warmup", "0",
        "--comm-timeout", "60", "--comm-output-dir", str(out),
    ]
    proc = run(command, tmp_path)
    assert proc.returncode != 0
    assert "collectives: launching 4 ranks" in proc.stdout
    assert "2 failed, 4 passed" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-4000:]
    reason = f"rank 0 could not write the result: {out / 'hcom_allGather_.csv'}, row 2, column 'num_devices'"
    assert proc.stdout.count(reason) >= 2  # both all_gather cases, reported by rank 0
    assert (out / "hcom_allGather_.csv").read_bytes() == broken
    for file_name in ("hcom_allReduce_.csv", "hcom_alltoallv_.csv"):
        header, rows = read_csv(out / file_name)
        assert header == EXPECTED_HEADER
        # groups of 2 stay inside a 2-device pod of the 2x2 grid (tier 1); groups of 4 span pods (tier 0)
        assert [(r["num_devices"], r["topology_tier"]) for r in rows] == [("2", "1"), ("4", "0")]
        for row in rows:
            check_row(file_name, row)
            assert (row["message_bytes"], row["dtype"], row["mode"], row["world_size"]) == ("1024", "DT_FLOAT", "event", "4")


def test_world_of_one_writes_the_derived_directory(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setenv("PYTHONPATH", child_env()["PYTHONPATH"])
    pytester.makepyfile(test_collectives=BENCH_FILE.read_text())
    result = pytester.runpytest_subprocess(
        *plugin_args(), "-p", "no:cacheprovider", "-m", "comm", "--comm-ops", "all_reduce,reduce_scatter",
        "--comm-dtypes", "fp16", "--bytes-grid", "2K", "--comm-iters", "2", "--comm-warmup", "0",
    )
    result.assert_outcomes(passed=2)
    directory = pytester.path / "database" / "data" / f"CPU_{platform.machine().upper()}" / "gloo" / torch.__version__.split("+")[0]
    for file_name in ("hcom_allReduce_.csv", "hcom_reduceScatter_.csv"):
        header, rows = read_csv(directory / file_name)
        assert header == EXPECTED_HEADER and len(rows) == 1
        check_row(file_name, rows[0])
        assert (rows[0]["num_devices"], rows[0]["bus_bandwidth_gbps"], rows[0]["world_size"]) == ("1", "0", "1")


# ----------------------------------------------------------------------------- selection and refusals (in process)
@pytest.fixture
def collectives(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_collectives=BENCH_FILE.read_text())
    pytester.makepyfile(test_other="def test_compute():\n    pass\n")
    return pytester


def test_plain_run_deselects_collectives(collectives: pytest.Pytester) -> None:
    result = collectives.runpytest(*plugin_args(), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.fnmatch_lines(["collectives: 1 collective test(s) deselected; select them with -m comm*"])


def test_collect_only_lists_readable_ids_without_launching(collectives: pytest.Pytester) -> None:
    result = collectives.runpytest(
        *plugin_args(), "-p", "no:cacheprovider", "--collect-only", "-q", "-m", "hccl", "--comm-nproc", "4",
        "--num-devices", "2,4", "--comm-ops", "all_reduce", "--bytes-grid", "1K,1M",
    )
    assert result.ret == 0
    assert [line for line in result.outlines if "::" in line] == [
        "test_collectives.py::test_collective[all_reduce-n2-bf16-1024B]",
        "test_collectives.py::test_collective[all_reduce-n2-bf16-1048576B]",
        "test_collectives.py::test_collective[all_reduce-n4-bf16-1024B]",
        "test_collectives.py::test_collective[all_reduce-n4-bf16-1048576B]",
    ]
    assert "launching" not in result.stdout.str()


@pytest.mark.parametrize(
    ("world", "args", "message"),
    [
        (0, ["-m", "comm", "--num-devices", "2"],
         "ERROR: --num-devices: a group of 2 devices needs at least 2 ranks, but this run has 1 *"),
        (4, ["--num-devices", "3"], "ERROR: --num-devices: a group of 3 devices does not divide the world of 4 ranks"),
        (2, ["--comm-ops", "all_gather", "--bytes-grid", "1026"],
         "ERROR: --bytes-grid: 1026 bytes is not a multiple of 4 (all_gather of bf16 over 2 devices *"),
        (2, ["--comm-dtypes", "bf16,fp64"], "ERROR: --comm-dtypes: unknown dtype 'fp64' *"),
        (0, ["-m", "comm", "--comm-ops", "broadcast"], "ERROR: --comm-ops: unknown collective 'broadcast' *"),
        (0, ["--comm-nproc", "2"], "ERROR: --comm-nproc launches the collective benchmarks: select them with -m comm*"),
        (0, ["-m", "comm", "-n", "2"], "ERROR: collective benchmarks run one process per device under torchrun*"),
    ],
)
def test_bad_input_is_one_usage_error(
    collectives: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, world: int, args: list[str], message: str
) -> None:
    if world:  # rank 1 as torchrun starts it; the error must come before any process group exists
        for name, value in (("TORCHELASTIC_RUN_ID", "t"), ("RANK", "1"), ("LOCAL_RANK", "1")):
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("WORLD_SIZE", str(world))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(world))
    result = collectives.runpytest(*plugin_args(), "-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "Traceback" not in result.stderr.str()
    assert not (collectives.path / "database").exists()


# ----------------------------------------------------------------------------- nothing left behind
HOLD_CONFTEST = '''
import os
import time
from pathlib import Path


def pytest_collection_finish(session):
    rank = os.environ.get("RANK")
    if rank is not None:  # a rank: say who it is, then hold the run (as a long collective would)
        (Path(__file__).parent / "pids" / rank).write_text(str(os.getpid()))
        time.sleep(600)
'''


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent that may never reap it."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return fields[0] != "Z"


def _rank_pids(root: Path, count: int, process: subprocess.Popen[str]) -> list[int]:
    deadline = time.monotonic() + 120
    while len(list((root / "pids").iterdir())) < count:
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.1)
    return [int(p.read_text()) for p in (root / "pids").iterdir()]


@pytest.mark.skipif(platform.system() != "Linux", reason="ranks die with their parent through Linux's PR_SET_PDEATHSIG")
@pytest.mark.parametrize("form", ["comm-nproc", "torchrun"])
def test_killing_the_launcher_outright_leaves_no_rank_behind(tmp_path: Path, bench_dir: Path, form: str) -> None:
    (tmp_path / "conftest.py").write_text(HOLD_CONFTEST)
    (tmp_path / "pids").mkdir()
    pytest_args = [str(bench_dir), "-m", "comm", "-p", "no:cacheprovider", *plugin_args(), "--bytes-grid", "1K"]
    if form == "comm-nproc":
        command = [sys.executable, "-m", "pytest", *pytest_args, "--comm-nproc", "2"]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                   str(free_port()), "-m", "pytest", *pytest_args]
    process = subprocess.Popen(command, cwd=tmp_path, env=child_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    pids = _rank_pids(tmp_path, 2, process)
    process.kill()  # kill -9: no handler of its own runs
    process.communicate(timeout=30)
    deadline = time.monotonic() + 60
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in pids if _alive(pid)]
    for pid in left:
        os.kill(pid, 9)
    assert not left, f"ranks {left} outlived their launcher"
