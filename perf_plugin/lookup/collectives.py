"""``lookup_collective``: the duration of a collective from the database's ``hcom_{op}_.csv`` rows.

A model asks how long an all_reduce of so many bytes over so many devices takes; the collective
benchmarks (``perf_plugin/comm``) measured a grid of message sizes.  The answer, from the rows of
the query's op with its ``num_devices`` (and ``topology_tier`` and ``dtype`` where the query gives
them) and a finite positive duration:

* ``exact``: a row at the query's ``message_bytes``; of several, the first in the file, as the
  Ascend performance model's reader takes it;
* ``interpolated``: inside the measured sizes, the line ``t = alpha + bytes / beta`` through the two
  rows around the query (piecewise linear in bytes);
* ``fallback``: outside them, an alpha-beta least-squares fit (``alpha >= 0``, ``beta > 0``) over the
  rows, the reason saying that the query lies outside the measured sizes;
* ``none``: fewer than two measured sizes, the reason naming what the file does hold.

Rows are read as the Ascend reader reads them: ``message_bytes`` is the size it computes at the call
(all_gather one rank's input, reduce_scatter one rank's output), the duration the first finite
positive one of ``Average Duration(us)``, ``Profiling Average Duration(us)``, ``Duration(us)``, and
of rows that share a message size the first counts.  The files are found as that reader finds them:
in ``database`` itself, or, where ``database`` is a compute database whose ``op_mapping.yaml`` has a
``communication_data_ref``, in the directory it names first.  This layer sits below ``comm``, so
the column names of ``comm/record.py`` are restated here; a test holds the two equal.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.schema import DURATION_PREFERENCE, preferred_duration
from perf_plugin.database.signature import normalise_dtype
from perf_plugin.database.table import CsvTable
from perf_plugin.lookup.answer import EXACT, FALLBACK, INTERPOLATED, NONE, Answer, CollectiveQuery
from perf_plugin.replay.op_mapping import OP_MAPPING_FILE, _read_yaml

MESSAGE_BYTES = "message_bytes"
NUM_DEVICES = "num_devices"
DTYPE = "dtype"
TOPOLOGY_TIER = "topology_tier"
BACKEND = "backend"
NCCL_TESTS_BYTES = "nccl_tests_bytes"
COMMUNICATION_REF = "communication_data_ref"
# Short op names (lower case, separators dropped) -> the HCCL name in the file this project's
# benchmarks and Ascend's op_mapping.yaml use; an ``hcom_...`` name is taken as it is written.
HCOM_NAMES = {
    "allreduce": "allReduce",
    "allgather": "allGather", "allgatherintotensor": "allGather",
    "reducescatter": "reduceScatter", "reducescattertensor": "reduceScatter",
    "alltoall": "alltoallv", "alltoallv": "alltoallv", "alltoallsingle": "alltoallv",
}
# Spellings of one dtype that the comm files have used (DT_FLOAT16 before DT_FP16, FLOAT ...).
DTYPE_SYNONYMS = {"FLOAT16": "FP16", "HALF": "FP16", "FLOAT32": "FLOAT", "FP32": "FLOAT", "BFLOAT16": "BF16"}
INTERPOLATION = "alpha-beta through {lo} B and {hi} B: alpha {alpha} us, beta {beta} GB/s"
FIT = "alpha-beta least-squares fit on relative error"
FITTED = "fitted over {n} rows: alpha {alpha} us, beta {beta} GB/s"


@dataclass(frozen=True)
class CollectiveRow:
    line: int  # 1-based, the header being line 1
    message_bytes: int
    devices: int
    tier: str
    dtype: str  # normalised: BF16, FP16, FLOAT, INT8
    duration_us: float | None
    column: str  # the duration column read


@dataclass(frozen=True)
class CollectiveTable:
    path: Path
    rows: tuple[CollectiveRow, ...]
    has_tier: bool
    has_dtype: bool


def file_name(op: str) -> str:
    """``allreduce`` / ``all_reduce`` / ``allReduce`` / ``hcom_allReduce_`` -> ``hcom_allReduce_.csv``."""
    text = op.strip().removesuffix(".csv")
    if text.startswith("hcom_"):
        return f"{text}.csv"
    key = text.lower().replace("_", "").replace("-", "")
    return f"hcom_{HCOM_NAMES.get(key, text)}_.csv"


def collective_csv(database: str | Path, op: str) -> Path:
    """The CSV the query's op is answered from; DatabaseError naming the path when there is none."""
    base = Path(database)
    name = file_name(op)
    places = [base / name]
    mapping = base / OP_MAPPING_FILE
    if mapping.is_file():
        document = _read_yaml(mapping)
        ref = document.get(COMMUNICATION_REF) if isinstance(document, dict) else None
        if isinstance(ref, str) and ref.strip():
            # the reader looks where the mapping points first, then beside the mapping
            places.insert(0, base / ref.strip() / name)
    for path in places:
        if path.is_file():
            return path
    also = f" (nor {places[1]})" if len(places) > 1 else ""
    raise DatabaseError(f"no CSV of collective {op}{also}", path=places[0])


