"""pytest hooks of the operator performance lab.  Thin: the logic lives in plain modules.

Each hook says where it runs: the *controller* is the process pytest was started as; *workers*
are pytest-xdist's worker processes; without xdist the controller also runs the tests.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import json
import os
from collections.abc import Callable, Iterator

import pytest

from perf_plugin import options
from perf_plugin.database.errors import DatabaseError
from perf_plugin.location import DeviceIdentity, describe_location, resolve_location, seed_from_sample
from perf_plugin.replay.cache_modes import effective_cache_mode
from perf_plugin.results import CaseResult
from perf_plugin.session import RUN_STATE, CaseRecord, RunState

CASE_FIXTURE = "kernel_case"
RESULTS_PROPERTY = "perf_results"
CASE_PROPERTY = "perf_case"
NOTES_PROPERTY = "perf_notes"
TRANSPORT_PROPERTIES = frozenset({RESULTS_PROPERTY, NOTES_PROPERTY})  # carried by reports, not about them


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


CONFIG_ERROR = pytest.StashKey[str]()
SETTINGS = pytest.StashKey[options.Settings]()
HEAP_FROZEN = pytest.StashKey[bool]()


# ----------------------------------------------------------------------------- options
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


# ----------------------------------------------------------------------------- configure
def _identify_device(settings: options.Settings) -> DeviceIdentity:
    from perf_plugin.backends.select import resolve_backend

    backend = resolve_backend(settings.backend, ascend_device=settings.device)
    version = backend.accelerator_version()
    return DeviceIdentity(backend.name, backend.device_name(), version[1] if version else None)


def _pin_worker_device(identity: DeviceIdentity, workerinput: dict) -> None:
    """Worker: one device per worker, chosen before the device runtime initialises."""
    variable = {"cuda": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}.get(identity.backend)
    count = int(workerinput.get("perf_device_count", 0))
    if variable is None or count < 2:
        return
    worker = int(str(workerinput.get("workerid", "gw0")).lstrip("gw") or 0)
    visible = [d for d in os.environ.get(variable, "").split(",") if d.strip()] or [str(i) for i in range(count)]
    os.environ[variable] = visible[worker % len(visible)]


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
    config.add_cleanup(lambda: _thaw_heap(config))
    settings = options.resolve_settings(config)
    if _is_worker(config):
        workerinput = config.workerinput  # type: ignore[attr-defined]
        if "perf_backend" in workerinput:
            identity = DeviceIdentity(
                workerinput["perf_backend"], workerinput["perf_device_name"], workerinput.get("perf_accel_version")
            )
            _pin_worker_device(identity, workerinput)
            _start_run(config, settings, lambda: identity)
        return
    config.stash[SETTINGS] = settings
    config.pluginmanager.register(ControllerHooks(config), "perf-controller")
    if _may_run_msprof(settings):
        state = ensure_run_state(config)
        from perf_plugin.profiling.msprof import external_mode

        if state is not None and external_mode(settings.prof_path, state.backend_name) and not config.option.collectonly:
            _no_local_workers(config)


def _may_run_msprof(settings: options.Settings) -> bool:
    if settings.prof_path or settings.backend == "npu":
        return True
    return settings.backend == "auto" and importlib.util.find_spec("torch_npu") is not None


def ensure_run_state(config: pytest.Config) -> RunState | None:
    """Controller: the run state, identifying the device on first use (None: it cannot be
    resolved; the reason is kept and raised only if a replay test is collected)."""
    state = config.stash.get(RUN_STATE, None)
    if state is not None or CONFIG_ERROR in config.stash or SETTINGS not in config.stash:
        return state
    settings = config.stash[SETTINGS]
    return _start_run(config, settings, lambda: _identify_device(settings))


def _start_run(
    config: pytest.Config, settings: options.Settings, identify: Callable[[], DeviceIdentity]
) -> RunState | None:
    try:
        identity = identify()
        location = resolve_location(settings, identity)
    except (DatabaseError, RuntimeError, ValueError) as exc:
        # Raised later, and only if a replay test is collected: unrelated runs must not fail.
        config.stash[CONFIG_ERROR] = str(exc)
        return None
    state = RunState(settings, location, identity.backend, identity.device_name)
    config.stash[RUN_STATE] = state
    return state


def _no_local_workers(config: pytest.Config) -> None:
    """Controller, msprof or --perf-prof-path: xdist workers belong to the session under msprof."""
    config.option.dist = "no"
    config.option.tx = []
    if config.pluginmanager.has_plugin("dsession"):  # xdist configured before this plugin
        config.pluginmanager.unregister(name="dsession")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # type: ignore[no-untyped-def]
    """Controller (xdist): hand the resolved device to each worker."""
    state = ensure_run_state(node.config)
    if state is None:
        return
    node.workerinput["perf_backend"] = state.backend_name
    node.workerinput["perf_device_name"] = state.device_name
    node.workerinput["perf_device_count"] = _device_count(state.backend_name)
    state.workers += 1


def _device_count(backend: str) -> int:
    if backend == "cuda":
        import torch

        return torch.cuda.device_count()
    if backend == "npu":
        import torch

        return int(torch.npu.device_count())  # type: ignore[attr-defined]
    return 0


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Controller: where the run reads and writes, when the device is known by now."""
    return _header_lines(config)


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    """Controller: the same lines, once collection identified the device for replay cases."""
    return _header_lines(config)


