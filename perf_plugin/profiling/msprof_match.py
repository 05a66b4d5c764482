"""Match msprof ``op_summary`` rows to the replay cases that launched them.

Which op_summary rows become a case's samples
---------------------------------------------
Rows are grouped by (kernel family, signature, device).  The family is the ``OP Type`` itself,
unless its replay declares one (``OpReplay.family``): ``MatMulV2``, ``MatMulV3`` and
``MatMulCommon`` are the family ``MatMul``, all three launched by ``torch.mm``, which one the
device runs being the library's choice.  The signature is the database's (the kernel catalog's
``signature_of``), so a row matches exactly the database rows write-back would update.  Communication rows (``hcom_*``) never match.  Within a group the rows
are ordered by ``Task Start Time(us)``: each row is one launch.

A case runs its op ``1`` (verification) ``+ warmup + repeats`` times, one after another, so the
launches of one signature on one device form one block of that length per case.  Of each block
the first ``1 + warmup`` launches are dropped (the verification run and the warm-up: cold
instruction and data caches, first-launch set-up) and the last ``repeats`` are kept: those are
the case's steady-state samples, ``Task Duration(us)`` each.  Blocks are cut like this:

* when all launches of the signature come from one device and their count is exactly the sum
  of the block lengths of the cases of that signature (the normal case), the blocks are cut in
  launch order, each with its case's own recorded repeat count;
* otherwise (several devices, whose cases cannot be told apart; launches of the same signature
  from outside the timed cases, such as building another case's inputs; a case that failed after
  its verification run; samples msprof dropped) each device's launches are cut into blocks of the
  nominal length ``1 + warmup + repeat_count`` from the *end* (a case's own extra launches, from
  building its inputs, come before its verification run and so fall into a dropped head), the
  latest blocks are kept, and a note says so.  A device with fewer launches than one block gives
  one short block: its first ``1 + warmup`` launches are still dropped.

Blocks are handed to the cases of that (family, signature) in launch order (cases that share a
signature are the same kernel, so the order among them changes no value); a case left without a
block, or whose block has no launch after the warm-up, becomes a failed result with the reason.  A case's counters
(``aicore_time(us)`` ...) are the means over its kept rows, written back as ``MicroBench
<counter>``.  When the reported ``OP Type`` differs from the case's kernel type (a ``MatMulV2``
row measured as ``MatMulV3``), ``reported_kernel_type`` sends the measurement to the reported
type's CSV, and the identity cells of the measured kernel let update mode ``all`` append the row
there if it is missing.

Rows of a (family, signature) that no case produced are returned as results of their own, with
*all* their launches as samples (nothing says which were warm-up) and the identity cells of the
kernel: update mode ``all`` appends them, ``missing-only`` reports them as unmatched.  The plugin
limits these to the families of the selected cases, so kernels the harness itself launches
(random input generation, casts that build inputs) do not create new database files.
"""


from __future__ import annotations

import csv
import dataclasses
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perf_plugin.backends.npu import NpuBackend
from perf_plugin.database.row_ids import make_case_id
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.kernel_types import validate_kernel_type
from perf_plugin.database.schema import IDENTITY_COLUMNS
from perf_plugin.database.signature import signature_text
from perf_plugin.ingest.records import ProfiledKernel, read_prof_directory
from perf_plugin.results import OUTCOME_FAILED, OUTCOME_PASSED, CaseRef, CaseResult, CollectedCase, KernelTime

from perf_plugin.profiling.msprof import MeasuredCase, MsprofError
from perf_plugin.replay.registry import catalog, get_replay


def kernel_family(kernel_type: str) -> str:
    """The family of a kernel type (``OpReplay.family``; a type without one is its own)."""
    return catalog().family(kernel_type)


