"""KV length distributions for attention rows: how a grid spreads a batch's context over its requests.

An attention kernel's time depends on more than the batch's mean KV length: the work is split
over the cores by request (and head), so the request with the longest context can set the
critical path while short ones leave cores idle.  So ``perfdb grid`` writes each
``FusedInferAttentionScore`` row once per distribution of the route's ``kv_lengths`` option (as
it writes GroupedMatmul rows once per expert load), and a simulator can read the cost of a batch
of unequal requests, not only of its mean.  A distribution is one of:

* ``even``: every request at the row's mean (the rows the grid wrote before this option: the
  cells are unchanged apart from the label);
* ``spread R``: lengths evenly spaced from the longest (first) down to the shortest, longest /
  shortest = R, with the same mean;
* ``max_mean R``: the first request gets R times the mean (capped so that every other request
  keeps its minimum), the others share the rest evenly.

Lengths are whole tokens that keep the batch's total (batch x mean) exactly, by the largest
remainder as ``perf_plugin.grid.expert_load`` does, so ``avg_seq_len`` stays the row's mean.
Every request keeps at least one token; a paged decode request at least its query length (a
request attends over the tokens it decodes, and the causal mask needs them); a request that
would fall below that is raised to it and the others scaled down (then the ratio is below R).

Where the lengths go is where the replay reads them (``perf_plugin.replay.kernels._fia_plan``):

* paged rows (a block table): ``Runtime actual_seq_lengths_kv_values``, plain per-request
  lengths.  The block table gets the longest request's block count as its width and the caches
  (slot 0 of key, value and key_rope) as many blocks as the requests occupy together (the even
  row's ``batch x blocks``: the kernel reads only the blocks the table names);
* contiguous ``TND`` rows whose query and KV are the same packed requests (prefill):
  ``Runtime actual_seq_lengths_values`` and ``Runtime actual_seq_lengths_kv_values``, both
  cumulative ends; the shapes do not change.

Other rows (contiguous BSND/BNSD, whose shapes pad every request to the longest, or rows the
replay cannot read) are written once, unchanged and unlabelled.

``FlashAttentionScore`` rows in the TND layout (packed requests, ``perf_plugin.replay.kernels.
_flash_varlen``) whose query and KV are the same requests get the lengths as each request's
cumulative end in ``Input Values`` slots 8 and 9 (``actual_seq_qlen``, ``actual_seq_kvlen``),
where a capture writes a model's (``with_packed_lengths``).  A distribution that gives the
lengths an earlier one gave is skipped, and lengths equal to the row's own (every distribution
of a batch of one) give the even row: such a row is written once, labelled ``even``.  The label
is ``Input Values Source``: ``grid: kv even``, ``grid: kv spread 4``, ``grid: kv max_mean 4``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import accumulate

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.schema import INPUT_VALUES, INPUT_VALUES_SOURCE
from perf_plugin.database.shapes import QuoteStyle, format_shape_cell, parse_shape_cell
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels._fia_plan import BLOCK_TABLE, K_ROPE, KEY, VALUE, FiaPlan, fia_plan
from perf_plugin.replay.kernels._flash_varlen import KV_LENS, Q_LENS, VarlenPlan, varlen_plan
from perf_plugin.replay.kernels.mla_prefill import KV_VALUES, Q_VALUES
from perf_plugin.replay.tensors import kernel_row_from_cells

KERNEL_TYPE = "FusedInferAttentionScore"
SOURCE_PREFIX = "grid: kv "
_EXPECTED = "expected 'even', 'spread R' or 'max_mean R' (R >= 1)"


@dataclass(frozen=True)
class LengthDistribution:
    kind: str  # even | spread | max_mean
    parameter: float = 1.0  # R of spread and max_mean

    @property
    def label(self) -> str:
        return self.kind if self.kind == "even" else f"{self.kind} {self.parameter:g}"

    def weights(self, parts: int) -> list[Fraction]:
        """Each request's length in units of the mean, before clamping (exact: the floors of the
        largest remainder must not depend on float rounding)."""
        ratio = Fraction(self.parameter)
        if self.kind == "spread" and parts > 1:
            shortest = Fraction(2) / (1 + ratio)  # evenly spaced from R*a down to a, mean 1
            step = (ratio - 1) * shortest / (parts - 1)
            return [shortest * ratio - step * i for i in range(parts)]
        if self.kind == "max_mean" and parts > 1:  # may go negative for R > parts: clamped
            return [ratio] + [(parts - ratio) / (parts - 1)] * (parts - 1)
        return [Fraction(1)] * parts

    def lengths(self, total: int, parts: int, minimum: int = 1) -> tuple[int, ...]:
        """``parts`` whole lengths of at least ``minimum``, summing to ``total``."""
        if parts < 1 or minimum < 1 or total < parts * minimum:
            raise ValueError(f"{total} tokens cannot make {parts} requests of at least {minimum}")
        return _lengths(self, total, parts, minimum)


# A grid asks for the same few (total, batch) pairs for every model and TP size; exact fractions
# over a batch of 256 take milliseconds, so each is worked out once.
@functools.lru_cache(maxsize=1 << 12)
def _lengths(distribution: LengthDistribution, total: int, parts: int, minimum: int) -> tuple[int, ...]:
    mean = Fraction(total, parts)
    exact = [w * mean for w in distribution.weights(parts)]
    return _largest_remainder(_clamped(exact, total, minimum), total)


def _clamped(exact: list[Fraction], total: int, minimum: int) -> list[Fraction]:
    """``exact`` with every value below ``minimum`` raised to it and the others scaled down to keep
    the sum; repeated, as scaling down may take another value below (at most once per value)."""
    fixed: set[int] = set()
    values = list(exact)
    while low := {i for i, v in enumerate(values) if i not in fixed and v < minimum}:
        fixed |= low
        free = [i for i in range(len(values)) if i not in fixed]
        # free is never empty and its values are positive: total >= parts * minimum, so the values,
        # which always sum to total, cannot all lie below minimum
        scale = Fraction(total - minimum * len(fixed)) / sum((exact[i] for i in free), Fraction(0))
        values = [Fraction(minimum) if i in fixed else exact[i] * scale for i in range(len(values))]
    return values


def _largest_remainder(values: Sequence[Fraction], total: int) -> tuple[int, ...]:
    sizes = [math.floor(v) for v in values]
    by_remainder = sorted(range(len(values)), key=lambda i: (-(values[i] - sizes[i]), i))
    for i in by_remainder[: total - sum(sizes)]:
        sizes[i] += 1
    return tuple(sizes)


def parse_distribution(text: object) -> LengthDistribution:
    """``even``, ``spread R`` or ``max_mean R`` (R >= 1, finite); ValueError otherwise."""
    kind, _, value = str(text).strip().partition(" ")
    value = value.strip()
    if kind == "even" and not value:
        return LengthDistribution("even")
    try:
        parameter = float(value)
    except ValueError:
        raise ValueError(f"KV length distribution {text!r}: {_EXPECTED}") from None
    if kind in ("spread", "max_mean") and math.isfinite(parameter) and parameter >= 1:
        return LengthDistribution(kind, parameter)
    raise ValueError(f"KV length distribution {text!r}: {_EXPECTED}")


def parse_distributions(raw: object) -> tuple[LengthDistribution, ...]:
    """The ``kv_lengths`` option: a list of distributions."""
    if not isinstance(raw, list):
        raise ValueError("kv_lengths: expected a list such as [even, spread 4, max_mean 4]")
    return tuple(parse_distribution(text) for text in raw)


# ------------------------------------------------------------------ the rows
def _expandable(plan: FiaPlan) -> tuple[int, int] | None:
    """(total KV tokens, least tokens per request) of a row whose lengths the grid can vary."""
    total = sum(plan.kv_lens)
    if plan.block_size and total >= plan.batch * max(plan.q_lens):
        return total, max(plan.q_lens)
    if not plan.block_size and plan.layout == "TND" and plan.q_lens == plan.kv_lens:
        return total, 1
    return None


def _paged_row(cells: dict[str, str], plan: FiaPlan, lengths: Sequence[int]) -> dict[str, str]:
    """``cells`` with the block table and caches resized for ``lengths`` and the lengths written."""
    blocks = [math.ceil(n / plan.block_size) for n in lengths]
    shapes = parse_shape_cell(cells["Input Shapes"])
    for slot in (KEY, VALUE, K_ROPE):
        shape = shapes[slot] if slot < len(shapes) else None
        if shape is not None:
            shapes[slot] = (sum(blocks), *shape[1:])
    shapes[BLOCK_TABLE] = (len(lengths), max(blocks))
    style = QuoteStyle.EMBEDDED if cells["Input Shapes"].startswith('"') else QuoteStyle.PLAIN  # the file's
    return {**cells, "Input Shapes": format_shape_cell(shapes, style), KV_VALUES: ",".join(map(str, lengths))}


def _packed_row(cells: dict[str, str], lengths: Sequence[int]) -> dict[str, str]:
    ends = ",".join(map(str, accumulate(lengths)))
    return {**cells, Q_VALUES: ends, KV_VALUES: ends}


def row_plan(cells: dict[str, str]) -> FiaPlan | None:
    """The replay's plan of a generated row; None when the replay cannot read it."""
    try:
        return fia_plan(kernel_row_from_cells(KERNEL_TYPE, cells))
    except (CaseBuildError, DatabaseError):
        return None


