"""Kernel samples -> one database row per (kernel type, signature cells).

Grouping key
------------
Samples are grouped by the normalised ``Type`` and the raw ``Input Shapes, Input Data Types,
Input Formats, Output Shapes, Output Data Types`` cells.  The origin parser grouped by
``(Type, Input Shapes, Output Shapes)`` only, which merges kernels that differ in dtype; real
profiles contain such pairs (in a CNN training step, ``Cast`` of shape ``32`` runs once as
BOOL->FLOAT and once as INT64->INT32), and they replay and perform differently.  The key here is
the signature's five columns as the profiler wrote them, so no two rows of one profile ever
describe the same kernel twice and no row mixes two kernels.  The remaining identity cells
(``OP State``, ``Accelerator Core``, ``Output Formats``) are taken from the group's first sample.

Statistics
----------
* ``Profiling Average Duration(us)``: arithmetic mean of the samples' ``Duration(us)``.
* ``Profiling Median Duration(us)``: median (mean of the two middle samples for an even count).
* ``Profiling Std Duration(us)``: the *sample* standard deviation (``ddof=1``).  The samples are
  a few draws of the kernel's run-to-run distribution and the column is read as the spread to
  expect on the next run, for which the sample estimator is the unbiased one; it is also what
  pandas-based tools, and therefore existing databases, report.  With a single sample it is
  undefined and the cell is left empty (``Profiling Count`` says why).
* ``Profiling Average <counter>``: mean of each counter over the samples that have a value
  (``N/A`` cells are skipped, not counted as zero); empty when no sample has one.
* ``Profiling Count``: the number of samples averaged (an added column, written last).
* ``Profiling Kernels`` (traces with device activity only): the device kernels the calls
  launched, each with its mean time per call over the group's samples, in the format of
  ``MicroBench Kernels`` (``perf_plugin.database.kernel_breakdown``), so that a run can tell
  whether the replay launched the kernels the model did.
* ``Profiling Input Reuse Distance(B)`` (traces with device activity only): per input slot, the
  median over the calls of the bytes moved since the input was written
  (``perf_plugin.ingest.input_reuse``).

Numbers are written with at most 6 decimals (trailing zeros dropped): profiler durations have
nanosecond resolution (3 decimals in microseconds), so 6 decimals keep every mean exact to well
below what was measured without printing binary rounding noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from perf_plugin.database.kernel_breakdown import format_breakdown
from perf_plugin.database.depths_cell import depths_cell
from perf_plugin.database.masked_shares_cell import masked_shares_cell
from perf_plugin.database.quantiles_cell import quantiles_cell
from perf_plugin.database.shares_cell import shares_cell
from perf_plugin.database.reuse_calls_cell import reuse_calls_cell
from perf_plugin.database.reuse_cell import NO_PRODUCER, reuse_cell
from perf_plugin.database.schema import (
    DETAIL_COLUMNS,
    IDENTITY_COLUMNS,
    PROFILING_AVERAGE,
    PROFILING_CODE_REUSE,
    PROFILING_COUNT,
    PROFILING_INPUT_DISTINCT_SHARES,
    PROFILING_INPUT_MASKED_SHARES,
    PROFILING_INPUT_QUANTILES,
    PROFILING_INPUT_ZERO_SHARES,
    PROFILING_INPUT_REUSE,
    PROFILING_INPUT_BLOCK_REUSE,
    PROFILING_INPUT_REUSE_CALLS,
    PROFILING_INPUT_REUSE_SPREAD,
    PROFILING_KERNELS,
    PROFILING_MEDIAN,
    PROFILING_SELECTION_DEPTHS,
    PROFILING_STD,
    format_number,
    profiling_counter_column,
)
from perf_plugin.ingest import columns as col

DIGITS = 6
# Frame column of a trace sample's device time per kernel name (a dict; absent for tables
# without device kernels, such as Ascend kernel_details, whose rows are single kernels).
KERNEL_TIMES = "_kernel_ns"
# Frame column of a trace sample's reuse distance per input slot (a tuple; traces with device kernels).
INPUT_REUSE = "_input_reuse"
# Frame column of a trace sample's half-range of those distances per input slot (a tuple; likewise).
INPUT_REUSE_SPREAD = "_input_reuse_spread"
# Frame column of a trace sample's inputs' block reuse distances (a tuple per input slot, ``math.inf``
# where unknown: perf_plugin.ingest.input_reuse.InputReuse; traces with an execution trace).
INPUT_BLOCK_REUSE = "_input_block_reuse"
# Frame column of a trace sample's code reuse distance in bytes (a float; traces with device kernels).
CODE_REUSE_BYTES = "_code_reuse_bytes"
# Frame column of a trace sample's floating inputs' quantiles, as a capture recorded them (a dict of
# argument position -> quantiles; traces with an input-value capture).
INPUT_QUANTILES = "_input_quantiles"
# Frame column of a trace sample's top-k inputs' selection depths (argument position -> depth -> rows), likewise.
INPUT_DEPTHS = "_input_depths"
# Frame column of a trace sample's floating inputs' shares of zero elements (argument position -> share), likewise.
INPUT_ZEROS = "_input_zeros"
# Frame column of a trace sample's softmax inputs' masked elements (argument position -> (share, runs per row)), likewise.
INPUT_MASKED = "_input_masked"
# Frame column of a trace sample's index inputs' shares of distinct values (argument position -> share), likewise.
INPUT_DISTINCT = "_input_distinct"
# The frame columns a capture's values fill, each a dict per sample ({} where the call recorded
# none), and how a row's cell is made of its samples'.
CAPTURED_CELLS: dict[str, Callable[[list[Any]], str]] = {
    INPUT_QUANTILES: quantiles_cell, INPUT_DEPTHS: depths_cell, INPUT_ZEROS: shares_cell,
    INPUT_MASKED: masked_shares_cell, INPUT_DISTINCT: shares_cell}
CAPTURED_COLUMNS = tuple(CAPTURED_CELLS)
GROUP_KEY: tuple[str, ...] = (
    col.TYPE,
    "Input Shapes",
    "Input Data Types",
    "Input Formats",
    "Output Shapes",
    "Output Data Types",
)
_FROM_FIRST_SAMPLE = tuple(name for name in IDENTITY_COLUMNS if name not in GROUP_KEY)


# The text cells ingest writes after ``Profiling Count``, in the header order of a new file, and
# the ``AggregatedRow`` field that holds each ("" where a row has none).
TEXT_CELLS: tuple[tuple[str, str], ...] = (
    (PROFILING_KERNELS, "kernels"),
    (PROFILING_INPUT_REUSE, "input_reuse"),
    (PROFILING_CODE_REUSE, "code_reuse"),
    (PROFILING_INPUT_QUANTILES, "input_quantiles"),
    (PROFILING_SELECTION_DEPTHS, "selection_depths"),
    (PROFILING_INPUT_REUSE_SPREAD, "input_reuse_spread"),
    (PROFILING_INPUT_REUSE_CALLS, "input_reuse_calls"),
    (PROFILING_INPUT_BLOCK_REUSE, "input_block_reuse"),
    (PROFILING_INPUT_ZERO_SHARES, "input_zero_shares"),
    (PROFILING_INPUT_MASKED_SHARES, "input_masked_shares"),
    (PROFILING_INPUT_DISTINCT_SHARES, "input_distinct_shares"),
)


@dataclass(frozen=True)
class AggregatedRow:
    """One database row: identity cells as the profiler wrote them, and the statistics."""

    kernel_type: str
    cells: Mapping[str, str]
    count: int
    average: float
    median: float
    std: float | None
    counters: Mapping[str, float | None] = field(default_factory=dict)
    kernels: str = ""  # the Profiling Kernels cell ("" when the samples recorded none)
    input_reuse: str = ""  # the Profiling Input Reuse Distance(B) cell ("" when not known)
    input_reuse_spread: str = ""  # the Profiling Input Reuse Spread(B) cell (likewise)
    input_reuse_calls: str = ""  # the Profiling Input Reuse Calls(B) cell ("" where the calls agree)
    input_block_reuse: str = ""  # the Profiling Input Block Reuse Distance(B) cell ("" when not known)
    code_reuse: str = ""  # the Profiling Code Reuse Distance(B) cell ("" when not known)
    input_quantiles: str = ""  # the Profiling Input Quantiles cell ("" when no call recorded them)
    selection_depths: str = ""  # the Profiling Selection Depths cell (likewise)
    input_zero_shares: str = ""  # the Profiling Input Zero Shares cell ("" where no call had a zero)
    input_masked_shares: str = ""  # the Profiling Input Masked Shares cell ("" where no call had a masked element)
    input_distinct_shares: str = ""  # the Profiling Input Distinct Shares cell ("" where no call recorded them)
    # Columns added at the end from beside the profile (the FIA bundle check's ``Runtime ...``
    # cells, ``perf_plugin.ingest.fia_bundle``); not part of the identity or the statistics.
    runtime: Mapping[str, str] = field(default_factory=dict)

    def profiling_values(self) -> dict[str, str]:
        """Column -> cell text of everything ingest writes besides the identity columns."""
        values = {
            PROFILING_AVERAGE: format_value(self.average),
            PROFILING_MEDIAN: format_value(self.median),
            PROFILING_STD: format_value(self.std),
        }
        for counter, value in self.counters.items():
            values[profiling_counter_column(counter)] = format_value(value)
        values[PROFILING_COUNT] = str(self.count)
        for column, name in TEXT_CELLS:
            cell = getattr(self, name)
            if cell:
                values[column] = cell
        return values


def format_value(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return format_number(float(value), DIGITS)


def _identity(group_key: Sequence[str], key: Sequence[Any], first: Sequence[Any],
              details: Sequence[str]) -> tuple[str, dict[str, str]]:
    """A group's kernel type and identity cells: its key's, its first sample's, its detail cells."""
    cells = dict(zip(group_key, (_text(v) for v in key)))
    kernel_type = cells.pop(col.TYPE)
    for j, name in enumerate(_FROM_FIRST_SAMPLE):
        cells[name] = _text(first[j])
    identity = {name: cells[name] for name in IDENTITY_COLUMNS}
    identity.update({name: cells[name] for name in details if cells[name]})
    return kernel_type, identity