def _header_lines(config: pytest.Config) -> list[str]:
    state = config.stash.get(RUN_STATE, None)
    if state is None or state.header_shown:
        return []
    state.header_shown = True
    lines = [
        f"perf: backend {state.backend_name} ({state.device_name}), "
        f"{state.settings.repeat_count} repeats after {state.settings.warmup_count} warm-up, "
        f"{effective_cache_mode(state.settings.cache_mode, state.backend_name)} cache",
        f"perf: database {describe_location(state.location)}",
    ]
    return lines + [f"perf: {note}" for note in state.notes]


# ----------------------------------------------------------------------------- garbage collection
def _freeze_heap(config: pytest.Config) -> None:
    """Exempt every object alive now from the cyclic garbage collector (``gc.freeze``).

    A replay run's heap is mostly torch, pytest and plugins: a few hundred thousand long-lived
    objects that each full collection walks again (~0.1 s each), and pytest allocates enough
    per test (items, reports) to trigger one every few hundred cases.  Frozen objects are still
    freed by reference counting; cyclic garbage among them waits until the heap is thawed at
    the end of the run.  Called at collection, at the start of the loop and after the first
    replay (which imports the rest of torch on the first profiler start).
    """
    gc.freeze()
    config.stash[HEAP_FROZEN] = True


def _thaw_heap(config: pytest.Config) -> None:
    if config.stash.get(HEAP_FROZEN, False):
        gc.unfreeze()
        config.stash[HEAP_FROZEN] = False


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    state = session.config.stash.get(RUN_STATE, None)
    if state is not None and state.case_set is not None and not session.config.option.collectonly:
        _freeze_heap(session.config)


