"""Run the pytest session under msprof, and collect its cases and profile on the controller.

See ``perf_plugin.profiling.msprof`` for the whole picture and ``perf_plugin.run.msprof_sessions``
for one session's launch.  When the session ends before recording its results (a kernel that
brings its process down: an AI Core exception, a segmentation fault), each kernel type is run
again in a session of its own, the others deselected, so that a kernel type whose session also
ends early costs only its own rows.  Collective rows (DispatchFFNCombine of the launch's EP size)
are left out of those sessions and run in one of their own under torchrun
(``perf_plugin.run.ep_session``); each session's profile is matched to its own cases, and all
results go to one write-back.
"""

from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from perf_plugin.profiling.msprof import MODE_READ, MeasuredCase, MsprofError
from perf_plugin.profiling.msprof_match import as_measured, match_profile
from perf_plugin.results import OUTCOME_FAILED
from perf_plugin.run.ascend_env import custom_opp_message
from perf_plugin.run.ep_session import EpPlan, run_ep_session, split_cases
from perf_plugin.run.msprof_sessions import (
    DESELECT_ARGS,
    MSPROF_OPTIONS,
    Collected,
    ExternalOutcome,
    LaunchOutcome,
    Part,
    Sessions,
    default_output_root,
    ended_early,
    find_prof_dirs,
    msprof_command,
    read_child_report,
    run_under_msprof,
    session_cases,
    write_child_report,
)
from perf_plugin.run.state import CaseRecord

if TYPE_CHECKING:
    from perf_plugin.run.cases import Case

# What callers of this module have always imported from it (the session pieces live in msprof_sessions).
__all__ = [
    "DESELECT_ARGS", "MSPROF_OPTIONS", "ExternalOutcome", "LaunchOutcome", "default_output_root", "external_run",
    "find_prof_dirs", "msprof_command", "run_under_msprof", "write_child_report",
]  # fmt: skip


def external_run(
    mode: str,
    cases: Sequence[tuple[str, "Case"]],
    *,
    repeat_count: int,
    warmup_count: int,
    prof_path: Path | None = None,
    argv: Sequence[str] = (),
    cwd: str | Path = ".",
    output_root: str | Path = "msprof_output",
    environ: Mapping[str, str] | None = None,
    ep: EpPlan | None = None,
) -> ExternalOutcome:
    """The controller's part: launch the sessions under msprof (or read ``prof_path``), match.

    ``cases`` are the collected (node id, case) pairs; ``ep``: how collective rows are launched
    (None: they are not told apart).  Raises MsprofError with one line when nothing can be
    measured; nothing is written by this function.
    """
    from perf_plugin.run.cases import record_of

    outcome = ExternalOutcome()
    if mode == MODE_READ:
        if prof_path is None:
            raise MsprofError("--perf-prof-path is required to read a profile")
        records = {nodeid: record_of(case, "passed" if case.runnable else "skipped") for nodeid, case in cases}
        note = f"msprof: read {prof_path} (no replay ran; each case taken as {repeat_count} repeats)"
        measured = as_measured((case for _, case in cases), repeat_count)
        types = {case.ref.kernel_type for _, case in cases}
        parts = [Part([Path(prof_path)], records, measured, types, group_size=None, notes=[note])]
    else:
        runnable = {case.ref.kernel_type for _, case in cases if case.runnable}
        problem = custom_opp_message(os.environ if environ is None else environ, runnable)
        if problem is not None:
            raise MsprofError(problem)
        parts = _launch(Sessions(argv, cwd, output_root, environ, repeat_count, outcome), cases, ep)
    for part in parts:
        _match_part(outcome, part, repeat_count, warmup_count)
    outcome.failed = sum(1 for r in outcome.records.values() if r.outcome == "failed")
    return outcome


def _launch(sessions: Sessions, cases: Sequence[tuple[str, "Case"]], ep: EpPlan | None) -> list[Part]:
    """The main session (the collective rows left out), then the expert-parallel one."""
    from perf_plugin.run.cases import record_of

    main, collective = split_cases(cases) if ep is not None else (list(cases), [])
    sessions.excluded = [nodeid for nodeid, _ in collective]
    parts: list[Part] = []
    types = {case.ref.kernel_type for _, case in main}
    if any(case.runnable for _, case in main) or not collective:
        prof_dirs, records, measured = _run_session(sessions, main)
        parts.append(Part(prof_dirs, records, measured, types))
    else:  # every row to run is collective: no main session
        parts.append(Part([], {nodeid: record_of(case, "skipped") for nodeid, case in main}, [], types))
    if collective:
        assert ep is not None
        parts.append(run_ep_session(sessions, collective, ep))
    return parts


