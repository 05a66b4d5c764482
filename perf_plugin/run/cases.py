"""Database rows -> frozen Case objects -> ``pytest.param`` with stable, readable ids.

Every row of every selected CSV becomes exactly one case.  A row whose cells cannot be parsed at
all (malformed shape, unknown dtype) becomes a *quarantined* case: shown as skipped with the
reason, and set aside at write-back into a quarantine file that keeps every column.  A row the
replay cannot build (a layout or pattern it does not reproduce) is *unsupported*, and a row
whose kernel type has no replay is *no-replay*: both are skipped with the reason, counted by the
coverage gate, and left in their CSV untouched (their profiled data stays where readers find it).
  Ids name the kernel type, shapes and dtypes (``MatMulV3-4096x1024,1024x3584-BF16``)
and never the row index alone; duplicate signatures in one file get ``#2``, ``#3`` suffixes in
file order, so ids are stable as long as the file's rows are.
"""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from perf_plugin.database.errors import DatabaseError, IncompleteRow
from perf_plugin.database.file_kind import UnusableFile, one_error, require_known_column
from perf_plugin.database.kernel_types import validate_kernel_type
from perf_plugin.database.paths import list_kernel_csvs
from perf_plugin.database.row_ids import make_case_id
from perf_plugin.database.schema import (
    DURATION_PREFERENCE,
    IDENTITY_COLUMNS,
    PROFILING_AVERAGE,
    PROFILING_COUNT,
    REQUIRED_IDENTITY_COLUMNS,
    is_junk_duration,
    parse_duration,
    row_has_valid_duration,
)
from perf_plugin.database.signature import signature_text
from perf_plugin.database.table import CsvTable
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.op_mapping import missing_replay_reason
from perf_plugin.replay.rank_group import RankGroup, group_scope
from perf_plugin.replay.registry import signature_of
from perf_plugin.replay.tensors import KernelRow, kernel_row_from_cells
from perf_plugin.results import CaseRef
from perf_plugin.run.expert_parallel import GroupWorld, group_world
from perf_plugin.run.state import CaseRecord

if TYPE_CHECKING:
    from perf_plugin.run.state import RunState

STATUS_READY = "ready"
STATUS_QUARANTINED = "quarantined"  # a cell cannot be parsed: set aside at write-back
STATUS_UNSUPPORTED = "unsupported"  # the replay cannot build this row: skipped, row left as it is
STATUS_NO_REPLAY = "no-replay"  # kernel type has no replay: skipped, counted by coverage
STATUS_FILLED = "filled"  # update-mode missing-only and the row already has a duration
STATUS_FILE_ERROR = "file-error"  # the whole file is unusable (missing columns): skipped, untouched



@dataclass(frozen=True, slots=True)  # one per collected row
class Case:
    ref: CaseRef
    status: str
    reason: str = ""
    row: KernelRow | None = None
    replay_kernel_type: str = ""  # whose replay runs this row (differs through op_mapping.yaml aliases)
    weight_us: float = 0.0  # the row's profiled time (coverage by time)
    profiled_us: float | None = None  # the row's in-model average duration (None: never profiled)
    group_size: int = 1  # ranks the row's kernel runs over (an expert-parallel row: its EP Size)

    @property
    def runnable(self) -> bool:
        return self.status == STATUS_READY


@dataclass
class CaseSet:
    cases: list[Case] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)  # one line per file-level problem

    def by_status(self, status: str) -> list[Case]:
        return [c for c in self.cases if c.status == status]


def _replay_problem(
    kernel_type: str, replay: OpReplay, row: KernelRow, named_apis: bool, world: GroupWorld, path: Path | None, line: int | None
) -> tuple[str | None, int]:
    """Why the replay cannot build the row here (None: it can), and the ranks its kernel runs over.

    A collective row is checked in the group it would run in (only planned now), once this run
    can form one of its size."""
    try:
        size = replay.group_size(row)
        problem = world.problem(replay.group_column, size) if size > 1 else None
        if problem is not None:
            return DatabaseError(problem, path=path, row=line, column=replay.group_column).describe(), size
        with group_scope(RankGroup(size, world.rank) if size > 1 else None):
            replay.check(row)  # first: its reason is about the row, whatever the backend
        if not replay.portable and not named_apis:
            raise CaseBuildError(f"{kernel_type} runs only through {replay.npu_api} on an Ascend NPU (no portable equivalent)")
    except CaseBuildError as exc:
        return DatabaseError(f"replay cannot be built: {exc}", path=path, row=line).describe(), 1
    return None, size


