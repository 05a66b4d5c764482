"""Column names of the compute CSVs and where new columns go.

Identity columns come first, in a fixed order.  Ingest writes the ``Profiling ...`` columns;
write-back places ``Average Duration(us)`` before the profiling duration columns and each
``MicroBench <counter>`` before its ``Profiling Average <counter>``.  Columns this project adds
go at the end.  Unknown columns are never touched.  ``MICROBENCH_STATISTICS`` says which
statistic each duration column of a measurement holds.
"""

from __future__ import annotations

from collections.abc import Mapping

from perf_plugin.database.table import CsvTable

IDENTITY_COLUMNS: tuple[str, ...] = (
    "OP State",
    "Accelerator Core",
    "Input Shapes",
    "Input Data Types",
    "Input Formats",
    "Output Shapes",
    "Output Data Types",
    "Output Formats",
)
# The columns a row needs to become a replay case (OP State / Accelerator Core are metadata).
REQUIRED_IDENTITY_COLUMNS: tuple[str, ...] = (
    "Input Shapes",
    "Input Data Types",
    "Output Shapes",
    "Output Data Types",
)
SIGNATURE_COLUMNS: tuple[str, ...] = (
    "Input Shapes",
    "Input Data Types",
    "Input Formats",
    "Output Shapes",
    "Output Data Types",
)
# What a PyTorch trace records about a call beyond shapes and dtypes, kept where it changes what
# the kernel does: the strides of inputs that are not contiguous (a view read in place), and
# for operators replayed through ``torch.ops.aten`` the call's arguments (scalars, lists, which
# argument is which tensor slot).  Written at the end of the row, empty when there is nothing to
# say; a non-empty cell is part of the row's signature.
INPUT_STRIDES = "Input Strides"
OP_ARGUMENTS = "Op Arguments"
# The values of small integer inputs a kernel's time depends on rather than their shapes (the
# rows per expert of a grouped GEMM), per input slot in the shape cells' format, as a capture
# recorded them in the model (perf_plugin.capture); calls that saw other values are other rows.
INPUT_VALUES = "Input Values"
DETAIL_COLUMNS: tuple[str, ...] = (INPUT_STRIDES, OP_ARGUMENTS, INPUT_VALUES)
# Where a data-dependent row's values come from: ``measured`` (the ``Input Values`` cell), or
# ``default: <what the replay draws>`` when the profile did not record them.  Not an identity.
INPUT_VALUES_SOURCE = "Input Values Source"
MEASURED_VALUES = "measured"

