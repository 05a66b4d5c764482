"""DispatchFFNCombine rows of EP Size > 1 on an NPU run: their options, their launch, their session.

Without an NPU: the options are parsed by pytest as a run parses them; the session's command is
built as msprof is given it; and the orchestration runs end to end on the CPU with a stand-in
``msprof`` executable that runs the application it is given (a real ``torchrun`` of two ranks
for the expert-parallel session, whose ranks make a gloo group of 2 and run the row's replay on
the CPU), then exports a ``PROF_*`` directory in msprof's layout.  Its ``op_summary`` is built
from the real kernel_details fixture (``tests/fixtures/ascend``): the main session's rows are the
fixture's, renamed as msprof names its columns; the DispatchFFNCombine rows, which no public
profile has, are the fixture's first row with their identity cells, ``Device_id``, start and
duration replaced: one block of launches per rank's device in the expert-parallel session, one
on device 0 for the EP Size 1 row in the main session.  msprof's op_summary has no ``EP Size``
column; the session says it.
"""

from __future__ import annotations

import csv
import io
import os
import socket
import stat
import sys
import types
from pathlib import Path

import pytest

from perf_plugin.backends.cpu import CpuBackend
from perf_plugin.database.schema import format_number
from perf_plugin.profiling.msprof import EP_SESSION_ENV
from perf_plugin.replay.registry import get_replay
from perf_plugin.run.cases import STATUS_READY, STATUS_UNSUPPORTED, load_case_set
from perf_plugin.run.ep_session import EpPlan, ep_plan, split_cases
from perf_plugin.run.expert_parallel import EpLaunch, ExpertGroups, GroupWorld, group_world
from perf_plugin.run.msprof_launch import MSPROF_OPTIONS, external_run, msprof_command
from perf_plugin.run.writeback import WritebackRequest, write_back
from tests.kernels.test_dispatch_ffn_combine import SMALL
from tests.test_msprof import BENCH_TEST, FIXTURE, MUL, db_row, durations, launches, op_summary_text, read_db

