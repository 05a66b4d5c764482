"""Inputs drawn from the values a model gave them: a row's ``Input Values`` and ``Profiling Input Quantiles``.

``recorded_values`` reads the integer values a capture recorded for a slot (a grouped GEMM's
group list, packed attention's sequence lengths), which the replays build their inputs from.

Where an input-value capture recorded quantiles of a floating input (top-k's: how close its
values lie sets how soon the radix selection ends), the replay draws that input from them
instead of its default range: each element at a uniformly drawn rank, linearly between the two
quantiles around it (the nearer of the two where one is infinite: scores masked to ``-inf``).
Equal neighbouring quantiles draw that very value, so ties in the model's input are ties in the
replay's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.quantiles_cell import parse_quantiles_cell
from perf_plugin.database.schema import INPUT_VALUES, PROFILING_INPUT_QUANTILES
from perf_plugin.database.shapes import parse_shape_cell
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.tensors import KernelRow

if TYPE_CHECKING:
    import torch


def recorded_values(row: KernelRow, slot: int) -> tuple[int, ...] | None:
    """The values the row's ``Input Values`` cell holds for input ``slot``; None where it holds none."""
    cell = row.attrs.get(INPUT_VALUES, "").strip().strip('"')
    if not cell:
        return None
    try:
        slots = parse_shape_cell(cell)
    except (ValueError, DatabaseError) as exc:
        raise CaseBuildError(f"'{INPUT_VALUES}' cell {cell!r} cannot be read: {exc}") from None
    values = slots[slot] if slot < len(slots) else None
    return tuple(values) if values is not None else None


def recorded_quantiles(row: KernelRow) -> tuple[tuple[float, ...] | None, ...]:
    """Per input slot the quantiles the row carries (None where it has none); () without the cell."""
    try:
        return parse_quantiles_cell(row.attrs.get(PROFILING_INPUT_QUANTILES, ""))
    except DatabaseError as exc:
        raise CaseBuildError(f"'{PROFILING_INPUT_QUANTILES}' {exc}") from None


def draw_from_quantiles(
    quantiles: tuple[float, ...], count: int, dtype: "torch.dtype", device: "torch.device", generator: "torch.Generator"
) -> Any:
    """``count`` values (a flat tensor of ``dtype``) distributed as ``quantiles`` say."""
    import torch

    table = torch.tensor(quantiles, dtype=torch.float64, device=device)
    rank = torch.rand(count, dtype=torch.float64, device=device, generator=generator) * (len(quantiles) - 1)
    low = rank.floor().clamp(max=len(quantiles) - 2).long()
    below, above, share = table[low], table[low + 1], rank - low
    between = below + share * (above - below)
    # a step to or from an infinity (scores masked to -inf) is no line: the nearer end
    nearer = torch.where(share < 0.5, below, above)
    return torch.where(below.isfinite() & above.isfinite(), between, nearer).to(dtype)