def with_kv_lengths(cells: dict[str, str], distributions: Sequence[LengthDistribution]) -> list[dict[str, str]]:
    """One row per distribution that gives new lengths: ``cells`` with the per-request KV lengths
    where the replay reads them and the distribution named in ``Input Values Source``."""
    plan = row_plan(cells) if distributions else None
    expandable = _expandable(plan) if plan is not None else None
    if plan is None or expandable is None:
        return [cells]
    total, minimum = expandable
    out: list[dict[str, str]] = []
    seen: set[tuple[int, ...]] = set()
    for distribution in distributions:
        lengths = distribution.lengths(total, plan.batch, minimum)
        if lengths in seen:
            continue
        seen.add(lengths)
        if lengths == plan.kv_lens:  # every request at the mean: the row as it was
            out.append({**cells, INPUT_VALUES_SOURCE: SOURCE_PREFIX + "even"})
            continue
        row = _paged_row(cells, plan, lengths) if plan.block_size else _packed_row(cells, lengths)
        out.append({**row, INPUT_VALUES_SOURCE: SOURCE_PREFIX + distribution.label})
    return out


def _packed_plan(cells: dict[str, str]) -> VarlenPlan | None:
    """The plan of a generated TND FlashAttentionScore row; None when the replay cannot read it."""
    try:
        return varlen_plan(kernel_row_from_cells("FlashAttentionScore", cells))
    except (CaseBuildError, DatabaseError):
        return None


