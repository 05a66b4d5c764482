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
"""

from __future__ import annotations

from perf_plugin.grid.generators.base import PerRankGenerator


class AttentionGenerator(PerRankGenerator):
    """Base environments: ``ModelConfig.at_tp(tp)`` for every model and TP size."""