def _row_case(
    kernel_type: str,
    table: CsvTable,
    index: int,
    replay: OpReplay | None,
    update_mode: str,
    named_apis: bool,
    world: GroupWorld,
) -> tuple[Case, str]:
    cells = table.row_dict(index)
    line = table.line_of(index)
    base_id = make_case_id(kernel_type, cells)
    csv_file = table.path.name if table.path else f"{kernel_type}.csv"
    signature_key = signature_text(signature_of(kernel_type, cells))

    # interned, as CaseRef.from_json interns the copies that come back with records and results
    ref = CaseRef(sys.intern(base_id), kernel_type, csv_file, line, sys.intern(signature_key))
    weight = profiled_time_us(cells)
    profiled = parse_duration(cells.get(PROFILING_AVERAGE, ""))

    def case(status: str, reason: str = "", row: KernelRow | None = None) -> Case:
        return Case(ref, status, reason, row, weight_us=weight, profiled_us=profiled)

    try:
        row = kernel_row_from_cells(kernel_type, cells)
    except IncompleteRow as exc:
        return case(STATUS_UNSUPPORTED, exc.located(path=table.path, row=line).describe()), base_id
    except DatabaseError as exc:
        located = exc.located(path=table.path, row=line)
        return case(STATUS_QUARANTINED, located.describe()), base_id
    # A row whose slots are all empty is not necessarily bad: an empty shape with a dtype is a
    # 0-d (scalar) tensor in the profiler's notation (``Add`` of two scalars is ``;``).  The
    # replay's check decides.
    if update_mode == "missing-only" and row_has_valid_duration(table, index):
        return case(STATUS_FILLED, "row already has a duration (update mode missing-only)", row), base_id
    if replay is None:
        return case(STATUS_NO_REPLAY, f"no replay for kernel type {kernel_type}", row), base_id
    problem, size = _replay_problem(kernel_type, replay, row, named_apis, world, table.path, line)
    if problem is not None:
        return case(STATUS_UNSUPPORTED, problem, row), base_id
    return dataclasses.replace(case(STATUS_READY, "", row), group_size=size), base_id


def profiled_time_us(cells: dict[str, str]) -> float:
    """The row's share of its profile's kernel time: the profiled average times the launch count
    (one launch where the count is missing); 0 for a row that was never profiled."""
    average = parse_duration(cells.get(PROFILING_AVERAGE, ""))
    if average is None:
        return 0.0
    count = parse_duration(cells.get(PROFILING_COUNT, ""))
    return average * (count if count is not None else 1.0)


def header_problem(table: CsvTable, path: Path) -> DatabaseError | None:
    """Why a file's rows cannot be read as cases: a duplicated column or missing identity columns.

    A column named twice would be read from one copy and written to the other.
    """
    counts = Counter(table.header)
    duplicated = [name for name in table.header if counts[name] > 1]
    if duplicated:
        return DatabaseError(
            f"column named {counts[duplicated[0]]} times in the header; rows skipped, file left as it is",
            path=path,
            column=duplicated[0],
        )
    missing = [c for c in REQUIRED_IDENTITY_COLUMNS if not table.has_column(c)]
    if missing:
        return DatabaseError(
            f"missing identity column(s) {', '.join(repr(m) for m in missing)}; rows skipped, file left as it is",
            path=path,
            column=missing[0],
        )
    return None


def has_rows(table: CsvTable) -> bool:
    """Whether the file holds a row at all (blank lines are none)."""
    return any(not table.is_blank(index) for index in range(len(table)))