def with_packed_lengths(cells: dict[str, str], distributions: Sequence[LengthDistribution]) -> list[dict[str, str]]:
    """One TND ``FlashAttentionScore`` row per distribution that gives new lengths to its packed
    requests (query and KV the same requests), written as ``Input Values`` slots 8 and 9, the
    distribution in ``Input Values Source``; the even split stays the row as it was (the replay's
    default), labelled ``even``."""
    plan = _packed_plan(cells) if distributions else None
    if plan is None or plan.q_lens != plan.kv_lens:
        return [cells]
    style = QuoteStyle.EMBEDDED if cells["Input Shapes"].startswith('"') else QuoteStyle.PLAIN
    out: list[dict[str, str]] = []
    seen: set[tuple[int, ...]] = set()
    for distribution in distributions:
        lengths = distribution.lengths(plan.tokens, len(plan.q_lens))
        if lengths in seen:
            continue
        seen.add(lengths)
        if lengths == plan.q_lens:
            out.append({**cells, INPUT_VALUES_SOURCE: SOURCE_PREFIX + "even"})
            continue
        ends = tuple(accumulate(lengths))
        values = format_shape_cell([None] * Q_LENS + [ends] * (KV_LENS - Q_LENS + 1), style)
        out.append({**cells, INPUT_VALUES: values, INPUT_VALUES_SOURCE: SOURCE_PREFIX + distribution.label})
    return out
