"""pytest hooks, options and fixtures of the collective benchmarks.  Thin: logic lives in plain modules.

Where each hook runs: the *controller* is the pytest process a user started; under torchrun
every *rank* is a pytest process of its own and runs the same collection in the same order.

Selection: collective tests (marked ``comm`` and ``hccl``, the name Ascend users know; both
select them on any backend) run when the ``-m`` expression names ``comm`` or ``hccl`` or when
pytest runs under torchrun; otherwise they are deselected, so a plain ``pytest bench`` replays
compute kernels only.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from perf_plugin.comm.ccl import CclSpec, output_directory, select_ccl
from perf_plugin.comm.launch import RankInfo, check_visible_devices, rank_info, run_torchrun, torchrun_command
from perf_plugin.comm.plan import CommCase, CommPlan, plan_cases
from perf_plugin.comm.record import CommResult
from perf_plugin.comm.runner import FAILED, SKIPPED, CommRunner
from perf_plugin.run.parent_death import die_with_parent
from perf_plugin.comm.settings import CCL_CHOICES, MODES, CommConfigError, CommSettings, build_settings

GROUP_NAME = "perf"
GROUP_DESCRIPTION = "operator performance lab"
MARKERS = ("comm", "hccl")
CASE_FIXTURE = "comm_case"
_MARKER_WORD = re.compile(r"(?<![\w.])(comm|hccl)(?![\w.])")


@dataclass
class CommState:
    """Per-process state of the collective benchmarks, kept in ``config.stash``."""

    active: bool
    info: RankInfo
    settings: CommSettings | None = None
    spec: CclSpec | None = None
    plan: CommPlan | None = None
    output_dir: Path | None = None
    deselected: int = 0
    written: dict[Path, int] = field(default_factory=dict)


STATE = pytest.StashKey[CommState]()


# ----------------------------------------------------------------------------- options
def pytest_addoption(parser: pytest.Parser) -> None:
    """Controller and ranks: the collective options, in the lab's one option group."""
    group = parser.getgroup(GROUP_NAME, GROUP_DESCRIPTION)
    add = group.addoption
    add("--comm-ops", action="append", metavar="OPS",
        help="collectives to measure, comma-separated: all_reduce, all_gather, reduce_scatter, all_to_all (default: all)")
    add("--bytes-grid", action="append", metavar="SIZES",
        help="message sizes per rank, comma-separated, K/M/G = 1024-based, ranges like 1K..1M double "
             "(default 1K..512M; gloo 1K..1M)")
    add("--comm-dtypes", action="append", metavar="DTYPES",
        help="dtypes, comma-separated: bf16, fp16, fp32, int8 (default: bf16)")
    add("--num-devices", action="append", metavar="SIZES",
        help="group sizes, comma-separated; each must divide the world (default: the whole world)")
    add("--grid-shape", metavar="DIMS",
        help="device grid for topology tiers, outermost first: A2 '128 8', A3 '48 8 2' "
             "(default: nodes x ranks-per-node; HCCL: 48 8 2)")
    add("--topology-tier", metavar="TIER",
        help="write this tier instead of deriving it: 0 inter-pod, 1 intra-pod, 2 die-level")
    add("--comm-mode", choices=MODES, default=None,
        help="kernel: device time of the collective's kernels (default); event: launch included")
    add("--comm-warmup", metavar="N", help="untimed calls before the timed ones (default 5)")
    add("--comm-iters", metavar="N", help="timed calls per case (default 20)")
    add("--comm-timeout", metavar="SECONDS", help="process-group timeout; a stuck collective fails after it (default 300)")
    add("--comm-nproc", metavar="N",
        help="re-run this pytest command as N ranks on this node under torchrun (single node)")
    add("--comm-backend", choices=CCL_CHOICES, default=None,
        help="collective library: hccl (NPU), nccl (CUDA), gloo (CPU); default from --backend / the hardware")
    add("--comm-output-dir", metavar="DIR",
        help="write hcom_*.csv here instead of {database root}/{device}/{ccl}/{ccl_version}")
    add("--comm-device", metavar="NAME", help="device directory name (default: --device, else derived)")
    add("--comm-ccl-version", metavar="VERSION",
        help="collective version directory (default: --cann-version for HCCL, NCCL's version, torch's for gloo)")


