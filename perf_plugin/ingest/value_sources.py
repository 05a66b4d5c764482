"""Say, on every row whose kernel's time depends on input values, where its values come from.

A kernel type declares such inputs (``OpReplay.data_inputs``: a grouped GEMM's group list).  Its
rows get ``Input Values Source``: ``measured`` where the row's ``Input Values`` cell holds the
model's values (an input-value capture ran, ``perf_plugin.capture``), else ``default: <what the
replay uses>``, and the ingest report counts the rows that took a default.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field

from perf_plugin.database.schema import INPUT_VALUES, INPUT_VALUES_SOURCE, MEASURED_VALUES
from perf_plugin.database.shapes import parse_shape_cell
from perf_plugin.ingest.aggregate import AggregatedRow
from perf_plugin.replay.registry import get_replay


@dataclass
class ValueSources:
    measured: int = 0
    defaulted: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kernel type, default) -> rows

    def lines(self) -> list[str]:
        if not self.measured and not self.defaulted:
            return []
        out = [f"rows whose time depends on input values: {self.measured} measured, "
               f"{sum(self.defaulted.values())} with a default"]
        for (kernel_type, default), rows in sorted(self.defaulted.items()):
            out.append(f"  {kernel_type}: {rows} row(s) replay {default} (profile with perf_plugin.capture to record them)")
        return out


def source_of(kernel_type: str, values_cell: str, shapes_cell: str = "") -> str | None:
    """The ``Input Values Source`` cell of a row, None for a kernel type with no data inputs or a
    row whose data slots hold no tensor (a FlashAttentionScore row of a layout without lengths).
    ``shapes_cell`` (the row's ``Input Shapes``) empty: every data slot is taken as present."""
    replay = get_replay(kernel_type)
    if replay is None or not replay.data_inputs:
        return None
    shapes = parse_shape_cell(shapes_cell) if shapes_cell.strip() else None
    data = [i for i in replay.data_inputs if shapes is None or (i < len(shapes) and shapes[i] is not None)]
    if not data:
        return None
    slots = parse_shape_cell(values_cell) if values_cell.strip() else []
    recorded = [i for i in data if i < len(slots) and slots[i] is not None]
    if recorded:
        return MEASURED_VALUES
    defaults = dict.fromkeys(replay.data_inputs[i] for i in data)
    return "default: " + ", ".join(defaults)


def with_value_sources(rows: list[AggregatedRow]) -> tuple[list[AggregatedRow], ValueSources]:
    sources = ValueSources()
    out = []
    for row in rows:
        source = source_of(row.kernel_type, row.cells.get(INPUT_VALUES, ""), row.cells.get("Input Shapes", ""))
        if source is None:
            out.append(row)
            continue
        if source == MEASURED_VALUES:
            sources.measured += 1
        else:
            sources.defaulted[(row.kernel_type, source.removeprefix("default: "))] += 1
        out.append(dataclasses.replace(row, runtime={**row.runtime, INPUT_VALUES_SOURCE: source}))
    return out, sources
