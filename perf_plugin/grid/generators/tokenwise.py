"""Norms, RoPE and element-wise kernels: per-rank model sizes times token counts.

RmsNorm, RotaryPositionEmbedding, Add, Mul, Muls, Cast, SwiGlu, SoftmaxV2, Transpose, Slice,
GatherV2, TensorMove and ConcatD rows are shaped by the hidden sizes, head counts and widths a
model has on one rank (``heads_per_rank``, ``intermediate_per_rank``, ``vocab_per_rank``...) and
by the number of tokens in the step, which the patterns take from a token grid.  The three
generator names ``norm``, ``rope`` and ``elementwise`` share this implementation; the name shows
in the ``Row Origin`` column of the rows they produce.
"""

from __future__ import annotations

from perf_plugin.grid.generators.base import PerRankGenerator


class TokenwiseGenerator(PerRankGenerator):
    """Base environments: ``ModelConfig.at_tp(tp)`` for every model and TP size it serves with."""
