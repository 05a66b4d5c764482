"""pytest hooks of the operator performance lab.  Thin: the logic lives in plain modules.

Each hook says where it runs: the *controller* is the process pytest was started as; *workers*
are pytest-xdist's worker processes; without xdist the controller also runs the tests.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Iterator

import pytest

from perf_plugin import options
from perf_plugin.candidates import hooks as candidate_hooks
from perf_plugin.database.errors import DatabaseError
from perf_plugin.replay.cache_modes import effective_cache_mode
from perf_plugin.run.benchmark_hooks import BenchmarkBridge
from perf_plugin.run.controller_hooks import (
    CASE_FIXTURE,
    CASE_PROPERTY,
    NOTES_PROPERTY,
    RESULTS_PROPERTY,
    SELECTED_PROPERTY,
    ControllerHooks,
    case_of,
)
from perf_plugin.run.crash_hooks import CrashHooks, isolate_in_worker
from perf_plugin.run.expert_parallel import in_ep_session
from perf_plugin.run.heap import freeze_heap, thaw_heap
from perf_plugin.run.shard_hooks import ShardHooks
from perf_plugin.run.summary_line import count_on_last_line
from perf_plugin.run.location import DeviceIdentity
from perf_plugin.run.progress import ProgressHooks
from perf_plugin.run.report_retention import ReportRelease
from perf_plugin.run.setup import (
    CONFIG_ERROR,
    SETTINGS,
    device_count,
    ensure_run_state,
    header_lines,
    import_torch_outside_capture,
    is_worker,
    may_run_msprof,
    no_local_workers,
    pin_worker_device,
    start_run,
)
from perf_plugin.run.state import RUN_STATE, RunState, TesterState


# ----------------------------------------------------------------------------- options
def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Both: the hooks other plugins implement to extend a run (``perf_plugin.hookspecs``)."""
    from perf_plugin import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Both: one option group, every option also an ini key and an environment variable."""
    options.add_options(parser)


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser) -> Iterator[None]:
    """Both: once the initial conftests added their options, the seed's unprefixed spellings of
    ours where they are free (``--device`` stays a project's own where its conftest defines it)."""
    result = yield
    options.add_free_aliases(parser)
    return result


CRASH_HOOKS = "perf-crashes"
SHARD_HOOKS = "perf-shards"


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Controller: ``--perf-isolate`` runs the cases in one xdist worker, replaced when a case
    takes it down."""
    isolate_in_worker(config)


# ----------------------------------------------------------------------------- configure
def pytest_configure(config: pytest.Config) -> None:
    """Both: markers and settings.  The device is identified (which imports torch) only once a run
    needs it: when a test asks for ``kernel_case`` or xdist starts workers, or now on a machine
    that may run msprof (an NPU), which must decide before xdist starts whether workers run here.
    An unrelated pytest run in a project that has this plugin installed never imports torch."""
    config.addinivalue_line("markers", "kernel_type(name): the database kernel type a replay case comes from")
    _ACTIVE_CONFIGS.append(config)
    config.add_cleanup(lambda: _ACTIVE_CONFIGS.remove(config))
    # Registered now so that it runs after pytest's own end-of-run garbage collections
    # (cleanups run last in, first out), which then skip the frozen heap.
    config.add_cleanup(lambda: thaw_heap(config))
    settings = options.resolve_settings(config)
    config.pluginmanager.register(CrashHooks(config), CRASH_HOOKS)
    config.pluginmanager.register(ShardHooks(config, settings.shard, settings.rank_timeout), SHARD_HOOKS)
    candidate_hooks.register(config, settings)  # --perf-candidate only
    if is_worker(config):
        workerinput = config.workerinput  # type: ignore[attr-defined]
        if "perf_backend" in workerinput:
            identity = DeviceIdentity(
                workerinput["perf_backend"], workerinput["perf_device_name"], workerinput.get("perf_accel_version")
            )
            pin_worker_device(identity, workerinput)
            state = start_run(config, settings, lambda: identity)
            if state is not None:
                from perf_plugin.run.worker_journal import start_worker_journal

                start_worker_journal(config, state, workerinput)
        return
    config.stash[SETTINGS] = settings
    config.pluginmanager.register(ControllerHooks(config), "perf-controller")
    config.pluginmanager.register(ProgressHooks(config, settings.progress_interval), "perf-progress")
    config.pluginmanager.register(BenchmarkBridge(config), "perf-benchmark-bridge")
    config.pluginmanager.register(ReportRelease(config), "perf-report-release")
    if in_ep_session():  # every rank runs every case, in this process: no xdist workers
        no_local_workers(config)
    if may_run_msprof(settings):
        state = ensure_run_state(config)
        from perf_plugin.profiling.msprof import external_mode

        if state is not None and external_mode(settings.prof_path, state.backend_name) and not config.option.collectonly:
            no_local_workers(config)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # type: ignore[no-untyped-def]
    """Controller (xdist): hand the resolved device to each worker."""
    state = ensure_run_state(node.config)
    if state is None:
        return
    _begin_run(node.config)  # before the first worker collects: missing-only sees recovered rows
    node.workerinput["perf_backend"] = state.backend_name
    node.workerinput["perf_device_name"] = state.device_name
    node.workerinput["perf_device_count"] = device_count(state.backend_name)
    from perf_plugin.run.worker_journal import WORKERINPUT_KEY, worker_input

    node.workerinput[WORKERINPUT_KEY] = worker_input(state.control)
    state.control.workers += 1


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Controller: where the run reads and writes, when the device is known by now."""
    return header_lines(config)


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    """Controller: the same lines, once collection identified the device for replay cases."""
    return header_lines(config)


# ----------------------------------------------------------------------------- garbage collection
@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    state = session.config.stash.get(RUN_STATE, None)
    if state is not None and state.case_set is not None and not session.config.option.collectonly:
        freeze_heap(session.config)


# ----------------------------------------------------------------------------- collection
def _begin_run(config: pytest.Config) -> None:
    """Controller, before collection: unfinished runs' journals written back, this run's opened."""
    from perf_plugin.run.recovery import begin_run

    begin_run(config, config.stash[RUN_STATE], ["pytest", *config.invocation_params.args])


def _collection_error(message: str) -> Exception:
    """A database problem found while parametrizing: shown as the collection error's one line.

    pytest prints a collector's ``CollectError`` as its message alone (no traceback unless
    ``--fulltrace``), where a ``UsageError`` raised this late would come with pytest's own stack.
    """
    return pytest.Collector.CollectError(message)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Both: every database row becomes one parametrized case of a test using ``kernel_case``."""
    if CASE_FIXTURE not in metafunc.fixturenames:
        return
    import_torch_outside_capture(metafunc.config)  # an xdist worker's state is there already
    state = ensure_run_state(metafunc.config)
    if state is None:
        reason = metafunc.config.stash.get(CONFIG_ERROR, "no database could be resolved")
        raise _collection_error(f"kernel replay tests cannot run: {reason}")
    from perf_plugin.run.cases import as_params, collect_case_set

    freeze_heap(metafunc.config)
    _begin_run(metafunc.config)
    if state.case_set is None:
        try:
            answers = metafunc.config.hook.pytest_perf_replay_modules(config=metafunc.config)
            case_set = collect_case_set(state, [module for modules in answers for module in modules])
        except DatabaseError as exc:
            raise _collection_error(str(exc)) from None
    else:
        case_set = state.case_set
    params = as_params(case_set)
    if not params:
        # say why, when files were there but none gave a row (not UTF-8, a bad kernel-type name, ...)
        reasons = "".join(f"\n  {message}" for message in case_set.messages)
        raise _collection_error(f"no kernel rows in {state.location.directory}{reasons}")
    metafunc.parametrize(CASE_FIXTURE, params)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Process that runs tests: a run of replay cases only skips pytest's per-test log capture."""
    config = session.config
    state = config.stash.get(RUN_STATE, None)
    if state is None or config.option.collectonly:
        return
    if is_worker(config):  # the controller counts what is left of the selection if interrupted
        state.unsent_selection = sum(case_of(item) is not None for item in session.items)
    from perf_plugin.run.log_capture import skip_log_capture

    if skip_log_capture(config, session.items, lambda item: case_of(item) is not None, state.settings.replay_log_capture):
        note = "pytest's per-test log capture was off (replay cases only; --perf-replay-log-capture on keeps it)"
        state.notes.append(note)
        if is_worker(config):
            state.unsent_notes.append(note)


# ----------------------------------------------------------------------------- running
# The configs of the pytest runs in progress in this process, innermost last (pytester runs one
# inside another's test).  ``perf_runner`` reads its config here rather than asking for
# ``pytestconfig`` or ``request``: either puts ``request`` in the closure of every replay test,
# and pytest builds a new fixture definition for ``request`` in each test (inspecting a
# function's signature among other things: ~0.07 ms per test on a 2-core host, a third of what
# the plugin adds per case).  A fixture bound to a plugin object would avoid it too, but pytest
# deprecates session-scoped fixtures on instances.
_ACTIVE_CONFIGS: list[pytest.Config] = []


@pytest.fixture(scope="session")
def perf_runner():  # type: ignore[no-untyped-def]
    """Process that runs tests: the backend, collector and runner, created once."""
    from perf_plugin.backends.select import resolve_backend
    from perf_plugin.profiling.factory import make_collector
    from perf_plugin.run.executor import CaseExecutor
    from perf_plugin.run.expert_parallel import ExpertGroups
    from perf_plugin.run.runner import ReplayRunner
    from perf_plugin.run.shards import local_device_index

    config = _ACTIVE_CONFIGS[-1]
    state = config.stash[RUN_STATE]
    settings = state.settings
    backend = resolve_backend(state.backend_name, local_device_index(), ascend_device=settings.device)
    if backend.index:
        backend.bind()  # a torchrun rank's own device becomes the current one (markers launch there)
    custom = config.hook.pytest_perf_make_collector(backend=backend, settings=settings)
    collector = custom if custom is not None else make_collector(backend, settings)
    collector, judge = candidate_hooks.attach_judge(config, backend, collector)
    state.tester = TesterState(backend, collector)
    groups = None
    if in_ep_session():  # a rank of the expert-parallel session: its collective rows' process groups
        groups = ExpertGroups(backend)
        config.add_cleanup(groups.close)
    runner = ReplayRunner(
        backend,
        collector,
        settings.repeat_count,
        settings.warmup_count,
        seed=settings.seed,
        cache_mode=effective_cache_mode(settings.cache_mode, backend.name),
        produced_from_us=backend.auto_produced_from_us if settings.cache_mode == "auto" else None,
        rotate_max_copies=settings.rotate_max_copies,
        input_placements=settings.input_placements,
        candidate_judge=judge,
        groups=groups,
    )
    return CaseExecutor(state.tester, runner)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Process that runs tests: attach the case and finished results to the teardown report."""
    report = yield
    case = case_of(item)
    state = item.config.stash.get(RUN_STATE, None)
    if case is None or state is None or call.when != "teardown":
        return report
    from perf_plugin.run.cases import record_of

    report.user_properties.append((CASE_PROPERTY, record_of(case).to_json()))
    tester = state.tester
    if tester is not None and not tester.heap_refrozen:
        tester.heap_refrozen = True
        freeze_heap(item.config)
    finished = tester.take_finished() if tester is not None else []
    if finished and state.worker_journal is not None:
        state.worker_journal.append(finished)  # on disk before it travels: an interrupt may drop the report
    if finished:
        report.user_properties.append((RESULTS_PROPERTY, [r.to_json() for r in finished]))
    if state.unsent_selection is not None and is_worker(item.config):
        report.user_properties.append((SELECTED_PROPERTY, state.unsent_selection))
        state.unsent_selection = None
    if state.unsent_notes and is_worker(item.config):
        report.user_properties.append((NOTES_PROPERTY, list(state.unsent_notes)))
        state.unsent_notes.clear()
    return report


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Both: flush the collector; controller: write back, write reports, apply the coverage gate."""
    state = session.config.stash.get(RUN_STATE, None)
    if state is None:
        return
    from perf_plugin.run.interrupt import one_interrupt_absorbed

    with one_interrupt_absorbed():  # Ctrl-C then torchrun's SIGTERM: the second must not cut the flush
        _finish_session(session, exitstatus, state)


def _finish_session(session: pytest.Session, exitstatus: int, state: RunState) -> None:
    config = session.config
    remaining = state.tester.take_remaining() if state.tester is not None else []
    if is_worker(config):
        if state.worker_journal is not None:
            state.worker_journal.append(remaining)
        config.workeroutput[RESULTS_PROPERTY] = json.dumps([r.to_json() for r in remaining])  # type: ignore[attr-defined]
        return
    state.control.add_results(remaining)
    from perf_plugin.run.worker_journal import absorb_worker_journals

    recovered, lines = absorb_worker_journals(state.control)  # what an interrupt kept from reaching us
    state.notes.extend(lines)
    if recovered:
        state.notes.append(f"{recovered} measured result(s) taken from the workers' journals (their reports never came)")
    from perf_plugin.profiling.msprof import is_msprof_child
    from perf_plugin.run.msprof_sessions import write_child_report

    if is_msprof_child():  # the session under msprof: its parent reads op_summary and writes back
        write_child_report(state)
        return
    from perf_plugin.run.controller import finish_run

    shards = config.pluginmanager.get_plugin(SHARD_HOOKS)
    if shards is not None and not shards.writes_here(state):  # a torchrun rank other than 0
        from perf_plugin.run.recovery import settle_journal

        # once rank 0 journaled them, this rank's journal would only write them a second time
        state.notes.extend(settle_journal(state.control, written=shards.delivered))
        state.notes.extend(shards.failures)
        if shards.delivered:
            state.notes.append("this rank's results went to rank 0, which writes the database and the reports")
        else:
            _fail(session)
        return
    if shards is not None:  # rank 0: ranks whose results never came
        state.notes.extend(shards.failures)
    command = ["pytest", *config.invocation_params.args]
    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED
    outcome = finish_run(state, collect_only=bool(config.option.collectonly), command=command, interrupted=interrupted)
    state.notes.extend(outcome.lines)
    if outcome.interrupted is not None:  # pytest's last line says it too
        count_on_last_line(config, "measured", outcome.interrupted.measured)
        if not state.settings.no_writeback:
            count_on_last_line(config, "written", outcome.interrupted.written)
        count_on_last_line(config, "left for missing-only", outcome.interrupted.left)
    crashes = config.pluginmanager.get_plugin(CRASH_HOOKS)
    if crashes is not None:
        crashes.rerun_lost(session)  # after write-back: the re-run session writes its own rows
    if outcome.summary is not None:
        config.hook.pytest_perf_run_finished(config=config, summary=outcome.summary, notes=state.notes)
    if outcome.coverage_failed:
        # a reader of the closing line alone ("100 passed") would not see why the run failed
        count_on_last_line(config, "coverage gate failed", 1)
    if outcome.coverage_failed or outcome.writeback_failed or (shards is not None and shards.failures):
        _fail(session)


def _fail(session: pytest.Session) -> None:
    """The run failed (a gate, write-back, a rank's results lost); an interrupted run stays one."""
    if session.exitstatus != pytest.ExitCode.INTERRUPTED:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # type: ignore[no-untyped-def]
    """Controller: what was written where, and the coverage table when the gate failed."""
    state = config.stash.get(RUN_STATE, None)
    if state is None or state.controller is None or not (state.controller.records or state.controller.results):
        return
    terminalreporter.section("perf")
    terminalreporter.write_line(f"database: {state.location.directory}")
    for line in state.notes:
        terminalreporter.write_line(line)