@dataclass
class ProfileMatch:
    results: list[CaseResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rows: int = 0  # compute-kernel rows read


@dataclass
class _Group:
    """The launches of one (family, signature), per device, in start-time order."""

    by_device: dict[str, list[ProfiledKernel]] = field(default_factory=dict)

    @property
    def launches(self) -> int:
        return sum(len(rows) for rows in self.by_device.values())

    def all_rows(self) -> list[ProfiledKernel]:
        return [row for rows in self.by_device.values() for row in rows]


def _prof_paths(prof: str | Path | Sequence[str | Path]) -> list[Path]:
    if isinstance(prof, (str, Path)):
        return [Path(prof)]
    return [Path(p) for p in prof]


def _device_ids(sources: Iterable[Path]) -> dict[tuple[Path, int], str]:
    """``Device_id`` of every record line, for the files that have that column."""
    devices: dict[tuple[Path, int], str] = {}
    for source in sources:
        with source.open("r", encoding="utf-8-sig", newline="") as handle:
            reader = csv.reader(handle)
            header = [name.strip() for name in next(reader, [])]
            if "Device_id" not in header:
                continue
            index = header.index("Device_id")
            for cells in reader:
                if index < len(cells):
                    devices[(source, reader.line_num)] = cells[index].strip()
    return devices


def _on_device(kernel: ProfiledKernel, devices: Mapping[tuple[Path, int], str], device: str) -> bool:
    """Whether a row is ``device``'s: its ``Device_id`` cell, else the ``device_<id>`` directory
    its file is in; a row that says neither is kept (nothing tells it apart)."""
    known = devices.get((kernel.source, kernel.line)) if kernel.source is not None and kernel.line else None
    if known is not None:
        return known == device
    folders = [part for part in kernel.source.parts if part.startswith("device_")] if kernel.source else []
    return not folders or folders[-1] == f"device_{device}"


def _in_group(kernels: list[ProfiledKernel], group_size: int) -> list[ProfiledKernel]:
    """The kernels with the column that says how many ranks a collective kernel spanned
    (``OpReplay.group_column``: DispatchFFNCombine's ``EP Size``) filled in: op_summary has no
    such column, and the session's process group is what says it."""
    columns: dict[str, str] = {}
    out = []
    for kernel in kernels:
        if kernel.kernel_type not in columns:
            replay = get_replay(kernel.kernel_type)
            columns[kernel.kernel_type] = replay.group_column if replay is not None else ""
        column = columns[kernel.kernel_type]
        if column and not kernel.cells.get(column, "").strip():
            kernel = dataclasses.replace(kernel, cells={**kernel.cells, column: str(group_size)})
        out.append(kernel)
    return out


def _read_groups(
    prof_paths: list[Path], device: str | None = None, group_size: int | None = None
) -> tuple[dict[tuple[str, str], _Group], int]:
    kernels: list[ProfiledKernel] = []
    for path in prof_paths:
        try:
            kernels.extend(read_prof_directory(path))
        except DatabaseError as exc:
            raise MsprofError(exc.describe()) from None
    devices = _device_ids({k.source for k in kernels if k.source is not None})
    if device is not None:  # one rank's launches of a collective session: the other ranks ran the same
        kernels = [kernel for kernel in kernels if _on_device(kernel, devices, device)]
    if group_size is not None:
        kernels = _in_group(kernels, group_size)
    groups: dict[tuple[str, str], _Group] = defaultdict(_Group)
    # A replay session launches a few kernels many times: one signature per distinct kernel.
    keys: dict[tuple[str, tuple[str, ...]], tuple[str, str]] = {}
    for kernel in kernels:
        if kernel.duration_us is None:
            continue
        cells = (kernel.kernel_type, tuple(kernel.cells.values()))
        key = keys.get(cells)
        if key is None:
            key = keys[cells] = (kernel_family(kernel.kernel_type), signature_text(kernel.signature()))
        device = devices.get((kernel.source, kernel.line), "") if kernel.source and kernel.line else ""
        groups[key].by_device.setdefault(device, []).append(kernel)
    infinity = float("inf")
    for group in groups.values():
        for rows in group.by_device.values():
            rows.sort(key=lambda k: (k.start_us if k.start_us is not None else infinity, str(k.source), k.line or 0))
    return dict(groups), len(kernels)


def _blocks(
    group: _Group, cases: list[MeasuredCase], warmup_count: int, repeat_count: int, notes: list[str], what: str
) -> list[list[ProfiledKernel]]:
    """One block of launches per case, in launch order (see the module docstring)."""
    if len(group.by_device) == 1:
        (rows,) = group.by_device.values()
        if len(rows) == sum(1 + warmup_count + c.repeats for c in cases):
            blocks, start = [], 0
            for case in cases:
                size = 1 + warmup_count + case.repeats
                blocks.append(rows[start : start + size])
                start += size
            return blocks
    nominal = 1 + warmup_count + repeat_count
    blocks = []
    for rows in group.by_device.values():
        count = len(rows) // nominal
        if count == 0:
            blocks.append(rows)  # fewer launches than one case makes: keep what there is
            continue
        head = len(rows) - count * nominal
        blocks.extend(rows[head + i * nominal : head + (i + 1) * nominal] for i in range(count))
    expected = sum(1 + warmup_count + c.repeats for c in cases)
    notes.append(
        f"msprof: {what}: {group.launches} launches where {len(cases)} case(s) make {expected}; "
        f"blocks of {nominal} cut from the end of each device's launches"
    )
    blocks.sort(key=lambda block: (block[0].start_us or 0.0) if block else 0.0)
    return blocks[-len(cases):] if len(blocks) > len(cases) else blocks


def _most_common(values: Iterable[str]) -> str:
    return Counter(values).most_common(1)[0][0]


def _counter_means(rows: Sequence[ProfiledKernel]) -> dict[str, float]:
    totals: dict[str, list[float]] = {}
    for row in rows:
        for name, value in row.counters.items():
            totals.setdefault(name, []).append(value)
    return {name: sum(values) / len(values) for name, values in totals.items()}


def _identity(row: ProfiledKernel) -> dict[str, str]:
    return {column: row.cells.get(column, "") for column in IDENTITY_COLUMNS}


def _measured_result(
    ref: CaseRef, rows: Sequence[ProfiledKernel], backend: str, reported_kernel_type: str | None = None
) -> CaseResult:
    """A passed result whose samples are the rows' durations (one launch each)."""
    samples = tuple(float(r.duration_us) for r in rows if r.duration_us is not None)
    name = _most_common(r.name or r.kernel_type for r in rows)
    return CaseResult(
        ref,
        OUTCOME_PASSED,
        backend=backend,
        samples_us=samples,
        kernels=(KernelTime(name, sum(samples) / len(samples), 1.0),),
        reported_kernel_type=reported_kernel_type,
        counters=_counter_means(rows),
        identity=_identity(rows[-1]),
    )


def as_measured(cases: Iterable[MeasuredCase | CollectedCase], repeat_count: int) -> list[MeasuredCase]:
    """Measured cases as they are; collected cases that can run taken as ``repeat_count`` repeats."""
    measured = []
    for index, case in enumerate(cases):
        if isinstance(case, MeasuredCase):
            measured.append(case)
        elif case.runnable:
            measured.append(MeasuredCase(case.ref, repeat_count, index))
    return measured


def match_profile(
    prof: str | Path | Sequence[str | Path],
    cases: Iterable[MeasuredCase | CollectedCase],
    repeat_count: int,
    warmup_count: int,
    *,
    unmatched_kernel_types: Collection[str] | None = None,
    backend: str = NpuBackend.name,
    device: str | None = None,
    group_size: int | None = None,
) -> ProfileMatch:
    """Results for ``cases`` (``MeasuredCase`` or ``Case``) from the op_summary of ``prof``.

    ``prof`` is one ``PROF_*`` directory (or op_summary file) or several; ``Case`` objects are
    taken as having run ``repeat_count`` repeats.  Rows of no case become results of their own
    when their family is among ``unmatched_kernel_types``' families (all when None).  ``device``:
    only that device's rows count (``Device_id``, or the ``device_<id>`` directory); ``group_size``:
    the process group the session's collective kernels ran in (None: unknown, a profile read).
    """
    paths = _prof_paths(prof)
    groups, rows_read = _read_groups(paths, device, group_size)
    match = ProfileMatch(rows=rows_read)
    by_key: dict[tuple[str, str], list[MeasuredCase]] = defaultdict(list)
    for case in as_measured(cases, repeat_count):
        by_key[(kernel_family(case.ref.kernel_type), case.ref.signature_key)].append(case)
    where = ", ".join(str(p) for p in paths)

    for key, key_cases in by_key.items():
        key_cases.sort(key=lambda c: (c.order, c.ref.case_id))
        group = groups.get(key)
        blocks = (
            _blocks(group, key_cases, warmup_count, repeat_count, match.notes, key_cases[0].ref.case_id)
            if group is not None
            else []
        )
        for index, case in enumerate(key_cases):
            block = blocks[index] if index < len(blocks) else []
            match.results.append(_case_result(case, block, warmup_count, key[0], where, backend))

    allowed = None if unmatched_kernel_types is None else {kernel_family(t) for t in unmatched_kernel_types}
    unmatched = {key: group for key, group in groups.items() if key not in by_key}
    match.results.extend(_unmatched_results(unmatched, allowed, backend, match.notes))
    return match


def _case_result(
    case: MeasuredCase, block: list[ProfiledKernel], warmup_count: int, family: str, where: str, backend: str
) -> CaseResult:
    """A case's result from its block of launches (of ``family``, in the profile ``where``): the
    verification run and the warm-up dropped, its last ``repeats`` launches kept."""
    kept = block[1 + warmup_count :][-case.repeats :] if case.repeats > 0 else []
    if not kept:
        reason = (
            f"msprof recorded no {'|'.join(catalog().family_members(family))} kernel with this signature ({where})"
            if not block
            else f"msprof recorded {len(block)} launches of this signature, none after the "
            f"verification run and {warmup_count} warm-up ({where})"
        )
        return CaseResult(case.ref, OUTCOME_FAILED, reason=reason, backend=backend)
    reported = _most_common(r.kernel_type for r in kept)
    return _measured_result(
        case.ref, kept, backend, reported_kernel_type=reported if reported != case.ref.kernel_type else None
    )


def _unmatched_results(
    groups: Mapping[tuple[str, str], _Group], allowed: set[str] | None, backend: str, notes: list[str]
) -> list[CaseResult]:
    """Results of their own for the (family, signature) groups no case produced, all their launches
    as samples, where the family is ``allowed`` (every family when None)."""
    results: list[CaseResult] = []
    seen_ids: Counter[str] = Counter()
    for key, group in sorted(groups.items()):
        if allowed is not None and key[0] not in allowed:
            continue
        rows = group.all_rows()
        rows.sort(key=lambda k: (k.start_us if k.start_us is not None else float("inf"), str(k.source), k.line or 0))
        kernel_type = _most_common(r.kernel_type for r in rows)
        try:
            validate_kernel_type(kernel_type)
        except DatabaseError as exc:
            notes.append(f"msprof: unmatched kernels not kept: {exc.describe()}")
            continue
        case_id = f"msprof:{make_case_id(kernel_type, dict(rows[0].cells))}"
        seen_ids[case_id] += 1
        if seen_ids[case_id] > 1:
            case_id = f"{case_id}#{seen_ids[case_id]}"
        ref = CaseRef(case_id, kernel_type, f"{kernel_type}.csv", None, key[1])
        results.append(_measured_result(ref, rows, backend))
    return results


def msprof_results(
    prof_dir: str | Path | Sequence[str | Path],
    cases: Iterable[MeasuredCase | CollectedCase],
    repeat_count: int,
    warmup_count: int,
    *,
    unmatched_kernel_types: Collection[str] | None = None,
) -> list[CaseResult]:
    """``match_profile(...).results``: one result per case, then one per unmatched (family, signature)."""
    return match_profile(
        prof_dir, cases, repeat_count, warmup_count, unmatched_kernel_types=unmatched_kernel_types
    ).results


# ============================================================================ the launch
