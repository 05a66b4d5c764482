"""Expert loads for grouped-GEMM rows: how a grid spreads a row's tokens over its experts.

A grouped GEMM's time depends on how many rows each expert gets (a group that spills into one
more M-tile reads its expert's weights once more), so ``perfdb grid`` writes each MoE GEMM shape
once per load of the route's ``expert_loads`` option, with the rows per expert in the row's
``Input Values`` cell (the group list's slot, cumulative ends) and the load named in
``Input Values Source`` (``grid: zipf 1.0``).  A load is one of:

* ``balanced``: as even as the rows allow (what load balancing aims for);
* ``zipf S``: expert ``i`` (from 0) gets a share proportional to ``1 / (i + 1) ** S``; S = 0 is
  balanced, S = 1 gives the first expert about 2.7 times the mean of 8 experts;
* ``max_mean R``: the busiest expert gets R times the mean (at most every row), the others
  share the rest evenly.

Shares become whole rows by the largest remainder, so the sizes always sum to the row count.
"""

from __future__ import annotations

from dataclasses import dataclass

from perf_plugin.database.schema import INPUT_VALUES, INPUT_VALUES_SOURCE
from perf_plugin.database.shapes import QuoteStyle, format_shape_cell, parse_shape_cell

SOURCE_PREFIX = "grid: "


@dataclass(frozen=True)
class ExpertLoad:
    kind: str  # balanced | zipf | max_mean
    parameter: float = 0.0

    @property
    def label(self) -> str:
        return self.kind if self.kind == "balanced" else f"{self.kind} {self.parameter:g}"

    def shares(self, experts: int) -> list[float]:
        if self.kind == "zipf":
            weights = [1.0 / (i + 1) ** self.parameter for i in range(experts)]
        elif self.kind == "max_mean" and experts > 1:
            top = min(self.parameter / experts, 1.0)
            weights = [top] + [(1.0 - top) / (experts - 1)] * (experts - 1)
        else:
            weights = [1.0] * experts
        total = sum(weights)
        return [w / total for w in weights]

    def sizes(self, rows: int, experts: int) -> tuple[int, ...]:
        """Rows per expert, summing to ``rows``."""
        exact = [share * rows for share in self.shares(experts)]
        sizes = [int(value) for value in exact]
        by_remainder = sorted(range(experts), key=lambda i: (-(exact[i] - sizes[i]), i))
        for i in by_remainder[: rows - sum(sizes)]:
            sizes[i] += 1
        return tuple(sizes)


def parse_load(text: str) -> ExpertLoad:
    """``balanced``, ``zipf S`` or ``max_mean R`` (S >= 0, R >= 1); ValueError otherwise."""
    kind, _, value = str(text).strip().partition(" ")
    if kind == "balanced" and not value:
        return ExpertLoad("balanced")
    try:
        parameter = float(value)
    except ValueError:
        raise ValueError(f"expert load {text!r}: expected 'balanced', 'zipf S' or 'max_mean R'") from None
    if kind == "zipf" and parameter >= 0:
        return ExpertLoad("zipf", parameter)
    if kind == "max_mean" and parameter >= 1:
        return ExpertLoad("max_mean", parameter)
    raise ValueError(f"expert load {text!r}: expected 'balanced', 'zipf S' (S >= 0) or 'max_mean R' (R >= 1)")


def with_loads(cells: dict[str, str], loads: tuple[ExpertLoad, ...], group_slot: int) -> list[dict[str, str]]:
    """One row per load: ``cells`` with the rows per expert of its first input ``[M, K]`` over
    the ``[E]`` group list at ``group_slot``, as cumulative ends in ``Input Values``."""
    shapes = parse_shape_cell(cells["Input Shapes"])
    x = shapes[0] if shapes else None
    group_list = shapes[group_slot] if group_slot < len(shapes) else None
    if not loads or x is None or group_list is None or len(group_list) != 1:
        return [cells]
    rows, experts = x[0], group_list[0]
    style = QuoteStyle.EMBEDDED if cells["Input Shapes"].startswith('"') else QuoteStyle.PLAIN  # the file's
    out = []
    for load in loads:
        ends, total = [], 0
        for size in load.sizes(rows, experts):
            total += size
            ends.append(total)
        slots: list[tuple[int, ...] | None] = [None] * group_slot + [tuple(ends)]
        out.append({**cells, INPUT_VALUES: format_shape_cell(slots, style),
                    INPUT_VALUES_SOURCE: SOURCE_PREFIX + load.label})
    return out