# The text fields of a row and the statistics' column each comes from.
_TEXT_FIELDS = {"kernels": "kernels", "input_reuse": "reuse", "input_reuse_spread": "reuse_spread",
                "input_reuse_calls": "reuse_calls", "input_block_reuse": "block_reuse", "code_reuse": "code_reuse", "input_quantiles": INPUT_QUANTILES, "selection_depths": INPUT_DEPTHS,
                "input_zero_shares": INPUT_ZEROS, "input_masked_shares": INPUT_MASKED,
                "input_distinct_shares": INPUT_DISTINCT}


def aggregate(frame: pd.DataFrame, counters: list[str]) -> list[AggregatedRow]:
    """Aggregate samples; rows come out grouped by kernel type, in order of first appearance.

    A trace's detail columns (strides, aten arguments) tell calls apart too, where the frame has them.
    """
    if frame.empty:
        return []
    details = [name for name in DETAIL_COLUMNS if name in frame.columns]
    group_key = (*GROUP_KEY, *details)
    frame = frame.assign(_order=np.arange(len(frame)))
    groups = frame.groupby(list(group_key), observed=True, sort=False, dropna=False)
    reuse_columns = [name for name in (INPUT_REUSE, INPUT_REUSE_SPREAD, INPUT_BLOCK_REUSE) if name in frame.columns]
    stats = _group_statistics(groups, with_kernels=KERNEL_TIMES in frame.columns, reuse_columns=reuse_columns)
    _add_captured_cells(stats, groups, frame)
    first = groups[list(_FROM_FIRST_SAMPLE)].first()
    counter_means = groups[counters].mean() if counters else pd.DataFrame(index=stats.index)
    # All results share the group order of ``stats``; reorder them together, by first sample.
    order = np.argsort(stats["order"].to_numpy(), kind="stable")
    stats, first, counter_means = stats.iloc[order], first.iloc[order], counter_means.iloc[order]

    rows: list[AggregatedRow] = []
    first_cells = first.to_numpy(dtype=object)
    means_table = counter_means.to_numpy(dtype=float) if counters else None
    counts = stats["count"].to_numpy(dtype=np.int64)
    averages, medians = stats["average"].to_numpy(dtype=float), stats["median"].to_numpy(dtype=float)
    stds = stats["std"].to_numpy(dtype=float)
    text_cells = {field: stats[name].tolist() if name in stats.columns else [""] * len(stats)
                  for field, name in _TEXT_FIELDS.items()}

    def text_fields(i: int) -> dict[str, Any]:  # the row's text cells, by AggregatedRow field
        return {field: str(cells[i]) for field, cells in text_cells.items()}

    for i, key in enumerate(stats.index):
        kernel_type, identity = _identity(group_key, key, first_cells[i], details)
        means = means_table[i] if means_table is not None else ()
        rows.append(
            AggregatedRow(
                kernel_type=kernel_type,
                cells=identity,
                count=int(counts[i]),
                average=float(averages[i]),
                median=float(medians[i]),
                std=None if math.isnan(stds[i]) else float(stds[i]),
                counters={
                    name: (None if math.isnan(means[j]) else float(means[j])) for j, name in enumerate(counters)
                },
                **text_fields(i),
            )
        )
    # One CSV per kernel type: keep each type's rows together, types in order of first appearance.
    position = {name: i for i, name in enumerate(dict.fromkeys(row.kernel_type for row in rows))}
    rows.sort(key=lambda row: position[row.kernel_type])
    return rows


