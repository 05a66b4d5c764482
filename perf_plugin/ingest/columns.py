"""Column names of the Ascend profiler tables ingest reads, and what each table must contain.

``kernel_details.csv`` (torch_npu profiler) and msprof's ``op_summary_*.csv`` are one table
under two sets of names.  Both have gone through header generations: ``Block Dim`` /
``Mix Block Dim`` became ``Block Num`` / ``Mix Block Num``; ``Step Id`` and ``Device_id``
appear only in some releases.  Ingest reads columns by name, so the generations differ only in
columns it does not use.  The hardware counters are the columns after ``Context ID``; which
ones appear depends on the ``aic_metrics`` setting (PipeUtilization gives ``aicore_time(us),
aic_total_cycles, aic_mac_time(us), ...``).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.file_kind import refuse_unusable_file
from perf_plugin.database.schema import IDENTITY_COLUMNS

TYPE = "Type"
NAME = "Name"
DURATION = "Duration(us)"
CONTEXT_ID = "Context ID"
ACCELERATOR_CORE = "Accelerator Core"

# op_summary name -> kernel_details name; every other column has the same name in both.
OP_SUMMARY_RENAMES: dict[str, str] = {
    "Op Name": NAME,
    "OP Type": TYPE,
    "Task Type": ACCELERATOR_CORE,
    "Task Start Time(us)": "Start Time(us)",
    "Task Duration(us)": DURATION,
    "Task Wait Time(us)": "Wait Time(us)",
}

# Columns a table needs before ingest can turn it into database rows.
REQUIRED_COLUMNS: tuple[str, ...] = (TYPE, *IDENTITY_COLUMNS, DURATION)

PROFILER_SETTING_HINT = (
    "profile with torch_npu.profiler._ExperimentalConfig("
    "profiler_level=torch_npu.profiler.ProfilerLevel.Level1 (or Level2), "
    "aic_metrics=torch_npu.profiler.AiCMetrics.PipeUtilization); "
    "Level0 records neither shapes nor hardware counters"
)


def is_op_summary_header(header: Sequence[str]) -> bool:
    return "OP Type" in header and "Op Name" in header


def canonical_header(header: Sequence[str]) -> list[str]:
    """kernel_details names for a header of either table."""
    if is_op_summary_header(header):
        return [OP_SUMMARY_RENAMES.get(name, name) for name in header]
    return list(header)


def counter_columns(header: Sequence[str]) -> list[str]:
    """The hardware counters: every column after ``Context ID`` (empty when it is missing)."""
    header = list(header)
    if CONTEXT_ID not in header:
        return []
    return [name for name in header[header.index(CONTEXT_ID) + 1 :] if name.strip()]


def missing_columns(canonical: Sequence[str], *, source_header: Sequence[str] | None = None) -> list[str]:
    """Required columns absent from a (canonical) header, in the names of the source table.

    A table without counter columns is also refused, as the origin parser did: the counters are
    part of the database schema, and their absence means the profile was taken at Level0 or
    without ``aic_metrics``.
    """
    present = set(canonical)
    renamed_back = {v: k for k, v in OP_SUMMARY_RENAMES.items()}
    op_summary = source_header is not None and is_op_summary_header(source_header)
    missing = [
        (renamed_back.get(name, name) if op_summary else name)
        for name in REQUIRED_COLUMNS
        if name not in present
    ]
    if not counter_columns(canonical):
        if CONTEXT_ID not in present:
            missing.append(CONTEXT_ID)
        missing.append("hardware counter columns after 'Context ID' (aicore_time(us), aiv_time(us), ...)")
    return missing


def read_raw_header(path: Path) -> list[str]:
    """The header line's names as written (byte-order mark removed)."""
    # public profiles, like public databases, may be Git LFS pointers in a clone
    refuse_unusable_file(path, origin="the repository the profile came from")
    try:
        with path.open("r", encoding="utf-8-sig", newline="") as handle:
            header = next(csv.reader(handle), None)
    except OSError as exc:
        raise DatabaseError(f"cannot read file: {exc.strerror}", path=path) from None
    except UnicodeDecodeError as exc:
        raise DatabaseError(f"not UTF-8 text (byte {exc.start})", path=path) from None
    except csv.Error as exc:
        raise DatabaseError(f"malformed CSV header: {exc}", path=path) from None
    if not header:
        raise DatabaseError("empty file: no header line", path=path)
    return header


def read_header(path: Path) -> list[str]:
    return [name.strip() for name in read_raw_header(path)]


def check_columns(path: Path, header: list[str]) -> list[str]:
    """The canonical header of a table; DatabaseError listing what is missing."""
    canonical = canonical_header(header)
    missing = missing_columns(canonical, source_header=header)
    if missing:
        raise DatabaseError(
            f"not a kernel table ingest can use: missing column(s) {', '.join(repr(m) for m in missing)}; "
            + PROFILER_SETTING_HINT,
            path=path,
        )
    return canonical