# ----------------------------------------------------------------------------- collection
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
    state = ensure_run_state(metafunc.config)
    if state is None:
        reason = metafunc.config.stash.get(CONFIG_ERROR, "no database could be resolved")
        raise _collection_error(f"kernel replay tests cannot run: {reason}")
    from perf_plugin.cases import as_params, load_case_set
    from perf_plugin.replay.op_mapping import replay_lookup_for
    from perf_plugin.replay.registry import CatalogError, refresh_catalog

    _freeze_heap(metafunc.config)
    if state.case_set is None:
        # Seeding happens here, not at configure time, so that runs which collect no replay test
        # (the project's own tests, collective-only runs) never create database directories.
        # It is idempotent under the database lock, so xdist workers may race for it.
        try:
            seeded = seed_from_sample(state.location, state.settings.database_root, state.settings.lock_timeout)
        except DatabaseError as exc:
            raise _collection_error(str(exc)) from None
        if seeded:
            state.notes.append(seeded)
            state.unsent_notes.append(seeded)
        try:
            kernels = refresh_catalog()  # the replays installed now, entry points included
            lookup, replay_type = replay_lookup_for(state.location.directory, kernels)
        except (DatabaseError, CatalogError) as exc:
            raise _collection_error(str(exc)) from None
        from perf_plugin.backends.select import backend_class

        state.case_set = load_case_set(
            state.location.directory,
            lookup,
            state.settings.update_mode,
            replay_type=replay_type,
            named_apis=backend_class(state.backend_name).launches_named_apis,
        )
        state.notes.extend(state.case_set.messages)
    params = as_params(state.case_set)
    if not params:
        # say why, when files were there but none gave a row (not UTF-8, a bad kernel-type name, ...)
        reasons = "".join(f"\n  {message}" for message in state.case_set.messages)
        raise _collection_error(f"no kernel rows in {state.location.directory}{reasons}")
    metafunc.parametrize(CASE_FIXTURE, params)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Process that runs tests: a run of replay cases only skips pytest's per-test log capture."""
    config = session.config
    state = config.stash.get(RUN_STATE, None)
    if state is None or config.option.collectonly:
        return
    from perf_plugin.log_capture import skip_log_capture

    if skip_log_capture(config, session.items, lambda item: _case_of(item) is not None, state.settings.replay_log_capture):
        note = "pytest's per-test log capture was off (replay cases only; --perf-replay-log-capture on keeps it)"
        state.notes.append(note)
        if _is_worker(config):
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
    from perf_plugin.executor import CaseExecutor
    from perf_plugin.profiling.factory import make_collector
    from perf_plugin.replay.runner import ReplayRunner

    state = _ACTIVE_CONFIGS[-1].stash[RUN_STATE]
    settings = state.settings
    state.backend = resolve_backend(state.backend_name, ascend_device=settings.device)
    state.collector = make_collector(state.backend, settings)
    runner = ReplayRunner(
        state.backend,
        state.collector,
        settings.repeat_count,
        settings.warmup_count,
        seed=settings.seed,
        cache_mode=effective_cache_mode(settings.cache_mode, state.backend.name),
        rotate_max_copies=settings.rotate_max_copies,
    )
    return CaseExecutor(state, runner)