def _add_captured_cells(stats: pd.DataFrame, groups: Any, frame: pd.DataFrame) -> None:
    """Each group's cells of what a capture recorded of its calls' values (top-k's input)."""
    for name, cell in CAPTURED_CELLS.items():
        if name in frame.columns:
            stats[name] = groups[name].agg(lambda samples, cell=cell: cell(list(samples)))


def _group_statistics(groups: Any, with_kernels: bool, reuse_columns: Sequence[str]) -> pd.DataFrame:
    """Count, mean, median and sample std of each group's durations, its first sample's position,
    and (for traces with device kernels) its kernel breakdown and inputs' reuse distances."""
    duration = groups[col.DURATION]
    stats = pd.DataFrame(
        {
            "count": duration.count(),
            "average": duration.mean(),
            "median": duration.median(),
            "std": duration.std(ddof=1),
            "order": groups["_order"].min(),
        }
    )
    if with_kernels:
        stats["kernels"] = groups[KERNEL_TIMES].agg(_mean_kernel_times)
    if INPUT_REUSE_SPREAD in reuse_columns:
        stats["reuse_spread"] = groups[INPUT_REUSE_SPREAD].agg(lambda samples: reuse_cell(list(samples)))
    if INPUT_BLOCK_REUSE in reuse_columns:
        stats["block_reuse"] = groups[INPUT_BLOCK_REUSE].agg(_known_reuse_cell)
    if INPUT_REUSE in reuse_columns:
        stats["reuse"] = groups[INPUT_REUSE].agg(lambda samples: reuse_cell(list(samples)))
        stats["reuse_calls"] = groups[INPUT_REUSE].agg(lambda samples: reuse_calls_cell(list(samples)))
        # the code's distance is a cell of one slot, with the same median and ``-``
        stats["code_reuse"] = groups[CODE_REUSE_BYTES].agg(lambda samples: reuse_cell([(d,) for d in samples]))
    return stats


def _known_reuse_cell(samples: pd.Series) -> str:
    """A group's reuse cell (``reuse_cell``), or "" where no slot of any call is known."""
    cell = reuse_cell(list(samples))
    return cell if any(token != NO_PRODUCER for token in cell.split(";")) else ""


def _mean_kernel_times(samples: pd.Series) -> str:
    """The breakdown cell of a group: each kernel's device time per call, over all its calls."""
    totals: dict[str, int] = {}
    for times in samples:
        for name, ns in times.items():
            totals[name] = totals.get(name, 0) + ns
    calls = len(samples)
    return format_breakdown({name: ns / 1000.0 / calls for name, ns in totals.items()})


def _text(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)
