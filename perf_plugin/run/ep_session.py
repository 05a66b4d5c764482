"""The expert-parallel session of an NPU run: collective rows under msprof and torchrun.

DispatchFFNCombine rows whose ``EP Size`` is the launch's (``--perf-dispatch-ffn-combine-ep-size``,
``perf_plugin.run.expert_parallel``) cannot run in the main session under msprof: their kernel
talks to ``EP Size`` ranks.  The controller leaves them out of that session and launches one more
for them alone::

    msprof --output=<dir> <options> python -m torch.distributed.run --nnodes N --nproc-per-node P
        --node-rank R --master-addr A --master-port PORT -m pytest <the run's arguments>
        --perf-case-ids-file <their case ids>

(``python -m torch.distributed.run`` is ``torchrun`` with this interpreter), with
``PERF_EP_SESSION=1`` in its environment.  Every rank collects the same cases (they are not
sharded: ``perf_plugin.run.shards``), makes the process group of the row's EP size with the device
backend's collective library and runs every case, the constraint probe checking the row with
that group.  Rank 0 alone records the cases that ran (the session's report and case log, as a
main session does), and the op_summary rows of rank 0's device are matched to them
(``perf_plugin.profiling.msprof_match``, ``device``); rank 0's device is the first the backend's
visible-devices variable lists, else device 0.  Their durations are written back with the main
session's, once.

On a host whose node rank is not 0 the session runs that host's ranks and records nothing: the
host of node rank 0 measures and writes those rows.  None of this has run on an NPU; it is tested
on the CPU with a stand-in msprof, a real torchrun of two ranks and gloo.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from perf_plugin.backends.select import backend_class
from perf_plugin.profiling.msprof import EP_SESSION_ENV
from perf_plugin.run.expert_parallel import EpLaunch
from perf_plugin.run.msprof_sessions import (
    Part,
    Sessions,
    ended_early,
    read_child_report,
    run_under_msprof,
    session_cases,
)

if TYPE_CHECKING:
    from perf_plugin.options import Settings
    from perf_plugin.run.cases import Case
    from perf_plugin.run.state import CaseRecord

SESSION_LABEL = "expert_parallel"
IDS_FILE = "expert_parallel.ids"


@dataclass(frozen=True)
class EpPlan:
    launch: EpLaunch
    rank0_device: str  # the Device_id of rank 0's op_summary rows


def ep_plan(settings: "Settings", backend_name: str, environ: Mapping[str, str] | None = None) -> EpPlan:
    env = os.environ if environ is None else environ
    variable = backend_class(backend_name).visible_devices_var
    visible = [d.strip() for d in env.get(variable or "", "").split(",") if d.strip()]
    return EpPlan(EpLaunch.from_settings(settings), visible[0] if visible else "0")


def split_cases(cases: Sequence[tuple[str, "Case"]]) -> tuple[list[tuple[str, "Case"]], list[tuple[str, "Case"]]]:
    """(the main session's cases, the expert-parallel session's): runnable rows of more than one rank."""
    main = [(nodeid, case) for nodeid, case in cases if not (case.runnable and case.group_size > 1)]
    collective = [(nodeid, case) for nodeid, case in cases if case.runnable and case.group_size > 1]
    return main, collective


def _records(cases: Sequence[tuple[str, "Case"]], outcome: str, message: str) -> dict[str, "CaseRecord"]:
    from perf_plugin.run.cases import record_of

    return {nodeid: dataclasses.replace(record_of(case, outcome), message=message) for nodeid, case in cases}


def run_ep_session(sessions: Sessions, cases: Sequence[tuple[str, "Case"]], plan: EpPlan) -> Part:
    """Launch the expert-parallel session for ``cases``; its part of the run, to be matched."""
    root = Path(sessions.output_root)
    root.mkdir(parents=True, exist_ok=True)
    ids = root / f"{os.getpid()}_{IDS_FILE}"
    ids.write_text("".join(f"{case.ref.case_id}\n" for _, case in cases), encoding="utf-8")
    # one token: pytest finds its rootdir before it knows the plugin's options, and would take a
    # separate path argument for a test path (and name the session's tests from another root)
    launch = run_under_msprof(
        [*sessions.argv, f"--perf-case-ids-file={ids}"], cwd=sessions.cwd, output_root=root,
        environ=sessions.environ, label=SESSION_LABEL, launcher=plan.launch.torchrun_args(),
        extra_env={EP_SESSION_ENV: "1"},
    )  # fmt: skip
    types = {case.ref.kernel_type for _, case in cases}
    what = f"the expert-parallel session under msprof ({plan.launch.describe()})"
    if plan.launch.node_rank != 0:
        message = (f"{what} ran this host's ranks (node rank {plan.launch.node_rank}, exit code {launch.returncode}); "
                   "rank 0, on the host of node rank 0, measures and writes these rows")  # fmt: skip
        return Part([], _records(cases, "skipped", message), [], types, label=SESSION_LABEL, notes=[f"msprof: {message}"])
    report = read_child_report(launch.record_dir)
    if report is None or not launch.prof_dirs:
        reason = ended_early(launch, what) if report is None else f"msprof wrote no PROF_* directory for {what}"
        return Part([], _records(cases, "failed", reason), [], types, label=SESSION_LABEL, notes=[f"msprof: {reason}"])
    records, measured = session_cases(report, launch.record_dir, sessions)
    note = (
        f"msprof: {what} ran {len(cases)} case(s) on each of its {plan.launch.world_size} ranks (exit code "
        f"{launch.returncode}); rows of rank 0's device {plan.rank0_device} matched, profile "
        f"{', '.join(str(p) for p in launch.prof_dirs)}"
    )
    return Part(list(launch.prof_dirs), records, measured, types, plan.launch.ep_size, plan.rank0_device, SESSION_LABEL, [note])
