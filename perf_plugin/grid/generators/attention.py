"""Fused attention (``FusedInferAttentionScore``) rows.

The base environments are the per-rank attention sizes of each model and TP size
(``heads_per_rank``, ``kv_heads_per_rank`` with KV heads replicated below one per rank,
``head_dim``; for MLA models ``kv_lora_rank`` and ``qk_rope_head_dim``); the patterns in
``config.yaml`` cross them with batch sizes, query and KV lengths and block sizes, and lay the
tensors out the way the kernel receives them.  FIA takes 31 inputs in a fixed order (the
``FusedInferAttentionScore`` op definition: query, key, value, pse_shift, atten_mask,
actual_seq_lengths, actual_seq_lengths_kv, dequant_scale1, quant_scale1, dequant_scale2,
quant_scale2, quant_offset2, antiquant_scale, antiquant_offset, block_table,
query_padding_size, kv_padding_size, key/value antiquant scales and offsets, shared-prefix
inputs, query_rope, key_rope, ...); unused optional inputs stay as empty slots, exactly as the
profiler writes them, so a generated row has the slot count of a profiled one.

Layouts: ``TND`` (tokens of all requests packed, the vLLM-Ascend default; paged KV cache
``[num_blocks, block_size, kv_heads * head_dim]``), ``BSND`` and ``BNSD`` (padded batches; paged
cache ``[num_blocks, block_size, kv_heads * head_dim]`` and ``[num_blocks, kv_heads, block_size,
head_dim]``), and the MLA decode layout ``BNSD_NBSD`` (query ``[B, N, S, kv_lora_rank]`` with the
rotary part in ``query_rope``, output ``[N, B, S, kv_lora_rank]``).  The KV length of a row is
written in the ``avg_seq_len`` column (the shapes only bound it through the block table).

Options: ``kv_lengths`` (a list of ``even``, ``spread R``, ``max_mean R``;
``perf_plugin.grid.length_distribution``) writes every row once per distribution of its KV
lengths over its requests, the lengths in the ``Runtime actual_seq_lengths(_kv)_values`` columns
the replay reads and the distribution in ``Input Values Source``; ``avg_seq_len`` stays the mean.

``FlashAttentionGenerator`` (``flash_attention``): the same environments and option for
``FlashAttentionScore`` rows in the TND layout (packed prefill requests), the lengths in
``Input Values`` slots 8 and 9, where a capture writes a model's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perf_plugin.database.schema import INPUT_VALUES, INPUT_VALUES_SOURCE
from perf_plugin.grid.generators.base import PerRankGenerator
from perf_plugin.grid.length_distribution import parse_distributions, with_kv_lengths, with_packed_lengths
from perf_plugin.replay.kernels.mla_prefill import KV_VALUES, Q_VALUES


class AttentionGenerator(PerRankGenerator):
    """Base environments: ``ModelConfig.at_tp(tp)`` for every model and TP size."""

    def resolve_options(self, raw: Mapping[str, Any], grids: Mapping[str, tuple[int, ...]]) -> Mapping[str, Any]:
        unknown = set(raw) - {"kv_lengths"}
        if unknown:
            raise ValueError(f"generator {self.name!r} takes kv_lengths (got {', '.join(sorted(map(str, unknown)))})")
        distributions = parse_distributions(raw["kv_lengths"]) if "kv_lengths" in raw else ()
        return {"kv_lengths": distributions} if distributions else {}

    def row_columns(self, options: Mapping[str, Any]) -> tuple[str, ...]:
        return (Q_VALUES, KV_VALUES, INPUT_VALUES_SOURCE) if options.get("kv_lengths") else ()

    def variants(self, options: Mapping[str, Any], cells: dict[str, str]) -> list[dict[str, str]]:
        return with_kv_lengths(cells, options.get("kv_lengths", ()))


class FlashAttentionGenerator(AttentionGenerator):
    """``FlashAttentionScore`` TND rows: per distribution, the lengths in ``Input Values``."""

    def row_columns(self, options: Mapping[str, Any]) -> tuple[str, ...]:
        return (INPUT_VALUES, INPUT_VALUES_SOURCE) if options.get("kv_lengths") else ()

    def variants(self, options: Mapping[str, Any], cells: dict[str, str]) -> list[dict[str, str]]:
        return with_packed_lengths(cells, options.get("kv_lengths", ()))
