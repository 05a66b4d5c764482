"""Inputs drawn from the values a model gave them: a row's ``Input Values`` and ``Profiling Input Quantiles``.

``recorded_values`` reads the integer values a capture recorded for a slot (a grouped GEMM's
group list, packed attention's sequence lengths), which the replays build their inputs from.

Where an input-value capture recorded quantiles of a floating input (top-k's: how close its
values lie sets how soon the radix selection ends), the replay draws that input from them
instead of its default range: each element at a uniformly drawn rank, linearly between the two
quantiles around it (the nearer of the two where one is infinite: scores masked to ``-inf``).
Equal neighbouring quantiles draw that very value, so ties in the model's input are ties in the
replay's.

Quantiles do not say how close each row's k-th value lies to the rest of its row, which sets how
far a radix selection reads (``perf_plugin.capture.selection_depth``): where the row records its
calls' ``Profiling Selection Depths``, the drawn rows are rebuilt to as many rows at each depth
(``with_recorded_depths``), spread over the rows at random.

Where a capture recorded the share of a floating input's elements that were zero (a division's
operands: a zero numerator takes the device's slower division), the replay sets as many of its
drawn elements, chosen at random, to zero (``with_zero_share``): its default draws hold none.

Where a capture recorded how much of a softmax's input was masked (far below its row's maximum:
the slower exponential) and in how many runs per row, the replay masks as many of each row's
elements, in as many runs at random places (``with_masked_runs``), at the dtype's lowest value
(a ``transformers`` mask's: a row masked whole stays finite).  Every row gets the mean share: a
causal mask's rows, masked from none to almost all, were timed as fast as rows masked half each
in one run (52.3 and 52.2 us on an H200, ``reproduce/wip/softmax_masked_values.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perf_plugin.capture.selection_depth import DTYPES, depths_for_rows, with_depth
from perf_plugin.database.depths_cell import parse_depths_cell
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.masked_shares_cell import parse_masked_shares_cell
from perf_plugin.database.quantiles_cell import parse_quantiles_cell
from perf_plugin.database.schema import (
    INPUT_VALUES,
    PROFILING_INPUT_MASKED_SHARES,
    PROFILING_INPUT_QUANTILES,
    PROFILING_INPUT_ZERO_SHARES,
    PROFILING_SELECTION_DEPTHS,
)
from perf_plugin.database.shapes import parse_shape_cell
from perf_plugin.database.shares_cell import parse_shares_cell
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


def recorded_depths(row: KernelRow) -> tuple[dict[int, int] | None, ...]:
    """Per input slot the selection depths the row carries (None where it has none); () without the cell."""
    try:
        return parse_depths_cell(row.attrs.get(PROFILING_SELECTION_DEPTHS, ""))
    except DatabaseError as exc:
        raise CaseBuildError(f"'{PROFILING_SELECTION_DEPTHS}' {exc}") from None


def with_recorded_depths(x: "torch.Tensor", k: int, dim: int, largest: bool, histogram: dict[int, int],
                         generator: "torch.Generator") -> "torch.Tensor":
    """``x`` with its rows along ``dim`` rebuilt to ``histogram``'s selection depths for the
    k-th largest (or smallest) value, the depths dealt to rows in a random order."""
    import torch

    dtype = str(x.dtype).removeprefix("torch.")
    if dtype not in DTYPES or x.dim() == 0:
        return x
    moved = x.movedim(dim, -1)
    rows = moved.reshape(-1, moved.shape[-1]).tolist()
    depths = depths_for_rows(histogram, len(rows))
    if not depths:
        return x
    dealt = [depths[rank] for rank in torch.randperm(len(rows), generator=generator, device=generator.device).tolist()]
    rebuilt = [with_depth(row, k, largest, dtype, depth) for row, depth in zip(rows, dealt)]
    table = torch.tensor(rebuilt, dtype=x.dtype, device=x.device)
    return table.view(moved.shape).movedim(-1, dim).contiguous()


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


def recorded_shares(row: KernelRow, column: str) -> tuple[float | None, ...]:
    """Per input slot the share the row's ``column`` carries (``Profiling Input Zero Shares``,
    ``Profiling Input Distinct Shares``; None where it has none); () without the cell."""
    try:
        return parse_shares_cell(row.attrs.get(column, ""))
    except DatabaseError as exc:
        raise CaseBuildError(f"'{column}' {exc}") from None


def recorded_zero_shares(row: KernelRow) -> tuple[float | None, ...]:
    """Per input slot the share of zero elements the row carries (None where it has none); () without the cell."""
    return recorded_shares(row, PROFILING_INPUT_ZERO_SHARES)


def with_zero_share(x: "torch.Tensor", share: float | None, generator: "torch.Generator",
                    avoid: "torch.Tensor | None" = None) -> "torch.Tensor":
    """``x`` with ``share`` of its elements (rounded to a whole number of them), chosen at random,
    set to zero in place; ``x`` as it is for no share or a tensor that is not floating.  Where
    ``avoid`` has ``x``'s shape, its zero elements are not chosen (a zero over a zero is a NaN the
    model did not make)."""
    import torch

    if not share or not x.is_floating_point() or x.numel() == 0:
        return x
    allowed = torch.ones(x.numel(), dtype=torch.bool, device=generator.device)
    if avoid is not None and avoid.shape == x.shape:
        allowed = (avoid != 0).reshape(-1).to(generator.device)
    candidates = torch.nonzero(allowed).squeeze(1)
    order = torch.randperm(candidates.numel(), generator=generator, device=generator.device)
    chosen = candidates[order[: round(share * x.numel())]].to(x.device)
    x[torch.unravel_index(chosen, x.shape)] = 0
    return x


def recorded_masked_shares(row: KernelRow) -> tuple[tuple[float, float] | None, ...]:
    """Per input slot the (masked share, runs per row) the row carries (None where it has none); () without the cell."""
    try:
        return parse_masked_shares_cell(row.attrs.get(PROFILING_INPUT_MASKED_SHARES, ""))
    except DatabaseError as exc:
        raise CaseBuildError(f"'{PROFILING_INPUT_MASKED_SHARES}' {exc}") from None


def masked_runs(rows: int, width: int, share: float, runs: float, generator: "torch.Generator") -> "torch.Tensor":
    """A [rows, width] boolean mask: in every row ``round(share * width)`` elements masked, in
    ``round(runs)`` runs (at least one; at most as many as fit apart) of near-equal lengths, the
    runs at random places with at least one unmasked element between two of them."""
    import torch

    count = min(width, round(share * width))
    device = generator.device
    if count == 0:
        return torch.zeros(rows, width, dtype=torch.bool, device=device)
    parts = max(1, min(round(runs), count, width - count + 1))
    lengths = [count // parts + (1 if i < count % parts else 0) for i in range(parts)]
    spare = width - count - (parts - 1)  # the unmasked elements not needed to keep the runs apart
    # run i starts after the i-th smallest of ``parts`` cuts in [0, spare], the earlier runs and their i gaps
    cuts = torch.randint(0, spare + 1, (rows, parts), generator=generator, device=device).sort(dim=1).values
    before = torch.tensor([i + sum(lengths[:i]) for i in range(parts)], device=device)
    starts = cuts + before
    edges = torch.zeros(rows, width + 1, dtype=torch.int32, device=device)
    edges.scatter_add_(1, starts, torch.ones_like(starts, dtype=torch.int32))
    edges.scatter_add_(1, starts + torch.tensor(lengths, device=device), torch.full_like(starts, -1, dtype=torch.int32))
    return edges.cumsum(dim=1)[:, :width] > 0


def with_masked_runs(x: "torch.Tensor", recorded: tuple[float, float] | None,
                     generator: "torch.Generator") -> "torch.Tensor":
    """``x`` with each row along its last dimension masked as ``recorded`` (share, runs per row)
    says, at its dtype's lowest value, in place; ``x`` as it is without a record or a share."""
    import torch

    if recorded is None or not recorded[0] or not x.is_floating_point() or x.dim() == 0 or x.numel() == 0:
        return x
    width = x.shape[-1]
    mask = masked_runs(x.numel() // width, width, *recorded, generator)
    return x.masked_fill_(mask.to(x.device).view(x.shape), torch.finfo(x.dtype).min)
