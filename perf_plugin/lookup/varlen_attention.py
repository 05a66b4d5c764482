"""Interpolation of packed (TND) flash attention rows by batch, request length and length spread.

A TND ``FlashAttentionScore`` row packs B requests of unequal lengths into one ``[T, N, D]`` query
(``perf_plugin.replay.kernels._flash_varlen``), the lengths in its ``Input Values`` (slots 8 and
9, cumulative ends; none: even).  Its work is ``2 * heads * pairs * 2D`` operations, ``pairs`` the
(query, key) pairs of every request (less the masked triangle when causal), and the bytes of its
query, key, value and output.  The replay runs the fused varlen kernel itself on CUDA and an NPU,
so the work is the kernel's.  Rows of the same heads, KV heads, head dim, mask and dtypes form a
family; inside it the efficiency against the roofline (``roofline.py``) is interpolated in
``log batch, log mean query length, log mean KV length`` (one axis where every row and the query
attend over their own tokens: a prefill) and ``log`` of the spread (the longest request over the
mean: 1 for even lengths), as ``attention.py`` does for ``FusedInferAttentionScore``.  A query
gives its lengths as the rows write them (``Query.input_values``); without them it asks for even
lengths.  Rows of the other layouts (SBH, BSH, BNSD, BSND) are not interpolated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from perf_plugin.database.schema import INPUT_VALUES
from perf_plugin.database.shapes import format_shape_cell
from perf_plugin.lookup import efficiency, transfer
from perf_plugin.lookup.answer import NONE, Answer, Query
from perf_plugin.lookup.peaks import DevicePeaks
from perf_plugin.lookup.roofline import Work, element_size, scale
from perf_plugin.lookup.rows import MeasuredRow
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels._flash_varlen import VarlenPlan, is_varlen, varlen_plan
from perf_plugin.replay.tensors import kernel_row_from_cells

KERNEL_TYPES = frozenset({"FlashAttentionScore"})
AXES = ("batch", "query length", "KV length", "spread", "heads")


def _plan(cells: Mapping[str, str]) -> VarlenPlan | None:
    try:
        row = kernel_row_from_cells("FlashAttentionScore", cells)
        return varlen_plan(row) if is_varlen(row) else None
    except (CaseBuildError, ValueError, IndexError):
        return None


TILE_Q, TILE_KV = 128, 64  # a flash kernel's tile of queries by keys (FlashAttention-2, head dim 128)


def _tile_pairs(q: int, kv: int, causal: bool) -> int:
    """The (query, key) pairs of the tiles a flash kernel computes for one request: every tile a
    query block reaches, whole, the masked part of the diagonal tiles included."""
    blocks = -(-q // TILE_Q)
    if not causal:
        return blocks * TILE_Q * -(-kv // TILE_KV) * TILE_KV
    total = 0
    for j in range(blocks):  # query block j sees keys up to its last query's diagonal (bottom-right)
        last = min(q, (j + 1) * TILE_Q) - 1 + kv - q
        total += -(-(last + 1) // TILE_KV)
    return total * TILE_Q * TILE_KV


def _work(plan: VarlenPlan, dtype: str) -> Work:
    pairs = sum(_tile_pairs(q, kv, plan.causal) for q, kv in zip(plan.q_lens, plan.kv_lens) if q)
    size = element_size(dtype) or 2
    nbytes = size * plan.head_dim * (2 * plan.tokens * plan.heads + 2 * sum(plan.kv_lens) * plan.kv_heads)
    return Work(2.0 * plan.heads * pairs * 2 * plan.head_dim, nbytes, dtype)


def _position(plan: VarlenPlan) -> tuple[float, float, float, float, float]:
    batch = len(plan.q_lens)
    mean_q = plan.tokens / batch
    # the spread to two decimals: whole-token lengths put one distribution's ratio a token off
    # from total to total (1638 / 1024 = 1.5996, 1229 / 768 = 1.6003), and rows of one ratio are a series
    return float(batch), mean_q, sum(plan.kv_lens) / batch, round(max(plan.q_lens) / mean_q, 2), float(plan.heads)


def _family(plan: VarlenPlan, dtypes: Sequence[str]) -> tuple[object, ...]:
    """Query heads per KV head, head dim, mask and dtypes: the heads themselves are an axis (a
    model's tensor-parallel sizes split them), along which the work grows and the kernel does not change."""
    return plan.heads // plan.kv_heads, plan.head_dim, plan.causal, tuple(dtypes[:3])


def _query_cells(query: Query) -> dict[str, str]:
    """The query as row cells; without outputs, attention_out alone (the softmax outputs the NPU
    kernel writes beside it do not change the family)."""
    outputs = list(query.output_shapes) or [None, None, None, query.input_shapes[0] if query.input_shapes else None]
    dtype = query.input_dtypes[0] if query.input_dtypes else ""
    cells = {"Input Shapes": format_shape_cell(list(query.input_shapes)),
             "Input Data Types": ";".join(query.input_dtypes),
             "Output Shapes": format_shape_cell(outputs),
             "Output Data Types": ";".join(query.output_dtypes) or f"FLOAT;FLOAT;{dtype};{dtype}"}
    if query.input_values:
        cells[INPUT_VALUES] = query.input_values
    return cells


def query_work(query: Query) -> Work | None:
    plan = _plan(_query_cells(query))
    return None if plan is None else _work(plan, query.input_dtypes[0])


def interpolate(query: Query, rows: Sequence[MeasuredRow], peaks: DevicePeaks | None) -> Answer:
    wanted = _plan(_query_cells(query))
    if wanted is None:
        return Answer(query, NONE, reason="only packed (TND) flash attention rows are interpolated: a 3-d query with "
                                          "actual_seq_qlen and actual_seq_kvlen (slots 8 and 9)")
    family = _family(wanted, query.input_dtypes)
    query_cost = _work(wanted, query.input_dtypes[0])
    used = peaks if peaks is not None and scale(query_cost, peaks) is not None else None
    points = []
    for row in rows:
        plan = _plan(row.cells) if row.duration_us is not None else None
        if plan is None or _family(plan, row.input_dtypes) != family:
            continue
        ideal = scale(_work(plan, row.input_dtypes[0]), used)
        if ideal is not None and row.duration_us is not None:
            points.append(efficiency.point(_position(plan), ideal, row.duration_us, row.line))
    ideal = scale(query_cost, used)
    assert ideal is not None
    points, target, axes = efficiency.one_length_axis(points, _position(wanted), AXES, "request length")
    return efficiency.answer(query, points, target, axes, ideal, "packed attention", used,
                             "fewer than two measured TND rows of these heads, dims, mask and dtypes",
                             narrowest=True, carry=transfer.every_series)