DFC = "DispatchFFNCombine"
DFC_COLUMNS = list(SMALL)
EP2 = dict(SMALL, **{"EP Size": "2"})
EP4 = dict(SMALL, **{"EP Size": "4"})
REPEATS, WARMUP = 10, 3
BLOCK = 1 + WARMUP + REPEATS  # launches of one case: verification, warm-up, repeats


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_rows(path: Path, rows: list[dict[str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


# ----------------------------------------------------------------------------- options
SHOW_LAUNCH = """\
from perf_plugin.run.expert_parallel import EpLaunch
from perf_plugin.run.setup import SETTINGS

def test_launch(pytestconfig):
    print("LAUNCH", " ".join(EpLaunch.from_settings(pytestconfig.stash[SETTINGS]).torchrun_args()))
"""


@pytest.mark.parametrize(("args", "env", "ini", "expected"), [
    ((), {}, "", "--nnodes 1 --nproc-per-node 16 --node-rank 0 --master-addr 127.0.0.1 --master-port 29500"),
    (("--perf-dispatch-ffn-combine-ep-size", "8", "--perf-dispatch-ffn-combine-nnodes", "2",
      "--perf-dispatch-ffn-combine-node-rank", "1", "--perf-dispatch-ffn-combine-master-addr", "10.0.0.7",
      "--perf-dispatch-ffn-combine-master-port", "6000"), {}, "",
     "--nnodes 2 --nproc-per-node 4 --node-rank 1 --master-addr 10.0.0.7 --master-port 6000"),
    (("--dispatch-ffn-combine-ep-size", "4", "--dispatch-ffn-combine-nproc-per-node", "4"), {}, "",
     "--nnodes 1 --nproc-per-node 4 --node-rank 0"),  # the seed's spellings
    ((), {"PERF_DISPATCH_FFN_COMBINE_EP_SIZE": "2"}, "perf_dispatch_ffn_combine_ep_size = 8", "--nnodes 1 --nproc-per-node 2 "),
    ((), {}, "perf_dispatch_ffn_combine_ep_size = 8\nperf_dispatch_ffn_combine_master_port = 7000",
     "--nnodes 1 --nproc-per-node 8 --node-rank 0 --master-addr 127.0.0.1 --master-port 7000"),
], ids=["defaults", "options", "seed-spellings", "env-over-ini", "ini"])  # fmt: skip
def test_launch_options_follow_the_project_conventions(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], env: dict[str, str], ini: str, expected: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if ini:
        pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_show=SHOW_LAUNCH)
    result = pytester.runpytest("-s", "-p", "no:cacheprovider", *args)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*LAUNCH -m torch.distributed.run {expected}*"])


@pytest.mark.parametrize(("args", "message"), [
    (("--perf-dispatch-ffn-combine-ep-size", "16", "--perf-dispatch-ffn-combine-nproc-per-node", "4"),
     "*--perf-dispatch-ffn-combine-ep-size 16 needs nnodes x nproc-per-node = 16 ranks; got "
     "--perf-dispatch-ffn-combine-nnodes 1 x --perf-dispatch-ffn-combine-nproc-per-node 4*"),
    (("--perf-dispatch-ffn-combine-ep-size", "6", "--perf-dispatch-ffn-combine-nnodes", "4"),
     "*--perf-dispatch-ffn-combine-ep-size 6 is not a multiple of --perf-dispatch-ffn-combine-nnodes 4*"),
    (("--perf-dispatch-ffn-combine-node-rank", "1"),
     "*--perf-dispatch-ffn-combine-node-rank 1 is not below --perf-dispatch-ffn-combine-nnodes 1*"),
    (("--perf-dispatch-ffn-combine-master-port", "70000"), "*--perf-dispatch-ffn-combine-master-port: '70000' is not a TCP port*"),
    (("--perf-dispatch-ffn-combine-ep-size", "0"), "*--perf-dispatch-ffn-combine-ep-size: '0' is not a positive integer*"),
], ids=["world-mismatch", "nnodes", "node-rank", "port", "ep-size"])  # fmt: skip
def test_a_launch_that_cannot_be_is_one_usage_error(pytester: pytest.Pytester, args: tuple[str, ...], message: str) -> None:
    pytester.makepyfile(test_show=SHOW_LAUNCH)
    result = pytester.runpytest("-p", "no:cacheprovider", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "Traceback" not in result.stderr.str()


# ----------------------------------------------------------------------------- the command
def test_msprof_wraps_torchrun_of_the_pytest_session() -> None:
    launch = EpLaunch(16, nnodes=2, node_rank=1, master_addr="10.0.0.7", master_port=6000)
    argv = ["bench", "--perf-backend", "npu", "--perf-case-ids-file", "/tmp/ids"]
    command = msprof_command("/usr/bin/msprof", "/out/run_1", argv, "/venv/bin/python", launch.torchrun_args())
    assert command == [
        "/usr/bin/msprof", "--output=/out/run_1", *MSPROF_OPTIONS, "/venv/bin/python", "-m", "torch.distributed.run",
        "--nnodes", "2", "--nproc-per-node", "8", "--node-rank", "1", "--master-addr", "10.0.0.7", "--master-port", "6000",
        "-m", "pytest", *argv,
    ]  # fmt: skip
    assert launch.world_size == 16
    assert msprof_command("msprof", "/out", ["bench"], "python") == ["msprof", "--output=/out", *MSPROF_OPTIONS, "python", "-m", "pytest", "bench"]


def test_rank_zero_rows_are_those_of_the_first_visible_device() -> None:
    settings = types.SimpleNamespace(
        dispatch_ffn_combine_ep_size=4, dispatch_ffn_combine_nnodes=1, dispatch_ffn_combine_nproc_per_node=4,
        dispatch_ffn_combine_node_rank=0, dispatch_ffn_combine_master_addr="127.0.0.1", dispatch_ffn_combine_master_port=29500,
    )  # fmt: skip
    assert ep_plan(settings, "npu", {"ASCEND_RT_VISIBLE_DEVICES": " 4,5,6,7"}) == EpPlan(EpLaunch(4, 1, 4), "4")  # type: ignore[arg-type]
    assert ep_plan(settings, "npu", {}).rank0_device == "0"  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- which rows run where
def dfc_db(directory: Path, *rows: dict[str, str]) -> Path:
    write_rows(directory / f"{DFC}.csv", list(rows))
    return directory


def cases_by_ep(directory: Path, world: GroupWorld) -> dict[str, object]:
    return {case.row.attrs["EP Size"]: case for case in load_case_set(directory, get_replay, world=world).cases}  # type: ignore[union-attr]


def test_each_process_says_which_ep_sizes_it_runs(tmp_path: Path) -> None:
    db = dfc_db(tmp_path, SMALL, EP2, EP4)
    alone = cases_by_ep(db, GroupWorld())
    assert alone["1"].status == STATUS_READY and alone["1"].group_size == 1  # type: ignore[attr-defined]
    assert alone["2"].status == STATUS_UNSUPPORTED  # type: ignore[attr-defined]
    assert alone["2"].reason == (  # type: ignore[attr-defined]
        f"{db / (DFC + '.csv')}, row 3, column 'EP Size': EP Size 2: the kernel runs over a process group of exactly 2 "
        "ranks, which this run does not form (an NPU run, --perf-backend npu, replays such rows under msprof and "
        "torchrun with --perf-dispatch-ffn-combine-ep-size 2)"
    )
    controller = cases_by_ep(db, GroupWorld(2, launch=EpLaunch(2)))
    assert controller["2"].status == STATUS_READY and controller["2"].group_size == 2  # type: ignore[attr-defined]
    assert controller["4"].reason == (  # type: ignore[attr-defined]
        f"{db / (DFC + '.csv')}, row 4, column 'EP Size': EP Size 4 does not fit the expert-parallel launch of this run, "
        "--perf-dispatch-ffn-combine-ep-size 2 (torchrun --nnodes 1 --nproc-per-node 2) = 2 ranks; replay these rows "
        "with --perf-dispatch-ffn-combine-ep-size 4"
    )
    assert controller["1"].status == STATUS_READY  # EP Size 1 rows stay in the main session
    rank = cases_by_ep(db, GroupWorld(4, 3, session=True))
    assert rank["4"].status == STATUS_READY and rank["2"].status == STATUS_UNSUPPORTED  # type: ignore[attr-defined]
    main, collective = split_cases([(str(k), c) for k, c in controller.items()])  # type: ignore[misc]
    assert [n for n, _ in collective] == ["2"] and [n for n, _ in main] == ["1", "4"]


def test_the_session_a_process_belongs_to(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = types.SimpleNamespace(
        prof_path=None, dispatch_ffn_combine_ep_size=2, dispatch_ffn_combine_nnodes=1, dispatch_ffn_combine_nproc_per_node=2,
        dispatch_ffn_combine_node_rank=0, dispatch_ffn_combine_master_addr="127.0.0.1", dispatch_ffn_combine_master_port=29500,
    )  # fmt: skip
    assert group_world(settings, "cpu", {}) == GroupWorld()  # type: ignore[arg-type]
    assert group_world(settings, "npu", {}).launch == EpLaunch(2, 1, 2)  # type: ignore[arg-type]
    session = {EP_SESSION_ENV: "1", "RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"}
    assert group_world(settings, "npu", session) == GroupWorld(2, 1, session=True)  # type: ignore[arg-type]
    from perf_plugin.run.shards import current_shard

    assert current_shard(None, session) is None  # collective rows: every rank runs every one
    assert current_shard(None, {k: v for k, v in session.items() if k != EP_SESSION_ENV}) is not None


def test_groups_are_made_over_the_backends_collective_library(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    groups = ExpertGroups(CpuBackend(), timeout_s=30)
    try:
        group = groups(1)
        assert (group.size, group.rank) == (1, 0) and dist.get_backend(group.handle) == "gloo"
        assert groups(1) is group
        with pytest.raises(ValueError, match="a group of 2 ranks does not divide this session's 1 ranks"):
            groups(2)
    finally:
        groups.close()
    assert not dist.is_initialized()


# ----------------------------------------------------------------------------- the orchestration
STANDIN_MSPROF = """\
#!{python}
# Stands in for msprof: runs the application with this environment, keeps its command line, then
# exports a PROF_ directory whose op_summary holds the rows of the kernel types whose cases passed.
import csv, json, os, pathlib, subprocess, sys

args = sys.argv[1:]
options = []
while args and args[0].startswith("--"):
    options.append(args.pop(0))
output = pathlib.Path([o.split("=", 1)[1] for o in options if o.startswith("--output=")][0])
output.mkdir(parents=True, exist_ok=True)
(output / "command.json").write_text(json.dumps(sys.argv))
code = subprocess.call(args)
session = pathlib.Path(os.environ["PERF_MSPROF_RECORD"]) / "session.json"
records = json.loads(session.read_text())["records"].values() if session.is_file() else []
launched = set(record["ref"]["kernel_type"] for record in records if record["outcome"] == "passed")
source = os.environ["STANDIN_EP_OP_SUMMARY" if os.environ.get("PERF_EP_SESSION") == "1" else "STANDIN_OP_SUMMARY"]
lines = pathlib.Path(source).read_text().splitlines(keepends=True)
column = next(csv.reader([lines[0]])).index("OP Type")
kept = [lines[0]] + [line for line in lines[1:] if next(csv.reader([line]))[column] in launched]
prof = output / "PROF_000001_20251127120000000_STANDIN"
for device in ("device_0", "device_1"):
    (prof / device).mkdir(parents=True)
(prof / "mindstudio_profiler_output").mkdir()
(prof / "mindstudio_profiler_output" / "op_summary_20251127120000.csv").write_text("".join(kept))
sys.exit(code)
"""

# Each rank of every session notes what it ran and the process group it ran in.
RANK_LOG_CONFTEST = """\
import os

def pytest_runtest_logreport(report):
    if report.when != "call":
        return
    import torch.distributed as dist
    world = f"{dist.get_backend()}:{dist.get_world_size()}" if dist.is_initialized() else "none"
    with open(os.environ["RANK_LOG"], "a") as log:
        log.write(f"{os.environ.get('RANK', '-')} {world} {report.outcome} {report.nodeid}\\n")
"""


def dfc_launches(cells: dict[str, str], per_device: dict[str, list[float]]) -> list[str]:
    """kernel_details lines of one DispatchFFNCombine kernel: the fixture's first row with the kernel's
    identity cells, the device, start and duration replaced; one launch per duration."""
    with FIXTURE.open(encoding="utf-8-sig", newline="") as handle:
        reader = csv.DictReader(handle)
        header, template = list(reader.fieldnames or []), next(reader)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=header, lineterminator="\n")
    for device, launch_durations in per_device.items():
        for index, duration in enumerate(launch_durations):
            start = 1764244800000000.0 + 1000.0 * index + (0.5 if device == "1" else 0.0)
            writer.writerow(dict(template, **{k: v for k, v in cells.items() if k in template}, **{
                "Name": "DispatchFFNCombine_1", "Type": DFC, "Device_id": device,
                "Start Time(us)": f"{start:.3f}\t", "Duration(us)": format_number(duration),
            }))  # fmt: skip
    return out.getvalue().splitlines(keepends=True)


def test_ep_rows_run_on_every_rank_in_a_session_of_their_own_and_rank_zero_rows_are_written_back(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    msprof = bin_dir / "msprof"
    msprof.write_text(STANDIN_MSPROF.format(python=sys.executable))
    msprof.chmod(msprof.stat().st_mode | stat.S_IXUSR)
    rank0 = [40.0 + i for i in range(BLOCK)]
    rank1 = [90.0 + i for i in range(BLOCK)]
    alone = [20.0 + 2 * i for i in range(BLOCK)]  # the EP Size 1 row, in the main session
    fixture_lines = FIXTURE.read_text(encoding="utf-8-sig").splitlines(keepends=True)[1:]
    (tmp_path / "op_summary.csv").write_text(op_summary_text(fixture_lines + dfc_launches(SMALL, {"0": alone})))
    (tmp_path / "ep_op_summary.csv").write_text(op_summary_text(dfc_launches(SMALL, {"0": rank0, "1": rank1})))
    root = tmp_path / "project"
    root.mkdir()
    (root / "test_kernels.py").write_text(BENCH_TEST)
    (root / "conftest.py").write_text(RANK_LOG_CONFTEST)
    db = root / "db"
    write_rows(db / "Mul.csv", [db_row(*MUL)])
    dfc_db(db, SMALL, EP2, EP4)
    launch = EpLaunch(2, master_port=free_port())
    world = GroupWorld(launch.world_size, launch=launch)  # what the NPU controller collects with
    cases = [(f"test_kernels.py::test_kernel_replay[{c.ref.case_id}]", c) for c in load_case_set(db, get_replay, world=world).cases]
    # DispatchFFNCombine is one of vLLM-Ascend's custom operators: its package named as CANN needs it
    vendor = tmp_path / "vllm_ascend" / "_cann_ops_custom" / "vendors" / "vllm-ascend"
    (vendor / "op_api" / "lib").mkdir(parents=True)
    environ = dict(
        os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", STANDIN_OP_SUMMARY=str(tmp_path / "op_summary.csv"),
        STANDIN_EP_OP_SUMMARY=str(tmp_path / "ep_op_summary.csv"), RANK_LOG=str(tmp_path / "ranks.log"),
        ASCEND_CUSTOM_OPP_PATH=str(vendor), LD_LIBRARY_PATH=str(vendor / "op_api" / "lib"),
    )  # fmt: skip
    argv = [
        "--database-path", str(db), "--repeat-count", str(REPEATS), "--warmup-count", str(WARMUP), "-p", "no:cacheprovider",
        "-q", "test_kernels.py", "--perf-dispatch-ffn-combine-ep-size", "2", "--perf-dispatch-ffn-combine-master-port",
        str(launch.master_port),
    ]  # fmt: skip
    outcome = external_run(
        "launch", cases, repeat_count=REPEATS, warmup_count=WARMUP, argv=argv, cwd=root,
        output_root=tmp_path / "msprof_output", environ=environ, ep=EpPlan(launch, "0"),
    )  # fmt: skip

    nodeid = {(c.ref.kernel_type, c.row.attrs.get("EP Size", "")): n for n, c in cases}  # type: ignore[union-attr]
    (main_run,) = [r for r in (tmp_path / "msprof_output").glob("run_*") if not r.name.endswith("_expert_parallel")]
    (ep_run,) = (tmp_path / "msprof_output").glob("run_*_expert_parallel")
    # the main session leaves the EP row out; the EP session is torchrun of pytest under msprof, its cases only
    assert (main_run / "deselect.args").read_text() == f"--deselect={nodeid[(DFC, '2')]}\n"
    import json

    command = json.loads((ep_run / "command.json").read_text())
    ids_file = Path(command[-1].split("=", 1)[1])
    assert command[1:] == [
        f"--output={ep_run}", *MSPROF_OPTIONS, sys.executable, *launch.torchrun_args(), "-m", "pytest", *argv,
        f"--perf-case-ids-file={ids_file}",
    ]  # fmt: skip
    assert ids_file.read_text() == f"{cases[[n for n, _ in cases].index(nodeid[(DFC, '2')])][1].ref.case_id}\n"
    # every rank ran the EP row, in a gloo group of 2; the main session ran Mul alone
    log = sorted((tmp_path / "ranks.log").read_text().splitlines())
    assert log == sorted([
        f"- none passed {nodeid[('Mul', '')]}",
        f"- none passed {nodeid[(DFC, '1')]}",
        f"0 gloo:2 passed {nodeid[(DFC, '2')]}",
        f"1 gloo:2 passed {nodeid[(DFC, '2')]}",
    ])  # fmt: skip

    records = {n: r for n, r in outcome.records.items()}
    assert all(records[nodeid[key]].outcome == "passed" for key in ((DFC, "1"), (DFC, "2"), ("Mul", "")))
    assert records[nodeid[(DFC, "4")]].outcome == "skipped"
    assert records[nodeid[(DFC, "4")]].reason.endswith(
        "EP Size 4 does not fit the expert-parallel launch of this run, --perf-dispatch-ffn-combine-ep-size 2 "
        "(torchrun --nnodes 1 --nproc-per-node 2) = 2 ranks; replay these rows with --perf-dispatch-ffn-combine-ep-size 4"
    )
    assert outcome.failed == 0
    notes = "\n".join(outcome.notes)
    assert "ran 1 case(s) on each of its 2 ranks" in notes and "rows of rank 0's device 0 matched" in notes
    assert "msprof (expert-parallel session, device 0): 14 op_summary rows; 1 case(s) measured, 0 without samples" in notes

    # durations written back once: Mul from the main session, the EP row from rank 0's device only
    write_back(WritebackRequest(db, "all", False, "20251127_120000"), outcome.results, [])
    (ep1, ep2, ep4) = read_db(db / f"{DFC}.csv")
    assert ep1["Average Duration(us)"] == format_number(sum(alone[1 + WARMUP :]) / REPEATS)  # counted as EP Size 1
    assert ep2["Average Duration(us)"] == format_number(sum(rank0[1 + WARMUP :]) / REPEATS)
    assert ep4["Average Duration(us)"] == ""
    assert read_db(db / "Mul.csv")[0]["Average Duration(us)"] == format_number(sum(durations(launches(*MUL)[1 + WARMUP :])) / REPEATS)