PROFILING_AVERAGE = "Profiling Average Duration(us)"
PROFILING_MEDIAN = "Profiling Median Duration(us)"
PROFILING_STD = "Profiling Std Duration(us)"
PROFILING_DURATION_COLUMNS: tuple[str, ...] = (PROFILING_AVERAGE, PROFILING_MEDIAN, PROFILING_STD)
PROFILING_COUNTER_PREFIX = "Profiling Average "
PROFILING_COUNT = "Profiling Count"  # launches aggregated into the row (written at the end)
# The device kernels the operator launched in the profile (a PyTorch trace with device activity),
# in the format of ``MicroBench Kernels`` (perf_plugin.database.kernel_breakdown).
PROFILING_KERNELS = "Profiling Kernels"
# Per input slot, the bytes the device moved between the input's write and the kernel reading it
# in the profiled model (perf_plugin.database.reuse_cell): which inputs a replay leaves in the cache.
PROFILING_INPUT_REUSE = "Profiling Input Reuse Distance(B)"
# Per input slot, half the range of bytes moved over which the input's bytes were last used (the
# cell's format is the distance's): its bytes lie that far either side of the distance, and a
# replay keeps the share of them its cache would still hold (perf_plugin.replay.cold_inputs).
PROFILING_INPUT_REUSE_SPREAD = "Profiling Input Reuse Spread(B)"
# Per input slot, the distances of each eighth of the row's calls, where they differ
# (perf_plugin.database.reuse_calls_cell): a replay reads its inputs from where each eighth of the
# model's calls found them, on an eighth of its repeats each (perf_plugin.replay.cold_inputs).
PROFILING_INPUT_REUSE_CALLS = "Profiling Input Reuse Calls(B)"
# Per input slot, the bytes the device moved between the last use of the input's memory before
# its producer wrote it and that write (the median over the row's calls; the cell's format is the
# distance's; only where an execution trace named the storages: perf_plugin.ingest.input_reuse).
# A producer that writes part of a sector whose line has left the cache leaves it partly valid, and
# the reader fetches the rest from memory; a replay writes such an input as its producer did
# (perf_plugin.replay.cache_modes.produce_inputs).
PROFILING_INPUT_BLOCK_REUSE = "Profiling Input Block Reuse Distance(B)"
# Per input slot, quantiles of the values a floating input held in the profiled model, where an
# input-value capture recorded them (top-k's input: perf_plugin.database.quantiles_cell).
# A replay draws that input from them; a row without the cell draws its default.
PROFILING_INPUT_QUANTILES = "Profiling Input Quantiles"
# Per input slot, how many of a top-k input's rows selected their k-th value at each depth (the
# leading bits it shares with its nearest neighbour: perf_plugin.capture.selection_depth), summed
# over the row's calls (perf_plugin.database.depths_cell).  A replay rebuilds its drawn rows to them.
PROFILING_SELECTION_DEPTHS = "Profiling Selection Depths"
# Per input slot, the share of a floating input's elements that were zero in the profiled model,
# where an input-value capture recorded it (a division's operands: a zero numerator takes the
# device's slower path; a batched GEMM's: zero operands multiply faster;
# perf_plugin.database.shares_cell).  A replay zeroes that share.
PROFILING_INPUT_ZERO_SHARES = "Profiling Input Zero Shares"
# Per input slot, the share of an integer index input's values that were distinct in the profiled
# model, where an input-value capture recorded it (a gather ``x[index]``: an MoE layer's
# permutation reads every row once, its dispatch each token top-k times; a uniform draw with
# repetition reads about 63 % of the rows once; perf_plugin.database.shares_cell).  A replay draws
# that share of distinct indices.
PROFILING_INPUT_DISTINCT_SHARES = "Profiling Input Distinct Shares"
# Per input slot, the share of a softmax input's elements that were masked in the profiled model
# (far below their row's maximum: the device's slower exponential) and how many runs of them a
# row held, where an input-value capture recorded them (perf_plugin.database.masked_shares_cell).
# A replay masks that share of its input's rows in as many runs.
PROFILING_INPUT_MASKED_SHARES = "Profiling Input Masked Shares"
RAW_DURATION = "Duration(us)"
# A counter of PyTorch traces with device activity: 1 for a launch that began when the device had
# finished every earlier activity (a host-bound phase such as decode), 0 for one queued behind
# running work.  Its ``Profiling Average`` column is the share of the row's launches that began
# on an idle device; ``--perf-cache-mode auto`` replays each row in the context it had.
LAUNCHED_IDLE = "Launched Idle"
# A counter of PyTorch traces with device activity: per launch, how many distinct kernels the
# device ran since the operator's kernels last ran (perf_plugin.ingest.code_reuse), at most
# CODE_REUSE_CAP (none for a kernel the profile ran for the first time).  A replay evicts the
# instruction caches before each repeat unless the row's average says the model found its code
# there (perf_plugin.replay.code_eviction).
CODE_REUSE = "Code Reuse Distance(kernels)"
CODE_REUSE_CAP = 64
# A counter of PyTorch traces with device activity: per launch, the share of the traffic just
# before it (the last 64 MiB) that was writes (perf_plugin.ingest.write_share).  Its average is the
# dirty share of the last-level cache the kernel started with; a replay in ``produced`` mode
# writes that share of its cache before every repeat (perf_plugin.replay.dirty_lines).
RECENT_WRITE_SHARE = "Recent Write Share"
# The median over the row's calls of the bytes the device moved since the previous call of the
# operator's kernels began (perf_plugin.ingest.code_reuse), ``-`` where most calls had no earlier
# one: a replay whose instruction caches the model left cold keeps the kernel's code in the
# last-level cache where this is below the share of it a working set survives in
# (perf_plugin.replay.code_eviction).
PROFILING_CODE_REUSE = "Profiling Code Reuse Distance(B)"

# Microbench columns written back by a replay run.
MICROBENCH_AVERAGE = "Average Duration(us)"
MICROBENCH_COUNTER_PREFIX = "MicroBench "
MICROBENCH_MEDIAN = "MicroBench Median Duration(us)"
MICROBENCH_MIN = "MicroBench Min Duration(us)"
MICROBENCH_STD = "MicroBench Std Duration(us)"
MICROBENCH_SAMPLES = "MicroBench Samples"
MICROBENCH_BACKEND = "MicroBench Backend"
MICROBENCH_TIMESTAMP = "MicroBench Timestamp"
MICROBENCH_KERNELS = "MicroBench Kernels"
ROW_ORIGIN = "Row Origin"
ADDED_COLUMNS: tuple[str, ...] = (
    MICROBENCH_MEDIAN,
    MICROBENCH_MIN,
    MICROBENCH_STD,
    MICROBENCH_SAMPLES,
    MICROBENCH_BACKEND,
    MICROBENCH_TIMESTAMP,
    MICROBENCH_KERNELS,
    ROW_ORIGIN,
)

# Lookup order of a simulator: microbench first, then the profiled average, then a raw duration.
DURATION_PREFERENCE: tuple[str, ...] = (MICROBENCH_AVERAGE, PROFILING_AVERAGE, RAW_DURATION)