def _case_of(item: pytest.Item):  # type: ignore[no-untyped-def]
    callspec = getattr(item, "callspec", None)
    return callspec.params.get(CASE_FIXTURE) if callspec is not None else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Process that runs tests: attach the case and finished results to the teardown report."""
    report = yield
    case = _case_of(item)
    state = item.config.stash.get(RUN_STATE, None)
    if case is None or state is None or call.when != "teardown":
        return report
    from perf_plugin.cases import record_of

    report.user_properties.append((CASE_PROPERTY, record_of(case).to_json()))
    if state.collector is not None and not state.heap_refrozen:
        state.heap_refrozen = True
        _freeze_heap(item.config)
    finished = list(state.outbox)
    state.outbox.clear()
    if state.collector is not None:
        finished.extend(state.collector.drain())
    if finished:
        report.user_properties.append((RESULTS_PROPERTY, [r.to_json() for r in finished]))
    if state.unsent_notes and _is_worker(item.config):
        report.user_properties.append((NOTES_PROPERTY, list(state.unsent_notes)))
        state.unsent_notes.clear()
    return report


class ControllerHooks:
    """Controller only (registered in pytest_configure): gathers cases, outcomes and results."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.outcomes: dict[str, str] = {}

    @property
    def state(self) -> RunState | None:
        """The run's state once the device was identified (None in a run of no replay case)."""
        return self.config.stash.get(RUN_STATE, None)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Every report, local or from a worker: outcome, case record, finished results.

        Runs first so that the results and notes, which ride on whichever report was next when
        they were ready (often another case's), are taken off the report before other plugins
        (junitxml, reporters) see them as that test's properties, and are not kept alive with
        the report for the rest of the run.
        """
        state = self.state
        if state is None:
            return
        properties = dict(report.user_properties) if report.user_properties else {}
        if RESULTS_PROPERTY in properties or NOTES_PROPERTY in properties:
            report.user_properties[:] = [p for p in report.user_properties if p[0] not in TRANSPORT_PROPERTIES]
        if report.when in ("setup", "call") and self.outcomes.get(report.nodeid) != "failed":
            if report.failed or report.skipped or report.when == "call":
                self.outcomes[report.nodeid] = "skipped" if report.skipped else report.outcome
        if CASE_PROPERTY in properties and report.nodeid not in state.records:
            outcome = self.outcomes.get(report.nodeid, report.outcome)
            if report.failed:
                outcome = "failed"
            record = CaseRecord.from_json(properties[CASE_PROPERTY])
            state.records[report.nodeid] = dataclasses.replace(record, outcome=outcome)
        for data in properties.get(RESULTS_PROPERTY, []):
            _add_result(state, CaseResult.from_json(data))
        for note in properties.get(NOTES_PROPERTY, []):
            if note not in state.notes:
                state.notes.append(note)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        """NPU (msprof) or --perf-prof-path: no test runs here; the replays run in a session under
        msprof (or ran already), and their op_summary rows become the results."""
        from perf_plugin.profiling import msprof, msprof_launch

        state, config = self.state, session.config
        if state is None:
            return None
        mode = msprof.external_mode(state.settings.prof_path, state.backend_name)
        if mode is None or config.option.collectonly or session.testsfailed:
            return None  # pytest's own loop (it stops on collection errors)
        cache_mode = effective_cache_mode(state.settings.cache_mode, state.backend_name)
        if cache_mode != "warm" and mode == msprof.MODE_LAUNCH:
            # the flush and the input copies launch kernels of their own, which op_summary
            # would count among the case's launches
            raise pytest.UsageError(f"--perf-cache-mode {cache_mode} is not available under msprof; use warm")
        cases = [(item.nodeid, case) for item in session.items if (case := _case_of(item)) is not None]
        try:
            outcome = msprof_launch.external_run(
                mode,
                cases,
                repeat_count=state.settings.repeat_count,
                warmup_count=state.settings.warmup_count,
                prof_path=state.settings.prof_path,
                argv=config.invocation_params.args,
                cwd=config.invocation_params.dir,
                output_root=msprof_launch.default_output_root(config.rootpath),
            )
        except msprof.MsprofError as exc:
            raise pytest.UsageError(str(exc)) from None
        state.records.update(outcome.records)
        for result in outcome.results:
            _add_result(state, result)
        state.workers = max(state.workers, outcome.workers)
        state.notes.extend(outcome.notes)
        session.testsfailed = outcome.failed
        return True

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:  # type: ignore[no-untyped-def]
        """xdist: results a worker finished after its last report."""
        payload = getattr(node, "workeroutput", {}).get(RESULTS_PROPERTY)
        state = self.state
        for data in json.loads(payload) if payload and state is not None else []:
            _add_result(state, CaseResult.from_json(data))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """With --collect-only the selected cases are the records (nothing runs)."""
        state = self.state
        if not session.config.option.collectonly or state is None:
            return
        for item in session.items:
            case = _case_of(item)
            if case is not None:
                from perf_plugin.cases import record_of

                state.records[item.nodeid] = record_of(case)


def _add_result(state: RunState, result: CaseResult) -> None:
    previous = state.results.get(result.ref.case_id)
    if previous is not None and previous.outcome == "failed" and not result.has_duration:
        return
    state.results[result.ref.case_id] = result


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Both: flush the collector; controller: write back, write reports, apply the coverage gate."""
    config = session.config
    state = config.stash.get(RUN_STATE, None)
    if state is None:
        return
    remaining = list(state.outbox)
    state.outbox.clear()
    if state.collector is not None:
        remaining.extend(state.collector.finish())
    if _is_worker(config):
        config.workeroutput[RESULTS_PROPERTY] = json.dumps([r.to_json() for r in remaining])  # type: ignore[attr-defined]
        return
    for result in remaining:
        _add_result(state, result)
    from perf_plugin.profiling.msprof import is_msprof_child
    from perf_plugin.profiling.msprof_launch import write_child_report

    if is_msprof_child():  # the session under msprof: its parent reads op_summary and writes back
        write_child_report(state)
        return
    from perf_plugin.controller import finish_run

    command = ["pytest", *config.invocation_params.args]
    outcome = finish_run(state, collect_only=bool(config.option.collectonly), command=command)
    state.notes.extend(outcome.lines)
    if outcome.coverage_failed or outcome.writeback_failed:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # type: ignore[no-untyped-def]
    """Controller: what was written where, and the coverage table when the gate failed."""
    state = config.stash.get(RUN_STATE, None)
    if state is None or _is_worker(config) or not state.records:
        return
    terminalreporter.section("perf")
    terminalreporter.write_line(f"database: {state.location.directory}")
    for line in state.notes:
        terminalreporter.write_line(line)