def empty_files_note(paths: list[Path]) -> str:
    """One line naming every file that holds a header and no rows.

    Such a file gives no case: without a word, a database of only such files would end with
    "no tests ran", and a selection meant to replay one would pass unnoticed.
    """
    files = "1 kernel CSV holds" if len(paths) == 1 else f"{len(paths)} kernel CSVs hold"
    return f"{files} a header and no rows (nothing to replay): {', '.join(str(p) for p in paths)}"


def unreadable_duration_note(table: CsvTable, path: Path) -> str | None:
    """One line naming the first duration cell that is neither a number nor empty, if any.

    Such a row counts as having no duration (``parse_duration``): measured under
    ``missing-only`` and its cell overwritten, so the user hears of it.
    """
    columns = [column for column in DURATION_PREFERENCE if table.has_column(column)]
    found: list[tuple[int, str, str]] = []
    for index in range(len(table)):
        for column in columns:
            value = table.get(index, column)
            if is_junk_duration(value):
                found.append((index, column, value))
    if not found:
        return None
    index, column, value = found[0]
    more = f" (and {len(found) - 1} more such cells in this file)" if len(found) > 1 else ""
    error = DatabaseError(
        f"{value!r} is not a duration{more}; such a row counts as having none and its duration is measured again",
        path=path,
        row=table.line_of(index),
        column=column,
    )
    return error.describe()


def extra_cells_note(table: CsvTable, path: Path) -> str | None:
    """One line naming the first row with non-empty cells past the header's last column, if any.

    Those cells belong to no column: they are kept as they are, but nothing reads them.
    """
    width = len(table.header)
    rows = [index for index, cells in enumerate(table.rows) if any(cell.strip() for cell in cells[width:])]
    if not rows:
        return None
    more = f" (and {len(rows) - 1} more such rows in this file)" if len(rows) > 1 else ""
    cells = len(table.rows[rows[0]])
    error = DatabaseError(
        f"{cells} cells for {width} header columns{more}; the cells past the header belong to no column and are "
        "kept as they are",
        path=path,
        row=table.line_of(rows[0]),
    )
    return error.describe()


def load_case_set(
    directory: Path,
    replay_lookup: Callable[[str], OpReplay | None],
    update_mode: str = "all",
    csv_files: Iterable[Path] | None = None,
    replay_type: Callable[[str], str] = lambda kernel_type: kernel_type,
    named_apis: bool = False,
    world: GroupWorld = GroupWorld(),
) -> CaseSet:
    """Read every compute CSV of ``directory`` and turn each row into a Case.

    ``named_apis``: the backend launches kernels through the APIs op_mapping.yaml names (an NPU),
    so replays without a portable ``run`` can build their rows too; ``world``: the process groups
    collective rows can run in (``perf_plugin.run.expert_parallel``).  Raises UnusableFile when a
    file holds no CSV at all (a Git LFS pointer, empty, binary): the run would measure part of the
    database and call it the database."""
    result = CaseSet()
    unusable: list[UnusableFile] = []
    empty: list[Path] = []  # header-only files, named in one line
    for path in csv_files if csv_files is not None else list_kernel_csvs(directory):
        kernel_type = path.stem
        try:
            validate_kernel_type(kernel_type)
            table = CsvTable.read(path)
            require_known_column(table.header, IDENTITY_COLUMNS + DURATION_PREFERENCE, path, "kernel CSV")
        except UnusableFile as exc:
            unusable.append(exc)
            continue
        except DatabaseError as exc:
            result.messages.append(exc.located(path=path).describe())
            continue
        error = header_problem(table, path)
        if error is not None:
            result.messages.append(error.describe())
            result.cases.extend(_file_error_cases(kernel_type, table, path, error.describe()))
            continue
        if not has_rows(table):
            empty.append(path)
            continue
        notes = (unreadable_duration_note(table, path), extra_cells_note(table, path))
        result.messages.extend(note for note in notes if note is not None)
        replay = replay_lookup(kernel_type)
        missing = missing_replay_reason(directory, kernel_type) if replay is None else ""  # once per file
        seen: dict[str, int] = {}
        for index in range(len(table)):
            if table.is_blank(index):
                continue
            case = _numbered(*_row_case(kernel_type, table, index, replay, update_mode, named_apis, world), seen)
            if replay is not None:
                case = dataclasses.replace(case, replay_kernel_type=replay_type(kernel_type))
            elif case.status == STATUS_NO_REPLAY:
                case = dataclasses.replace(case, reason=missing)
            result.cases.append(case)
    if empty:
        result.messages.append(empty_files_note(empty))
    if unusable:
        raise one_error(unusable)
    return result