# The statistic each duration column of a measurement holds, over the row's timed repeats (the
# samples after the verification run and the warm-ups).  Every name says its statistic, and
# ``Average Duration(us)`` keeps the mean: the Ascend performance model reads that column first,
# and msmodeling's own writer stores the minimum of all launches there, so the minimum has a
# column of its own.  A filled ``MicroBench Samples`` cell marks a row this project measured.
# Write-back writes exactly these; docs/ascend-reader-contract.md is the contract.
MICROBENCH_STATISTICS: dict[str, str] = {
    MICROBENCH_AVERAGE: "mean",
    MICROBENCH_MEDIAN: "median",
    MICROBENCH_MIN: "minimum",
    MICROBENCH_STD: "std",
    MICROBENCH_SAMPLES: "count",
}
STATISTIC_MEANINGS: dict[str, str] = {
    "mean": "arithmetic mean of the timed repeats (us)",
    "median": "median of the timed repeats, the mean of the middle two for an even count (us)",
    "minimum": "smallest timed repeat (us)",
    "std": "population standard deviation of the timed repeats (us)",
    "count": "number of timed repeats the statistics are over",
}
# ``MicroBench <counter>``: the counter's mean over the timed repeats (launches on an NPU).
MICROBENCH_COUNTER_MEANING = "mean of the hardware counter over the timed repeats"


def written_column_meanings() -> dict[str, str]:
    """What each measurement column write-back fills holds, for the run report."""
    meanings = {column: STATISTIC_MEANINGS[statistic] for column, statistic in MICROBENCH_STATISTICS.items()}
    meanings[microbench_counter_column("<counter>")] = MICROBENCH_COUNTER_MEANING
    return meanings


def microbench_counter_column(counter: str) -> str:
    return f"{MICROBENCH_COUNTER_PREFIX}{counter}"


def profiling_counter_column(counter: str) -> str:
    return f"{PROFILING_COUNTER_PREFIX}{counter}"


def ensure_microbench_average_column(table: CsvTable) -> None:
    """Insert ``Average Duration(us)`` before the profiling duration columns (or after identity)."""
    if table.has_column(MICROBENCH_AVERAGE):
        return
    for anchor in (PROFILING_AVERAGE, RAW_DURATION):
        if table.has_column(anchor):
            table.insert_column(MICROBENCH_AVERAGE, table.index(anchor))
            return
    last_identity = max((table.index(c) for c in IDENTITY_COLUMNS if table.has_column(c)), default=-1)
    table.insert_column(MICROBENCH_AVERAGE, last_identity + 1)


def ensure_microbench_counter_column(table: CsvTable, counter: str) -> str:
    """Insert ``MicroBench <counter>`` before ``Profiling Average <counter>`` (or at the end)."""
    name = microbench_counter_column(counter)
    if not table.has_column(name):
        anchor = profiling_counter_column(counter)
        table.insert_column(name, table.index(anchor) if table.has_column(anchor) else None)
    return name


def ensure_added_columns(table: CsvTable, names: tuple[str, ...] = ADDED_COLUMNS) -> None:
    for name in names:
        if not table.has_column(name):
            table.insert_column(name)


# Cells that say "no value" in real profiler exports, as opposed to junk in a duration column.
NOT_AVAILABLE = frozenset({"n/a", "na", "-"})


def _cell_text(value: str) -> str:
    return value.strip().strip('"').strip()


def parse_duration(value: str) -> float | None:
    """A positive, finite duration from a cell, or None for empty / N/A / zero / junk."""
    text = _cell_text(value)
    if not text:
        return None
    try:
        number = float(text)
    except ValueError:
        return None
    if number != number or number in (float("inf"), float("-inf")) or number <= 0:
        return None
    return number


def is_junk_duration(value: str) -> bool:
    """A duration cell that is neither empty, a "no value" spelling, nor a number."""
    text = _cell_text(value)
    if not text or text.lower() in NOT_AVAILABLE:
        return False
    try:
        float(text)
    except ValueError:
        return True
    return False


def preferred_duration(cells: Mapping[str, str]) -> tuple[float | None, str]:
    """A row's duration as the Ascend reader reads it: the first of ``DURATION_PREFERENCE`` with a
    valid value, and that column's name (None and "" when none has one)."""
    for column in DURATION_PREFERENCE:
        value = parse_duration(cells.get(column, ""))
        if value is not None:
            return value, column
    return None, ""


def row_has_valid_duration(table: CsvTable, row: int) -> bool:
    return any(parse_duration(table.get(row, column)) is not None for column in DURATION_PREFERENCE)


def format_number(value: float, digits: int = 3) -> str:
    """Compact fixed-point text: 12.5 -> '12.5', 3.0 -> '3', 0.0004 -> '0' at 3 digits."""
    text = f"{value:.{digits}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text
