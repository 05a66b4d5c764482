"""Appending generated rows to the CSVs of one database directory.

For each selected kernel type, under the database lock: read the CSV (or start a new one),
learn the structures of its rows, expand every pattern of the kernel type's route, turn each
shape into the generator's variants (one row per expert load or KV length distribution), drop
the rows over the memory budget (each variant on its own shapes) and the rows whose signature
(``row_signature`` plus the route's extra columns, e.g. ``avg_seq_len``) is already in the file
or already generated, sample at most ``rows`` of the rest with ``seed``, and append them.

Existing rows are never changed.  The file is rewritten through ``CsvTable``, which keeps the
raw bytes of every unchanged record, so the old content stays a byte-identical prefix of the
new file, except when a column the generated rows carry is missing (``Row Origin``, or an extra
column of the route): adding a column gives every record one more (empty) cell at the end,
and their values are still unchanged.  Generated rows leave every duration and counter column
empty and say where they come from in ``Row Origin`` (``grid:<generator>:<model>``).  A pattern
that gives ``strides`` or ``arguments`` also writes the ``Input Strides`` and ``Op Arguments``
cells, in the form trace ingest writes them (rows replayed through ``torch.ops.aten``, such as
``aten._scaled_mm``); they are part of the signature, so an ingested row of the same call is
recognised as already in the file.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.lock import database_lock
from perf_plugin.database.paths import list_kernel_csvs
from perf_plugin.database.schema import (
    IDENTITY_COLUMNS,
    INPUT_STRIDES,
    OP_ARGUMENTS,
    REQUIRED_IDENTITY_COLUMNS,
    ROW_ORIGIN,
)
from perf_plugin.database.shapes import QuoteStyle, detect_quote_style, parse_shape_cell
from perf_plugin.database.signature import Signature
from perf_plugin.database.table import CsvTable
from perf_plugin.grid.config import GridConfig, KernelRoute, Pattern
from perf_plugin.grid.expand import Candidate, ExpandStats, expand
from perf_plugin.grid.memory import estimate_bytes
from perf_plugin.grid.models import ModelConfig
from perf_plugin.grid.templates import RowLayout, resolve_layout, source_structures
from perf_plugin.replay.registry import signature_of

ORIGIN_PREFIX = "grid"


def row_origin(generator: str, model: str) -> str:
    return f"{ORIGIN_PREFIX}:{generator}:{model}"


@dataclass(frozen=True)
class GridRequest:
    directory: Path
    config: GridConfig
    models: tuple[ModelConfig, ...]
    restricted: bool  # True when --target-models named the models
    rows: int  # at most this many new rows per CSV; 0 = no limit
    seed: int
    budget: int  # bytes
    kernel_types: tuple[str, ...] = ()  # empty: every routed kernel type that has a CSV
    dry_run: bool = False


@dataclass
class KernelReport:
    kernel_type: str
    path: Path
    created: bool
    evaluated: int = 0
    filtered: int = 0
    skipped: int = 0
    skip_reasons: list[str] = field(default_factory=list)
    over_budget: int = 0
    in_file: int = 0  # signature already in the CSV
    repeated: int = 0  # generated before in this run (same shape from another model or TP size)
    available: int = 0
    written: int = 0
    # rows a shape became beyond the first (one per expert load or KV length distribution): candidates
    # too, each over budget, repeated, in file or available on its own
    variants: int = 0
    default_structure_patterns: list[str] = field(default_factory=list)


def select_kernel_types(directory: Path, config: GridConfig, explicit: Sequence[str]) -> list[str]:
    """The kernel types to expand: the ones named, else every routed one with a CSV."""
    if explicit:
        return list(explicit)
    present = {path.stem for path in list_kernel_csvs(directory)}
    return [kernel_type for kernel_type in config.kernels if kernel_type in present]


_Key = tuple[Signature, tuple[str, ...]]


def _key(kernel_type: str, cells: dict[str, str], extra: tuple[str, ...]) -> _Key:
    return signature_of(kernel_type, cells), tuple(cells.get(name, "") for name in extra)


def _quote_style(table: CsvTable) -> QuoteStyle:
    values = [table.get(i, column) for i in range(len(table)) for column in ("Input Shapes", "Output Shapes")]
    return detect_quote_style(values) if values else QuoteStyle.PLAIN


def _row_cells(
    layout: RowLayout, pattern: Pattern, candidate: Candidate, identity: Sequence[str], style: QuoteStyle
) -> dict[str, str]:
    """A candidate's cells: the identity columns the table has, the pattern's extra columns, and
    the detail cells (``Input Strides``, ``Op Arguments``) of a pattern that gives them."""
    every = layout.cells(candidate.inputs, candidate.outputs, style)
    cells = {name: every[name] for name in identity}
    cells.update(zip(pattern.column_names, candidate.columns))
    if candidate.strides is not None:
        cells[INPUT_STRIDES] = layout.strides_cell(candidate.inputs, candidate.strides, style)
    if pattern.arguments:
        cells[OP_ARGUMENTS] = pattern.arguments
    return cells


def _fitting_variants(
    route: KernelRoute, layout: RowLayout, pattern: Pattern, candidate: Candidate, identity: Sequence[str],
    style: QuoteStyle, request: GridRequest, report: KernelReport,
) -> list[dict[str, str]]:
    """The rows a candidate becomes (one per expert load or KV length distribution) within the
    budget.  Each is estimated on its own shapes: a KV length distribution resizes a paged row's
    block table and caches, so a variant may be over the budget where its even row is not, or under it."""
    base = estimate_bytes(
        candidate.inputs, candidate.outputs, layout.in_itemsizes, layout.out_itemsizes, candidate.workspace
    )
    cells = _row_cells(layout, pattern, candidate, identity, style)
    variants = route.generator.variants(route.options, cells)
    report.variants += len(variants) - 1
    fitting = []
    for variant in variants:
        nbytes = base
        shapes = variant["Input Shapes"], variant["Output Shapes"]
        if shapes != (cells["Input Shapes"], cells["Output Shapes"]):  # the workspace follows the query: unchanged
            inputs, outputs = (parse_shape_cell(cell) for cell in shapes)
            nbytes = estimate_bytes(inputs, outputs, layout.in_itemsizes, layout.out_itemsizes, candidate.workspace)
        if nbytes > request.budget:
            report.over_budget += 1
        else:
            fitting.append(variant)
    return fitting


def plan_rows(
    kernel_type: str, route: KernelRoute, table: CsvTable, request: GridRequest, report: KernelReport
) -> list[dict[str, str]]:
    """The rows to append to ``table`` (sampled), counting what was dropped in ``report``."""
    for column in REQUIRED_IDENTITY_COLUMNS:
        table.index(column)  # DatabaseError naming the file and the missing column
    # an older database without OP State / Accelerator Core keeps its columns as they are
    identity = [c for c in IDENTITY_COLUMNS if table.has_column(c)]
    extra = route.column_names
    style = _quote_style(table)
    existing: set[_Key] = {_key(kernel_type, table.row_dict(i), extra) for i in range(len(table))}
    seen: set[_Key] = set()
    sources = source_structures(table)
    stats = ExpandStats()
    accepted: list[dict[str, str]] = []
    for pattern in route.patterns:
        layout = resolve_layout(route, pattern, sources)
        if layout.inherited_from is None:
            report.default_structure_patterns.append(pattern.name)
        envs = route.generator.base_envs(request.models, route.options, request.restricted)
        for candidate in expand(pattern, envs, stats):
            for variant in _fitting_variants(route, layout, pattern, candidate, identity, style, request, report):
                key = _key(kernel_type, variant, extra)
                if key in seen:
                    report.repeated += 1
                    continue
                seen.add(key)
                if key in existing:
                    report.in_file += 1
                    continue
                variant[ROW_ORIGIN] = row_origin(route.generator.name, candidate.model)
                accepted.append(variant)
    report.evaluated = stats.evaluated
    report.filtered = stats.filtered
    report.skipped = stats.skipped_total
    report.skip_reasons = [f"{reason} ({count}x)" for reason, count in stats.skipped.most_common(3)]
    report.available = len(accepted)
    if request.rows and len(accepted) > request.rows:
        picked = sorted(random.Random(request.seed).sample(range(len(accepted)), request.rows))
        accepted = [accepted[i] for i in picked]
    report.written = len(accepted)
    return accepted


def _expand_kernel(kernel_type: str, route: KernelRoute, request: GridRequest) -> KernelReport:
    path = request.directory / f"{kernel_type}.csv"
    exists = path.exists()
    if exists:
        table = CsvTable.read(path)
    else:
        table = CsvTable.new(list(IDENTITY_COLUMNS) + list(route.written_columns) + [ROW_ORIGIN])
    report = KernelReport(kernel_type, path, created=not exists)
    rows = plan_rows(kernel_type, route, table, request, report)
    if rows and not request.dry_run:
        for column in route.written_columns + (ROW_ORIGIN,):
            if not table.has_column(column):
                table.insert_column(column)
        for row in rows:
            table.append_row(row)
        table.write(path)
    return report


def run_grid(request: GridRequest) -> list[KernelReport]:
    """Expand every selected kernel type; returns one report per kernel type."""
    directory = request.directory
    if directory.exists() and not directory.is_dir():
        raise DatabaseError("database path is not a directory", path=directory)
    if not directory.is_dir() and not request.kernel_types:
        raise DatabaseError(
            "database directory does not exist (name kernel types with --kernel-types to start new CSVs)",
            path=directory,
        )
    kernel_types = select_kernel_types(directory, request.config, request.kernel_types)
    routes = [(kt, request.config.kernels[kt]) for kt in kernel_types]
    if request.dry_run:
        return [_expand_kernel(kt, route, request) for kt, route in routes]
    directory.mkdir(parents=True, exist_ok=True)
    with database_lock(directory):
        return [_expand_kernel(kt, route, request) for kt, route in routes]