def _shared_option(config: pytest.Config, dest: str, env: str) -> str | None:
    """An option of the main plugin (``--device``, ``--cann-version`` ...) or its environment variable."""
    value = config.getoption(dest, default=None)
    if value in (None, ""):
        return os.environ.get(env) or None
    return str(value)


def _settings(config: pytest.Config) -> CommSettings:
    get = config.getoption
    return build_settings(
        ops=get("comm_ops"),
        bytes_grid=get("bytes_grid"),
        dtypes=get("comm_dtypes"),
        num_devices=get("num_devices"),
        grid_shape=get("grid_shape"),
        topology_tier=get("topology_tier"),
        mode=get("comm_mode"),
        warmup=get("comm_warmup"),
        iters=get("comm_iters"),
        timeout_s=get("comm_timeout"),
        nproc=get("comm_nproc"),
        ccl=get("comm_backend"),
        output_dir=get("comm_output_dir"),
        device=get("comm_device") or _shared_option(config, "perf_device", "PERF_DEVICE"),
        ccl_version=get("comm_ccl_version"),
        cann_version=_shared_option(config, "perf_cann_version", "PERF_CANN_VERSION"),
        database_root=_shared_option(config, "perf_database_root", "PERF_DATABASE_ROOT"),
    )


def _selected_by_marker(config: pytest.Config) -> bool:
    return bool(_MARKER_WORD.search(config.getoption("markexpr", default="") or ""))


def _uses_xdist(config: pytest.Config) -> bool:
    if hasattr(config, "workerinput"):
        return True
    return config.getoption("numprocesses", default=None) not in (None, 0) or config.getoption(
        "dist", default="no"
    ) not in ("no", None)


def _prepare(config: pytest.Config) -> CommState:
    """Controller and ranks: decide whether collectives run here and plan them (same on every rank)."""
    if STATE in config.stash:
        return config.stash[STATE]
    info = rank_info()
    state = CommState(active=info.launched or _selected_by_marker(config), info=info)
    config.stash[STATE] = state
    try:
        settings = _settings(config)
        state.settings = settings
        if not state.active:
            if settings.nproc is not None:
                raise CommConfigError("--comm-nproc launches the collective benchmarks: select them with -m comm (or -m hccl)")
            return state
        if _uses_xdist(config):
            raise CommConfigError(
                "collective benchmarks run one process per device under torchrun, not pytest-xdist: "
                "use --comm-nproc N (or torchrun) instead of -n"
            )
        world = info.world_size if info.launched else (settings.nproc or 1)
        local_world = info.local_world_size if info.launched else world
        state.spec = select_ccl(settings.ccl, _shared_option(config, "perf_backend", "PERF_BACKEND"))
        state.plan = plan_cases(settings, world, local_world, state.spec.ccl)
        state.output_dir = output_directory(state.spec, settings, config.rootpath, info.local_rank)
    except CommConfigError as exc:
        state.active = False
        raise pytest.UsageError(str(exc)) from None
    return state


# ----------------------------------------------------------------------------- launch
@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """Controller: with --comm-nproc N, re-run this command as N ranks under torchrun."""
    if config.option.help or config.option.version:
        return None
    state = _prepare(config)
    settings = state.settings
    if state.active and state.info.launched and state.info.rank != 0:
        # every rank agrees on every outcome, so rank 0's report says it all: the others stay terse
        config.option.verbose = min(config.option.verbose, -2)
        config.option.tbstyle = "no"
    if not state.active or settings is None or settings.nproc is None or state.info.launched:
        return None
    if config.option.collectonly or config.option.markers or config.option.showfixtures:
        return None
    assert state.spec is not None
    try:
        check_visible_devices(state.spec.visible_devices_var, settings.nproc)
    except CommConfigError as exc:
        raise pytest.UsageError(str(exc)) from None
    command = torchrun_command(settings.nproc, list(config.invocation_params.args))
    sys.stdout.write(f"collectives: launching {settings.nproc} ranks: {' '.join(command)}\n")
    sys.stdout.flush()
    try:
        return run_torchrun(command, config.invocation_params.dir)
    except KeyboardInterrupt:
        sys.stdout.write("collectives: interrupted; the ranks were stopped\n")
        return int(pytest.ExitCode.INTERRUPTED)


