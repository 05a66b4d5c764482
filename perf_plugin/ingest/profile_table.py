"""Read one ``kernel_details*.csv`` or ``op_summary_*.csv`` into a frame of kernel samples.

Profiles of a model run reach millions of rows, so the file is read by pandas' C parser with
only the columns ingest uses (``usecols``): the kernel type, the identity columns as
categoricals (a profile repeats a few hundred distinct cells millions of times), the duration
and the counters as floats with ``N/A`` read as missing.  Start times (which end in a tab in real
files) and the other bookkeeping columns are never parsed, except the start times of the few
kernels an input-value capture recorded values for (``Input Values``, a detail cell that tells
their rows apart: ``perf_plugin.ingest.ascend_values``).

Shape cells keep the quotes the profiler put inside the value (``"4096,1024"``), so rows
written from them look like the profiler's own.  Communication rows are counted and dropped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.schema import DETAIL_COLUMNS, IDENTITY_COLUMNS, INPUT_VALUES
from perf_plugin.ingest import columns as col
from perf_plugin.ingest.aggregate import CAPTURED_COLUMNS, INPUT_DEPTHS, INPUT_MASKED, INPUT_QUANTILES, INPUT_ZEROS
from perf_plugin.ingest.ascend_trace_view import to_ns
from perf_plugin.ingest.names import COMMUNICATION_CORES, COMMUNICATION_PREFIX, normalise_kernel_type

KIND_KERNEL_DETAILS = "kernel_details"
KIND_OP_SUMMARY = "op_summary"

_MISSING_TOKENS = ("N/A", "", "NA", "NaN", "nan")
START_TIME = "Start Time(us)"
KernelKey = tuple[int, str]  # (start in ns, the kernel's Name), as kernel_details and trace_view.json give them
_NO_TYPE = frozenset({"", "N/A"})


@dataclass
class ProfileTable:
    """The compute-kernel samples of one or more profiler tables, ready for aggregation.

    ``frame`` has the columns ``Type`` (normalised), the identity columns, ``Duration(us)`` and
    one float column per counter; ``counters`` lists the counters in file order.
    """

    frame: pd.DataFrame
    counters: list[str]
    sources: list[Path] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    rows_read: int = 0
    communication: Counter[str] = field(default_factory=Counter)
    without_type: int = 0
    without_duration: int = 0

    @property
    def compute_rows(self) -> int:
        return len(self.frame)


def read_profile_table(path: str | Path, values_cells: Mapping[KernelKey, str] | None = None,
                       quantiles: Mapping[KernelKey, Mapping[int, tuple[float, ...]]] | None = None,
                       depths: Mapping[KernelKey, Mapping[int, Mapping[int, int]]] | None = None,
                       zeros: Mapping[KernelKey, Mapping[int, float]] | None = None,
                       masked: Mapping[KernelKey, Mapping[int, tuple[float, float]]] | None = None) -> ProfileTable:
    """The samples of one table; ``values_cells`` gives kernels (by start and name) their
    ``Input Values`` cell, the values an input-value capture recorded for their call,
    ``quantiles`` the quantiles it recorded of their floating inputs, ``depths`` their rows'
    selection depths (top-k's), ``zeros`` their shares of zero elements (a division's) and
    ``masked`` their masked shares and runs (a softmax's), by input slot (``perf_plugin.ingest.ascend_values``)."""
    path = Path(path)
    raw_header = col.read_raw_header(path)
    header = [name.strip() for name in raw_header]
    canonical = col.check_columns(path, header)
    counters = col.counter_columns(canonical)
    # pandas sees the header as written (spaces included); ingest works with canonical names
    to_canonical = dict(zip(raw_header, canonical))
    wanted = {col.TYPE, *IDENTITY_COLUMNS, col.DURATION, *counters}
    if col.NAME in canonical:
        wanted.add(col.NAME)
    if (values_cells or quantiles or zeros or masked) and col.NAME in canonical and START_TIME in canonical:
        wanted.add(START_TIME)  # read only when a kernel has values: the column is never used otherwise
    usecols = [name for name in raw_header if to_canonical[name] in wanted]
    numeric = [name for name in usecols if to_canonical[name] in {col.DURATION, *counters}]
    dtypes: dict[str, str] = {name: "category" for name in usecols if name not in numeric}
    dtypes.update({name: "float64" for name in numeric})
    # as text: a categorical column parses numbers as floats, which keep too few digits of a 16-digit time
    dtypes.update({name: "str" for name in usecols if to_canonical[name] == START_TIME})
    frame = _read_csv(path, usecols, dtypes, numeric)
    frame.columns = [to_canonical[name] for name in frame.columns]
    if START_TIME in frame.columns:
        keys = _kernel_keys(frame, {name for _, name in [*(values_cells or {}), *(quantiles or {}), *(depths or {}),
                                                         *(zeros or {}), *(masked or {})]})
        frame[INPUT_VALUES] = pd.Categorical(_by_kernel(len(frame), keys, values_cells or {}, ""))
        for name, by_kernel in ((INPUT_QUANTILES, quantiles), (INPUT_DEPTHS, depths), (INPUT_ZEROS, zeros),
                                (INPUT_MASKED, masked)):
            if by_kernel:
                frame[name] = _by_kernel(len(frame), keys, by_kernel, {})
        del frame[START_TIME]
    kind = KIND_OP_SUMMARY if col.is_op_summary_header(header) else KIND_KERNEL_DETAILS
    return _to_samples(frame, counters, path, kind)


def _kernel_keys(frame: pd.DataFrame, names: set[str]) -> dict[int, KernelKey]:
    """The (start, name) key of each sample named like one of ``names``: only those rows have
    their start time parsed, a few among the millions of a model's profile."""
    candidate = _category_mask(frame[col.NAME], lambda n: n.strip() in names)
    starts, kernel_names = frame[START_TIME].to_numpy(), frame[col.NAME].to_numpy()
    keys = {}
    for index in np.flatnonzero(candidate):
        start = to_ns(starts[index])
        if start is not None:
            keys[int(index)] = (start, str(kernel_names[index]).strip())
    return keys


def _by_kernel(length: int, keys: Mapping[int, KernelKey], by_key: Mapping[KernelKey, Any], default: Any) -> Any:
    """Each sample's entry of ``by_key`` through its key (``default`` for most), an object array."""
    cells = np.full(length, default, dtype=object)
    for index, key in keys.items():
        cells[index] = by_key.get(key, default)
    return cells


def _read_csv(path: Path, usecols: list[str], dtypes: dict[str, str], numeric: list[str]) -> pd.DataFrame:
    try:
        return pd.read_csv(
            path,
            usecols=usecols,
            dtype=dtypes,
            na_values={name: list(_MISSING_TOKENS) for name in numeric},
            keep_default_na=False,
            encoding="utf-8-sig",
            engine="c",
            skipinitialspace=False,
        )
    except ValueError as exc:
        if isinstance(exc, UnicodeDecodeError):
            raise DatabaseError(f"not UTF-8 text (byte {exc.start})", path=path) from None
        if isinstance(exc, pd.errors.ParserError):
            raise DatabaseError(f"malformed CSV: {exc}", path=path) from None
        _locate_bad_number(path, numeric)
        raise DatabaseError(f"malformed CSV: {exc}", path=path) from None
    except pd.errors.EmptyDataError:
        raise DatabaseError("empty file: no header line", path=path) from None


def _locate_bad_number(path: Path, numeric: list[str]) -> None:
    """Raise a DatabaseError naming the row and column of the first non-numeric cell."""
    text = pd.read_csv(path, usecols=numeric, dtype=str, keep_default_na=False, encoding="utf-8-sig")
    first: tuple[int, str, str] | None = None
    for name in numeric:
        cells = text[name].str.strip()
        bad = pd.to_numeric(cells, errors="coerce").isna() & ~cells.isin(_MISSING_TOKENS)
        if bad.any():
            index = int(np.flatnonzero(bad.to_numpy())[0])
            if first is None or index < first[0]:
                first = (index, name, str(text[name].iloc[index]))
    if first is not None:
        index, name, value = first
        # +2: the header is line 1 and records are one line each in profiler tables
        raise DatabaseError(f"{value!r} is not a number", path=path, row=index + 2, column=name)


def _category_map(series: pd.Series, func: Callable[[str], str]) -> pd.Series:
    """Apply ``func`` to the categories of a categorical column, merging equal results."""
    categories = [func(str(c)) for c in series.cat.categories]
    unique = list(dict.fromkeys(categories))
    position = {name: i for i, name in enumerate(unique)}
    code_map = np.array([position[c] for c in categories] + [-1], dtype=np.int64)
    codes = series.cat.codes.to_numpy().astype(np.int64)  # -1 for missing indexes the trailing -1
    return pd.Series(
        pd.Categorical.from_codes(code_map[codes], categories=unique)  # type: ignore[call-overload]  # stubs want a list; an int array is what pandas takes fastest, index=series.index, name=series.name
    )


def _category_mask(series: pd.Series, predicate: Callable[[str], bool]) -> np.ndarray:
    hits = np.array([bool(predicate(str(c))) for c in series.cat.categories] + [False])
    return hits[series.cat.codes.to_numpy().astype(np.int64)]


def _to_samples(frame: pd.DataFrame, counters: list[str], path: Path, kind: str) -> ProfileTable:
    rows_read = len(frame)
    for name in (col.TYPE, *IDENTITY_COLUMNS, col.NAME):
        if name in frame.columns and not isinstance(frame[name].dtype, pd.CategoricalDtype):
            frame[name] = frame[name].astype("category")
    raw_type = frame[col.TYPE]
    communication = _category_mask(raw_type, lambda t: t.strip().startswith(COMMUNICATION_PREFIX))
    communication |= _category_mask(
        frame[col.ACCELERATOR_CORE], lambda c: c.strip().upper() in COMMUNICATION_CORES
    )
    if col.NAME in frame.columns:
        communication |= _category_mask(frame[col.NAME], lambda n: n.strip().startswith(COMMUNICATION_PREFIX))
    no_type = _category_mask(raw_type, lambda t: t.strip() in _NO_TYPE) | raw_type.isna().to_numpy()
    no_type &= ~communication

    comm_counts: Counter[str] = Counter()
    if communication.any():
        comm_types = raw_type[communication].astype(str).str.strip()
        comm_counts.update({str(name): int(count) for name, count in comm_types.value_counts().items()})

    keep = ~communication & ~no_type
    no_duration = keep & frame[col.DURATION].isna().to_numpy()
    keep &= ~no_duration
    if col.NAME in frame.columns:
        del frame[col.NAME]
    compute = frame if keep.all() else frame.loc[keep].reset_index(drop=True)
    compute[col.TYPE] = _category_map(compute[col.TYPE], normalise_kernel_type)
    for name in IDENTITY_COLUMNS:
        # a short (ragged) record leaves trailing cells missing: they read as empty text
        cells = compute[name].cat.remove_unused_categories()
        if cells.isna().any():
            if "" not in cells.cat.categories:
                cells = cells.cat.add_categories([""])
            cells = cells.fillna("")
        compute[name] = cells
    return ProfileTable(
        frame=compute,
        counters=list(counters),
        sources=[path],
        kinds=[kind],
        rows_read=rows_read,
        communication=comm_counts,
        without_type=int(no_type.sum()),
        without_duration=int(no_duration.sum()),
    )


def combine(tables: list[ProfileTable]) -> ProfileTable:
    """One table from several files (ranks, steps, slices); counters are the union, in order."""
    if len(tables) == 1:
        return tables[0]
    counters = list(dict.fromkeys(name for table in tables for name in table.counters))
    # detail cells (a kernel's Input Values, a trace's strides and arguments) tell rows apart: kept
    details = [name for name in DETAIL_COLUMNS if any(name in table.frame.columns for table in tables)]
    string_columns = [col.TYPE, *IDENTITY_COLUMNS, *details]
    frames = [_with_columns(table.frame, details).reindex(columns=[*string_columns, col.DURATION, *counters])
              for table in tables]
    merged = {
        name: pd.api.types.union_categoricals([frame[name] for frame in frames], ignore_order=True)
        for name in string_columns
    }
    numbers = pd.concat([frame[[col.DURATION, *counters]] for frame in frames], ignore_index=True)
    frame = pd.DataFrame({name: pd.Series(merged[name]) for name in string_columns})
    frame = pd.concat([frame, numbers], axis=1)
    for name in CAPTURED_COLUMNS:
        if any(name in table.frame.columns for table in tables):
            samples: list[Any] = []
            for table in tables:
                samples += list(table.frame[name]) if name in table.frame.columns else [{}] * len(table.frame)
            frame[name] = pd.Series(samples, dtype=object)
    result = ProfileTable(frame=frame, counters=counters)
    for table in tables:
        result.sources += table.sources
        result.kinds += table.kinds
        result.rows_read += table.rows_read
        result.communication.update(table.communication)
        result.without_type += table.without_type
        result.without_duration += table.without_duration
    return result


def _with_columns(frame: pd.DataFrame, details: list[str]) -> pd.DataFrame:
    """``frame`` with every detail column, empty where it has none (categorical, as the others)."""
    missing = [name for name in details if name not in frame.columns]
    if not missing:
        return frame
    return frame.assign(**{name: pd.Categorical([""] * len(frame)) for name in missing})
