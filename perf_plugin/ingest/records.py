"""Per-kernel records of a profiler table, for matching measurements to database rows.

Ingest aggregates whole profiles with pandas (``profile_table``); a replay session under msprof
instead needs each ``op_summary`` row on its own (its start time places it inside a case's
range, its signature finds the database row).  ``read_prof_directory`` gives those rows as
``ProfiledKernel`` records with the same column handling as ingest: op_summary names mapped to
kernel_details names, kernel types normalised, ``N/A`` counters left out.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.schema import IDENTITY_COLUMNS
from perf_plugin.database.signature import Signature
from perf_plugin.ingest import columns as col
from perf_plugin.ingest.discover import find_op_summaries
from perf_plugin.ingest.names import is_communication, normalise_kernel_type
from perf_plugin.replay.registry import signature_of

START_TIME = "Start Time(us)"
_MISSING = frozenset({"", "N/A", "NA", "NaN", "nan"})


@dataclass(frozen=True)
class ProfiledKernel:
    """One kernel execution as a profiler table reports it."""

    kernel_type: str
    name: str
    cells: Mapping[str, str]
    duration_us: float | None
    counters: Mapping[str, float] = field(default_factory=dict)
    start_us: float | None = None
    source: Path | None = None
    line: int | None = None
    communication: bool = False

    def signature(self) -> Signature:
        return signature_of(self.kernel_type, self.cells)


def _number(text: str, path: Path, line: int, column: str) -> float | None:
    value = text.strip()
    if value in _MISSING:
        return None
    try:
        return float(value)
    except ValueError:
        raise DatabaseError(f"{text!r} is not a number", path=path, row=line, column=column) from None


def iter_kernel_records(path: str | Path, *, include_communication: bool = False) -> Iterator[ProfiledKernel]:
    """Records of one kernel_details or op_summary file (raises DatabaseError on bad input)."""
    path = Path(path)
    header = col.read_header(path)
    canonical = col.check_columns(path, header)
    counters = col.counter_columns(canonical)
    try:
        with path.open("r", encoding="utf-8-sig", newline="") as handle:
            reader = csv.reader(handle)
            next(reader, None)
            for cells in reader:
                if not any(cell.strip() for cell in cells):
                    continue
                row = dict(zip(canonical, cells))
                line = reader.line_num
                raw_type = row.get(col.TYPE, "").strip()
                name = row.get(col.NAME, "").strip()
                communication = is_communication(raw_type, name, row.get(col.ACCELERATOR_CORE, ""))
                if (communication and not include_communication) or raw_type in _MISSING:
                    continue
                values = {}
                for counter in counters:
                    number = _number(row.get(counter, ""), path, line, counter)
                    if number is not None:
                        values[counter] = number
                yield ProfiledKernel(
                    kernel_type=normalise_kernel_type(raw_type),
                    name=name,
                    cells={c: row.get(c, "") for c in IDENTITY_COLUMNS},
                    duration_us=_number(row.get(col.DURATION, ""), path, line, _source_name(header, col.DURATION)),
                    counters=values,
                    start_us=_number(row.get(START_TIME, ""), path, line, _source_name(header, START_TIME)),
                    source=path,
                    line=line,
                    communication=communication,
                )
    except csv.Error as exc:
        raise DatabaseError(f"malformed CSV: {exc}", path=path) from None
    except UnicodeDecodeError as exc:
        raise DatabaseError(f"not UTF-8 text (byte {exc.start})", path=path) from None


def _source_name(header: list[str], canonical_name: str) -> str:
    """The column's name as the file spells it (op_summary says ``Task Duration(us)``)."""
    if col.is_op_summary_header(header):
        for source, target in col.OP_SUMMARY_RENAMES.items():
            if target == canonical_name:
                return source
    return canonical_name


def read_prof_directory(path: str | Path, *, include_communication: bool = False) -> list[ProfiledKernel]:
    """All op_summary records of a msprof ``PROF_*`` directory (or a single op_summary file).

    Looks for ``mindstudio_profiler_output/op_summary_*.csv`` (sliced exports included), else
    ``device_*/summary/op_summary_*.csv``, recursively; raises DatabaseError when there is none.
    """
    root = Path(path)
    if not root.exists():
        raise DatabaseError("profiling path does not exist", path=root)
    files = find_op_summaries(root)
    if not files:
        raise DatabaseError(
            "no op_summary_*.csv under mindstudio_profiler_output/ or device_*/summary/: "
            "export the msprof data (msprof --export=on) before reading it",
            path=root,
        )
    records: list[ProfiledKernel] = []
    for file in files:
        records.extend(iter_kernel_records(file, include_communication=include_communication))
    return records