def normalise_comm_dtype(text: str) -> str:
    token = normalise_dtype(text.strip().removeprefix("torch."))
    return DTYPE_SYNONYMS.get(token, token)


def _same_tier(cell: str, wanted: str) -> bool:
    """Tiers as numbers where both are (``1`` and ``1.0`` are one tier), else as text."""
    try:
        return float(cell) == float(wanted)
    except ValueError:
        return cell.strip() == wanted.strip()


def _int(text: str) -> int | None:
    try:
        number = float(text.strip().strip('"'))
    except ValueError:
        return None
    return int(number) if math.isfinite(number) and number == int(number) else None


def read_collective_rows(path: Path) -> CollectiveTable:
    """The rows of one collective CSV whose sizes parse; a file read once per version."""
    stat = path.stat()
    return _read(path.resolve(), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _read(path: Path, mtime_ns: int, file_size: int) -> CollectiveTable:
    table = CsvTable.read(path)
    for column in (MESSAGE_BYTES, NUM_DEVICES):
        table.index(column)  # DatabaseError naming the file and the missing column
    if not any(table.has_column(c) for c in DURATION_PREFERENCE):
        raise DatabaseError(f"no duration column (one of {', '.join(DURATION_PREFERENCE)})", path=path)
    rows = []
    for index in range(len(table)):
        cells = table.row_dict(index)
        line = table.line_of(index) or index + 2
        if cells.get(BACKEND, "").strip() and not cells.get(NCCL_TESTS_BYTES, "").strip():
            # the writer's sizes before they followed the reader: answering from them would be wrong
            raise DatabaseError("written with nccl-tests' message_bytes (no nccl_tests_bytes): run "
                                f"'perfdb upgrade-comm {path.parent}' first", path=path, row=line, column=MESSAGE_BYTES)
        size, devices = _int(cells[MESSAGE_BYTES]), _int(cells[NUM_DEVICES])
        if size is None or devices is None:
            continue  # a malformed row answers nothing, as in the kernel lookups
        duration, column = preferred_duration(cells)
        rows.append(CollectiveRow(line, size, devices, cells.get(TOPOLOGY_TIER, "").strip(),
                                  normalise_comm_dtype(cells.get(DTYPE, "")), duration, column))
    return CollectiveTable(path, tuple(rows), table.has_column(TOPOLOGY_TIER), table.has_column(DTYPE))


Stage = tuple[str, str, Callable[[CollectiveRow], bool], Callable[[CollectiveRow], str]]


def _stages(table: CollectiveTable, query: CollectiveQuery) -> list[Stage]:
    """The filters a candidate passes, in order: (column, wanted, keeps, the row's value)."""
    stages: list[Stage] = [(NUM_DEVICES, str(query.devices), lambda r: r.devices == query.devices,
                            lambda r: str(r.devices))]
    if query.tier.strip() and table.has_tier:
        stages.append((TOPOLOGY_TIER, query.tier.strip(), lambda r: _same_tier(r.tier, query.tier), lambda r: r.tier))
    if query.dtype.strip() and table.has_dtype:
        wanted = normalise_comm_dtype(query.dtype)
        stages.append((DTYPE, query.dtype.strip(), lambda r: r.dtype == wanted, lambda r: r.dtype))
    return stages


def _notes(table: CollectiveTable, query: CollectiveQuery) -> str:
    """What the query gave that the file cannot tell apart (the reader, too, ignores it then)."""
    unmatched = [c for c, given, present in ((TOPOLOGY_TIER, query.tier, table.has_tier),
                                             (DTYPE, query.dtype, table.has_dtype)) if given.strip() and not present]
    return f"{table.path.name} has no {' or '.join(unmatched)} column: not matched" if unmatched else ""


def _sort_key(value: str) -> tuple[int, float, str]:
    try:
        return 0, float(value), value
    except ValueError:
        return 1, 0.0, value


def _missing(table: CollectiveTable, query: CollectiveQuery, timed: list[CollectiveRow]) -> str:
    """Why fewer than two sizes are left: the first filter that empties the rows, and what exists."""
    if not timed:
        return f"no row of {table.path.name} has a duration"
    pool, kept = timed, list[str]()
    for column, wanted, keeps, value_of in _stages(table, query):
        left = [r for r in pool if keeps(r)]
        if not left:
            where = f" with {', '.join(kept)}" if kept else ""
            have = ", ".join(sorted({value_of(r) or "(empty)" for r in pool}, key=_sort_key))
            return f"no row of {table.path.name}{where} has {column}={wanted}; measured{where}: {column} {have}"
        kept.append(f"{column}={wanted}")
        pool = left
    return (f"only one measured message size ({pool[0].message_bytes} B) in {table.path.name} with {', '.join(kept)}: "
            "an alpha-beta fit needs two")


def _g(value: float) -> str:
    return f"{value:.6g}"


def _beta_gbps(us_per_byte: float) -> float:
    """GB/s (1e9 B/s) of a slope in microseconds per byte."""
    return 1e-3 / us_per_byte if us_per_byte > 0 else math.inf


def _interpolate(query: CollectiveQuery, low: CollectiveRow, high: CollectiveRow, notes: str) -> Answer:
    assert low.duration_us is not None and high.duration_us is not None
    slope = (high.duration_us - low.duration_us) / (high.message_bytes - low.message_bytes)
    alpha = low.duration_us - slope * low.message_bytes
    beta = 1e-3 / slope if slope else math.inf  # negative where the time falls: said in the reason
    duration = low.duration_us + slope * (query.message_bytes - low.message_bytes)
    method = INTERPOLATION.format(lo=low.message_bytes, hi=high.message_bytes, alpha=_g(alpha), beta=_g(beta))
    if slope <= 0:
        notes = "; ".join(filter(None, ["the duration does not grow between these two sizes", notes]))
    return Answer(query, INTERPOLATED, duration, (low.line, high.line), method, notes,
                  details={"alpha_us": alpha, "beta_gbps": beta})


def fit_alpha_beta(sizes: Sequence[int], durations: Sequence[float]) -> tuple[float, float] | None:
    """(alpha us, slope us/B) of ``t = alpha + slope * bytes`` with ``alpha >= 0``, ``slope > 0``,
    minimising the squared relative error; None when the best such line has no slope.

    Relative error, so sizes over many decades count alike: in absolute terms the largest
    message would fix the line alone, and ``alpha`` (what a query below the range reads) would be
    the residue of its error.  The problem is convex in two unknowns: the unconstrained optimum
    when it is feasible, else the better of the optima on the faces ``alpha = 0`` and ``slope = 0``.
    """
    x = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(durations, dtype=np.float64)
    scale = float(x.max())  # bytes in units of the largest size: a well-conditioned system
    ones, u = 1.0 / t, (x / scale) / t  # row i: (alpha / t_i, slope * x_i / t_i) ~ 1

    def error(alpha: float, slope_scaled: float) -> float:
        return float(np.sum((alpha * ones + slope_scaled * u - 1.0) ** 2))

    solution = np.linalg.lstsq(np.column_stack([ones, u]), np.ones_like(t), rcond=None)[0]
    alpha, slope_scaled = float(solution[0]), float(solution[1])
    if alpha < 0 or slope_scaled <= 0:
        on_alpha_zero = (0.0, float(np.sum(u) / np.sum(u * u)))
        on_slope_zero = (float(np.sum(ones) / np.sum(ones * ones)), 0.0)
        alpha, slope_scaled = min(on_alpha_zero, on_slope_zero, key=lambda p: error(*p))
    if slope_scaled <= 0:
        return None
    return alpha, slope_scaled / scale


def _fallback(query: CollectiveQuery, line: list[CollectiveRow], notes: str) -> Answer:
    lo, hi = line[0].message_bytes, line[-1].message_bytes
    outside = f"outside the measured message sizes [{lo}, {hi}] B"
    fit = fit_alpha_beta([r.message_bytes for r in line], [r.duration_us or 0.0 for r in line])
    if fit is None:
        return Answer(query, NONE, reason=f"{outside}, and the {len(line)} rows' durations do not grow with the "
                                          "message size: no alpha-beta fit with a positive bandwidth")
    alpha, slope = fit
    beta = _beta_gbps(slope)
    fitted = FITTED.format(n=len(line), alpha=_g(alpha), beta=_g(beta))
    reason = "; ".join(filter(None, [f"{outside}: {fitted}", notes]))
    return Answer(query, FALLBACK, alpha + slope * query.message_bytes, tuple(r.line for r in line), FIT, reason,
                  details={"alpha_us": alpha, "beta_gbps": beta, "rows_fitted": float(len(line))})


def lookup_collective(database: str | Path, query: CollectiveQuery) -> Answer:
    """The duration of ``query`` from the collective CSVs of the database directory ``database``."""
    table = read_collective_rows(collective_csv(database, query.op))
    notes = _notes(table, query)
    if query.message_bytes <= 0:
        return Answer(query, NONE, reason=f"message_bytes {query.message_bytes} is not a positive size")
    timed = [r for r in table.rows if r.duration_us is not None]
    matching = list(table.rows)
    for _, _, keeps, _ in _stages(table, query):
        matching = [r for r in matching if keeps(r)]
    untimed = [r for r in matching if r.message_bytes == query.message_bytes and r.duration_us is None]
    if untimed:
        notes = "; ".join(filter(None, [f"row {untimed[0].line} has this size but no duration", notes]))
    candidates = [r for r in matching if r.duration_us is not None]
    first_by_size: dict[int, CollectiveRow] = {}
    for row in candidates:
        first_by_size.setdefault(row.message_bytes, row)  # the reader's row of each size: the first
    exact = first_by_size.get(query.message_bytes)
    if exact is not None:
        return Answer(query, EXACT, exact.duration_us, (exact.line,), exact.column, notes)
    line = sorted(first_by_size.values(), key=lambda r: r.message_bytes)
    if len(line) < 2:
        return Answer(query, NONE, reason="; ".join(filter(None, [_missing(table, query, timed), notes])))
    below = [r for r in line if r.message_bytes < query.message_bytes]
    above = [r for r in line if r.message_bytes > query.message_bytes]
    if below and above:
        return _interpolate(query, below[-1], above[0], notes)
    return _fallback(query, line, notes)