def _match_part(outcome: ExternalOutcome, part: Part, repeat_count: int, warmup_count: int) -> None:
    """Match one session's profile to its cases; its records and results go into the outcome."""
    outcome.notes.extend(part.notes)
    if not part.prof_dirs:
        outcome.records.update(part.records)
        return
    try:
        match = match_profile(
            part.prof_dirs, part.measured, repeat_count, warmup_count, unmatched_kernel_types=part.kernel_types,
            device=part.device, group_size=part.group_size,
        )  # fmt: skip
    except MsprofError as exc:
        raise MsprofError(f"{exc}; nothing was written") from None
    outcome.notes.extend(match.notes)
    failed_cases = {r.ref.case_id: r.reason for r in match.results if r.outcome == OUTCOME_FAILED}
    for nodeid, record in part.records.items():
        if record.outcome == "passed" and record.ref.case_id in failed_cases:
            record = dataclasses.replace(record, outcome="failed", message=failed_cases[record.ref.case_id])
        outcome.records[nodeid] = record
    outcome.results.extend(match.results)
    measured_count = sum(1 for r in match.results if r.has_duration and not r.ref.case_id.startswith("msprof:"))
    extra = sum(1 for r in match.results if r.ref.case_id.startswith("msprof:"))
    session = f" ({part.label.replace('_', '-')} session, device {part.device})" if part.label else ""
    outcome.notes.append(
        f"msprof{session}: {match.rows} op_summary rows; {measured_count} case(s) measured, "
        f"{len(failed_cases)} without samples, {extra} unmatched kernel signature(s)"
    )


def _run_session(sessions: Sessions, cases: Sequence[tuple[str, "Case"]]) -> Collected:
    """Launch the session under msprof: its profile directories, its case records, and the
    cases it measured in launch order (its results and notes go into the outcome)."""
    launch = sessions.launch()
    report = read_child_report(launch.record_dir)
    if report is None:
        if launch.returncode == 0 or not any(case.runnable for _, case in cases):
            raise MsprofError(ended_early(launch, then="; nothing was written"))
        return _run_each_kernel_type(sessions, cases, launch)
    if not launch.prof_dirs:
        raise MsprofError(f"msprof wrote no PROF_* directory under {launch.output_dir}; nothing was written")
    records, measured = session_cases(report, launch.record_dir, sessions)
    sessions.outcome.notes.append(
        f"msprof: the session ran under msprof (exit code {launch.returncode}); profile "
        f"{', '.join(str(p) for p in launch.prof_dirs)} (re-read it with --perf-prof-path {launch.output_dir})"
    )
    return list(launch.prof_dirs), records, measured


def _run_each_kernel_type(sessions: Sessions, cases: Sequence[tuple[str, "Case"]], whole: LaunchOutcome) -> Collected:
    """The whole session ended before recording: each kernel type with a case to run runs in a
    session of its own.  One that ends early too fails its own cases with the reason; the
    profiles of the others are matched as one (the sessions ran one after another)."""
    from perf_plugin.run.cases import record_of

    by_type: dict[str, list[tuple[str, Case]]] = defaultdict(list)
    for nodeid, case in cases:
        by_type[case.ref.kernel_type].append((nodeid, case))
    prof_dirs: list[Path] = []
    records: dict[str, CaseRecord] = {}
    measured: list[MeasuredCase] = []
    recorded: list[str] = []
    lost: list[str] = []
    for kernel_type, own in sorted(by_type.items()):
        if not any(case.runnable for _, case in own):  # nothing to launch: skipped, as the session would
            records.update((nodeid, record_of(case, "skipped")) for nodeid, case in own)
            continue
        mine = {nodeid for nodeid, _ in own}
        launch = sessions.launch(kernel_type, [nodeid for nodeid, _ in cases if nodeid not in mine])
        report = read_child_report(launch.record_dir)
        if report is None:
            reason = ended_early(launch, f"the session under msprof of {kernel_type} alone")
            for nodeid, case in own:
                record = record_of(case, "failed" if case.runnable else "skipped")
                records[nodeid] = dataclasses.replace(record, message=reason) if case.runnable else record
            lost.append(f"{kernel_type} (exit code {launch.returncode})")
            continue
        own_records, own_measured = session_cases(report, launch.record_dir, sessions)
        records.update(own_records)
        measured.extend(own_measured)
        prof_dirs.extend(launch.prof_dirs)
        recorded.append(kernel_type)
    if not recorded:
        raise MsprofError(
            f"{ended_early(whole)}, and so did the session of each kernel type alone: {', '.join(lost)}; "
            "nothing was written"
        )
    if not prof_dirs:
        raise MsprofError(f"msprof wrote no PROF_* directory for {', '.join(recorded)}; nothing was written")
    sessions.outcome.notes.append(
        f"msprof: {ended_early(whole)}; each kernel type then ran in a session of its own: "
        f"{', '.join(recorded)} recorded"
        + (f"; {', '.join(lost)} ended before recording too, their cases failed" if lost else "")
        + f"; profiles {', '.join(str(p) for p in prof_dirs)}"
    )
    return prof_dirs, records, measured