# ----------------------------------------------------------------------------- collection
def pytest_configure(config: pytest.Config) -> None:
    """Controller and ranks: register the markers; plan the cases when collectives are selected."""
    config.addinivalue_line("markers", "comm: collective communication benchmark (any backend: HCCL, NCCL, gloo)")
    config.addinivalue_line("markers", "hccl: collective communication benchmark (same tests as 'comm')")
    if _prepare(config).info.launched:
        die_with_parent()  # a rank whose torchrun was killed outright must not hold its port


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    state = config.stash.get(STATE, None)
    if state is None or not state.active or state.plan is None or state.settings is None:
        return None
    s, plan = state.settings, state.plan
    return [
        f"collectives: {plan.ccl}, rank {state.info.rank} of {plan.world_size}, groups {list(plan.group_sizes)}, "
        f"grid {' '.join(map(str, plan.grid))}, mode {s.mode}, {s.warmup} warm-up + {s.iters} timed calls",
        f"collectives: rank 0 writes to {state.output_dir}",
    ]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Controller and ranks: one case per (op, group size, dtype, message size), in plan order."""
    if CASE_FIXTURE not in metafunc.fixturenames:
        return
    state = metafunc.config.stash.get(STATE, None)
    if state is None or not state.active or state.plan is None:
        return  # deselected in pytest_collection_modifyitems
    metafunc.parametrize(
        CASE_FIXTURE,
        [pytest.param(case, id=case.id, marks=[pytest.mark.comm, pytest.mark.hccl]) for case in state.plan.cases],
    )


def _is_collective(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) for name in MARKERS) or CASE_FIXTURE in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Controller and ranks: drop collective tests unless selected by marker or run under torchrun."""
    state = config.stash.get(STATE, None)
    if state is None or state.active:
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        (drop if _is_collective(item) else keep).append(item)
    if drop:
        state.deselected = len(drop)
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def comm_runner(request: pytest.FixtureRequest) -> Iterator[CommRunner]:
    """Each rank: the process groups for the whole session, created at the first collective test."""
    state = request.config.stash[STATE]
    if not state.active or state.plan is None:
        pytest.skip("collective benchmarks are not selected: use -m comm (or -m hccl), or run under torchrun")
    assert state.settings is not None and state.spec is not None and state.output_dir is not None
    runner = CommRunner(state.plan, state.settings, state.spec, state.info, state.output_dir)
    try:
        runner.start()
    except CommConfigError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield runner
    runner.close()


@pytest.fixture
def comm_bench(request: pytest.FixtureRequest, comm_runner: CommRunner) -> Callable[[CommCase], CommResult]:
    """Each rank: ``comm_bench(case)`` measures a case on all ranks; all pass, skip or fail together."""
    state = request.config.stash[STATE]

    def bench(case: CommCase) -> CommResult:
        outcome = comm_runner.run(case)
        if outcome.status == SKIPPED:
            pytest.skip(outcome.reason)
        if outcome.status == FAILED:
            pytest.fail(outcome.reason, pytrace=False)
        assert outcome.result is not None
        if outcome.written_to is not None:
            state.written[outcome.written_to] = state.written.get(outcome.written_to, 0) + 1
        return outcome.result

    return bench


# ----------------------------------------------------------------------------- reporting
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is None:
        return
    if state.deselected:
        terminalreporter.write_line(
            f"collectives: {state.deselected} collective test(s) deselected; select them with -m comm "
            "(or -m hccl), or run under torchrun"
        )
    if state.written:
        terminalreporter.section("collective results")
        for path, rows in sorted(state.written.items()):
            terminalreporter.write_line(f"{rows} row(s) -> {path}")