def _file_error_cases(kernel_type: str, table: CsvTable, path: Path, reason: str) -> list[Case]:
    """Every row of a file whose header is wrong: a case each, failing with the file's reason."""
    cases = []
    for index in range(len(table)):
        if not table.is_blank(index):
            line = table.line_of(index)
            ref = CaseRef(f"{kernel_type}-line{line}", kernel_type, path.name, line, "")
            cases.append(Case(ref, STATUS_FILE_ERROR, reason))
    return cases


def _numbered(case: Case, base_id: str, seen: dict[str, int]) -> Case:
    """The second and later rows of one id get ``#2``, ``#3`` ...: stable ids for identical rows."""
    seen[base_id] = seen.get(base_id, 0) + 1
    if seen[base_id] == 1:
        return case
    case_id = sys.intern(f"{base_id}#{seen[base_id]}")
    return dataclasses.replace(case, ref=dataclasses.replace(case.ref, case_id=case_id))


def record_of(case: Case, outcome: str = "") -> CaseRecord:
    """What the controller keeps of a case: its reference, collection status and weight."""
    return CaseRecord(case.ref, case.status, case.reason, outcome=outcome, weight_us=case.weight_us)


def as_params(case_set: CaseSet) -> list["pytest.ParameterSet"]:
    params = []
    kernel_marks: dict[str, pytest.MarkDecorator] = {}  # one per kernel type, shared by its items
    for case in case_set.cases:
        kernel_type = case.ref.kernel_type
        if kernel_type not in kernel_marks:
            kernel_marks[kernel_type] = pytest.mark.kernel_type(kernel_type)
        marks = [kernel_marks[kernel_type]]
        if not case.runnable:
            marks.append(pytest.mark.skip(reason=f"{case.status}: {case.reason}"))
        params.append(pytest.param(case, id=case.ref.case_id, marks=marks))
    return params


def collect_case_set(state: RunState, extra_replay_modules: Iterable[Any] = ()) -> CaseSet:
    """The run's cases, read once per process from its database directory (kept in the state).

    Seeding from the shipped sample happens here, not at configure time, so that runs which
    collect no replay test (a project's own tests, collective-only runs) never create database
    directories; it is idempotent under the database lock, so xdist workers may race for it.
    Raises DatabaseError, with the catalog's errors (a broken replay entry point) among them.
    """
    from perf_plugin.backends.select import backend_class
    from perf_plugin.replay.op_mapping import replay_lookup_for
    from perf_plugin.replay.registry import CatalogError, refresh_catalog
    from perf_plugin.run.location import seed_from_sample

    seeded = seed_from_sample(state.location, state.settings.database_root, state.settings.lock_timeout)
    if seeded:
        state.notes.append(seeded)
        state.unsent_notes.append(seeded)
    try:
        kernels = refresh_catalog(extra_replay_modules)  # the replays installed now, entry points included
        lookup, replay_type = replay_lookup_for(state.location.directory, kernels)
    except CatalogError as exc:
        raise DatabaseError(str(exc)) from None
    state.case_set = load_case_set(
        state.location.directory,
        lookup,
        state.settings.update_mode,
        replay_type=replay_type,
        named_apis=backend_class(state.backend_name).launches_named_apis,
        world=group_world(state.settings, state.backend_name),
    )
    state.notes.extend(state.case_set.messages)
    state.unsent_notes.extend(state.case_set.messages)  # an xdist worker's reach the controller
    return state.case_set
