"""Interpolation of fused attention rows by batch, query length and KV length.

An attention kernel's work is ``2 * heads * (query, key) pairs * (head dim + value dim)``
operations (causal rows attend to about half the pairs) and the bytes of its query, KV and output;
rows are read as the replay reads them (``perf_plugin.replay.kernels._fia_plan``: layouts, heads,
per-request lengths from the shapes and the ``avg_seq_len`` / ``Runtime ...`` columns).  Rows of
the same layouts, heads, head dims, paging and mask form one family; inside it the efficiency
against the roofline (``roofline.py``) is interpolated in ``log batch, log query length, log KV
length`` and ``log`` of the KV spread (the longest request's KV length over the mean: 1 for even
lengths) (``efficiency.py``), plus the deviation the family's other series show at the query's
value of the interpolated axis (``transfer.py``: an attention kernel's plan changes when the KV
length leaves a single block), and the query's time is its roofline time over that efficiency.

Rows the portable replay measured (CUDA, CPU) did the work that replay does, not the fused
kernel's: it pads unequal requests to the longest and computes the masked pairs too
(``_padded_pairs``), and runs one of three kernels (``FiaPlan.portable_kernel``), each a family
of its own.  Counting the fused kernel's work there put a ``spread 4`` prefill's efficiency between the
even and ``max_mean 4`` rows' where it is not: held-out P90 21.3 % over three distributions on an
H100, 5.88 % counting the replay's (docs/lookup.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import astuple

from perf_plugin.database.schema import MICROBENCH_AVERAGE, MICROBENCH_BACKEND
from perf_plugin.lookup import efficiency, transfer
from perf_plugin.lookup.answer import NONE, Answer, Query
from perf_plugin.lookup.peaks import DevicePeaks
from perf_plugin.lookup.roofline import Work, element_size, scale
from perf_plugin.lookup.rows import MeasuredRow
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels._fia_plan import FiaPlan, fia_plan
from perf_plugin.replay.tensors import kernel_row_from_cells

KERNEL_TYPES = frozenset({"FusedInferAttentionScore"})
# the longest request's KV over the mean (1: even lengths): a grid writes each shape once per
# length distribution (``perf_plugin.grid.length_distribution``), and the longest request bounds
# how long the kernel's last block of work runs
AXES = ("batch", "query length", "KV length", "KV spread")


def _plan(kernel_type: str, cells: Mapping[str, str]) -> FiaPlan | None:
    try:
        return fia_plan(kernel_row_from_cells(kernel_type, cells))
    except (CaseBuildError, ValueError, IndexError):
        return None


def _work(plan: FiaPlan, dtype: str, padded: bool = False) -> Work:
    """The operations and bytes of ``plan``'s call; ``padded``: as the portable replay computes it
    (``_padded_pairs``), rather than as the fused kernel does."""
    causal = plan.sparse_mode == 3
    pairs = (_padded_pairs(plan) if padded else
             sum(q * kv - (q * (q - 1) / 2 if causal else 0) for q, kv in zip(plan.q_lens, plan.kv_lens)))
    qk_dim = plan.head_dim + plan.rope_dim
    size = element_size(dtype) or 2
    tokens, kv_tokens = sum(plan.q_lens), sum(plan.kv_lens)
    nbytes = size * (tokens * plan.heads * (qk_dim + plan.value_dim) + kv_tokens * plan.kv_heads * (qk_dim + plan.value_dim))
    return Work(2.0 * plan.heads * pairs * (qk_dim + plan.value_dim), nbytes, dtype)


def _padded_pairs(plan: FiaPlan) -> float:
    """The (query, key) pairs the portable replay computes (``FiaPlan.portable_kernel``):
    every request padded to the longest query and the longest KV length, the masked pairs
    computed too, but where every request attends causally over its own equal tokens (one causal
    kernel, which skips the upper triangle)."""
    seq, span = max(plan.q_lens), plan.kv_span
    if plan.portable_kernel == "causal":
        return plan.batch * (seq * seq - seq * (seq - 1) / 2)
    return float(plan.batch * seq * span)


def _replayed_portably(rows: Sequence[MeasuredRow]) -> bool:
    """Whether the rows' durations are the portable replay's (CUDA, CPU), whose uneven requests
    are padded, rather than a fused kernel's (an NPU's replay, a profile's rows)."""
    measured = [row for row in rows if row.duration_us is not None]
    return bool(measured) and all(
        row.column == MICROBENCH_AVERAGE and row.cells.get(MICROBENCH_BACKEND, "") not in ("", "npu") for row in measured)


def _position(plan: FiaPlan) -> tuple[float, float, float, float]:
    mean_kv = sum(plan.kv_lens) / plan.batch
    return float(plan.batch), sum(plan.q_lens) / plan.batch, mean_kv, max(plan.kv_lens) / mean_kv


def _family(plan: FiaPlan, dtypes: Sequence[str]) -> tuple[object, ...]:
    fields = astuple(plan)
    # everything but the per-request lengths, which are the axes
    return (*fields[:7], *fields[9:], tuple(dtypes[:3]))


def _query_cells(query: Query) -> dict[str, str]:
    from perf_plugin.database.shapes import format_shape_cell

    return {"Input Shapes": format_shape_cell(list(query.input_shapes)),
            "Input Data Types": ";".join(query.input_dtypes), "Input Formats": ";".join(query.input_formats),
            "Output Shapes": format_shape_cell(list(query.output_shapes)),
            "Output Data Types": ";".join(query.output_dtypes or query.input_dtypes[:1]), **dict(query.attributes)}


def query_work(query: Query) -> Work | None:
    plan = _plan(query.kernel_type, _query_cells(query))
    return None if plan is None else _work(plan, query.input_dtypes[0])


def interpolate(query: Query, rows: Sequence[MeasuredRow], peaks: DevicePeaks | None) -> Answer:
    wanted = _plan(query.kernel_type, _query_cells(query))
    if wanted is None:
        return Answer(query, NONE, reason="the query's slots and columns do not read as an attention call "
                                          "(the replay's reason: run pytest bench on such a row)")
    family = _family(wanted, query.input_dtypes)
    members = []
    for row in rows:
        plan = _plan(query.kernel_type, row.cells) if row.duration_us is not None else None
        if plan is not None and _family(plan, row.input_dtypes) == family:
            members.append((row, plan))
    # the work as the rows' measurements did it, so that efficiency does not move with the spread
    # of the lengths: on CUDA a TND prefill of 4 uneven requests took 2x its even counterpart's
    # time per pair of the fused kernel's work, the padding's
    padded = _replayed_portably([row for row, _ in members])
    if padded:  # a causal, a masked and an unmasked kernel: three families
        members = [(row, plan) for row, plan in members if plan.portable_kernel == wanted.portable_kernel]
    query_work = _work(wanted, query.input_dtypes[0], padded)
    used = peaks if peaks is not None and scale(query_work, peaks) is not None else None
    points = []
    for row, plan in members:
        ideal = scale(_work(plan, row.input_dtypes[0], padded), used)
        assert row.duration_us is not None
        if ideal is not None:
            points.append(efficiency.point(_position(plan), ideal, row.duration_us, row.line))
    ideal = scale(query_work, used)
    assert ideal is not None
    points, target, axes = efficiency.one_length_axis(points, _position(wanted), AXES, "sequence length")
    return efficiency.answer(query, points, target, axes, ideal, "attention", used,
                             "fewer than two measured rows of these layouts, heads, dims and mask",
                             narrowest=True,  # no axis shares more with the query than another
                             carry=transfer.every_series)
