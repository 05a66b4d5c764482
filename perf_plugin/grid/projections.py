"""The GEMM (N, K) pairs a model needs at each tensor-parallel size.

A linear layer ``y[M,N] = x[M,K] @ W[N,K]^T`` runs as one MatMul per rank with the rank's shard
of ``W``.  This module lists exactly these projections (vLLM's sharding: column-parallel layers
split N, row-parallel layers split K, replicated layers split nothing):

Attention, GQA models (``kv_lora_rank == 0``)
    ``qkv_proj``  N = (heads/tp + 2 * kv_heads_per_rank) * head_dim, K = hidden (merged QKV,
                  column parallel; ``kv_heads_per_rank`` is 1 when kv_heads < tp: the KV heads
                  are replicated, not split, so N is *not* (heads + 2*kv_heads)*head_dim/tp there)
    ``o_proj``    N = hidden, K = heads/tp * head_dim (row parallel)
Attention, MLA models (DeepSeek-V3)
    ``fused_qkv_a_proj``   N = q_lora_rank + kv_lora_rank + qk_rope_head_dim, K = hidden (replicated)
    ``q_a_proj``           N = q_lora_rank, K = hidden (replicated; unfused form)
    ``kv_a_proj_with_mqa`` N = kv_lora_rank + qk_rope_head_dim, K = hidden (replicated; unfused)
    ``q_b_proj``           N = heads/tp * (qk_nope_head_dim + qk_rope_head_dim), K = q_lora_rank
    ``kv_b_proj``          N = heads/tp * (qk_nope_head_dim + v_head_dim), K = kv_lora_rank
                           (prefill path: the compressed KV is expanded)
    ``o_proj``             N = hidden, K = heads/tp * v_head_dim
    batched (BatchMatMulV2, batch = heads/tp), the decode path with absorbed weights:
    ``q_nope_absorb``      [b, M, qk_nope_head_dim] @ [b, qk_nope_head_dim, kv_lora_rank]
    ``out_absorb``         [b, M, kv_lora_rank] @ [b, kv_lora_rank, v_head_dim]
Dense MLP (models with dense MLP layers)
    ``gate_up_proj`` N = 2 * intermediate/tp, K = hidden (merged, column parallel)
    ``down_proj``    N = hidden, K = intermediate/tp (row parallel)
MoE (models with experts)
    ``router``              N = num_experts, K = hidden (replicated)
    ``expert_gate_up``      N = 2 * moe_intermediate/tp, K = hidden   (experts sharded by TP)
    ``expert_down``         N = hidden, K = moe_intermediate/tp
    ``shared_expert_gate_up`` N = 2 * n_shared * moe_intermediate/tp, K = hidden
    ``shared_expert_down``    N = hidden, K = n_shared * moe_intermediate/tp
    with expert parallelism (``ep_sizes``) an expert stays whole on its rank:
    ``expert_gate_up_ep`` N = 2 * moe_intermediate, ``expert_down_ep`` K = moe_intermediate
Output
    ``lm_head`` N = ceil(pad64(vocab) / tp), K = hidden (vocab parallel)

Embedding lookups are gathers, not GEMMs, and are not in the set.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from perf_plugin.grid.models import ModelConfig


@dataclass(frozen=True)
class Projection:
    """One GEMM of a model: ``[M,K] @ [K,N]``, batched over ``batch`` heads when batch > 0."""

    name: str
    n: int
    k: int
    batch: int = 0

    @property
    def kind(self) -> str:
        return "bmm" if self.batch else "linear"


def projections_at_tp(model: ModelConfig, tp: int) -> list[Projection]:
    """Every projection of ``model`` on one rank at tensor-parallel size ``tp`` (see module doc)."""
    env = model.at_tp(tp)
    heads = env["heads_per_rank"]
    out: list[Projection] = []
    if model.is_mla:
        rope, nope = model.qk_rope_head_dim, model.qk_nope_head_dim
        out += [
            Projection("fused_qkv_a_proj", model.q_lora_rank + model.kv_lora_rank + rope, model.hidden),
            Projection("q_a_proj", model.q_lora_rank, model.hidden),
            Projection("kv_a_proj_with_mqa", model.kv_lora_rank + rope, model.hidden),
            Projection("q_b_proj", heads * (nope + rope), model.q_lora_rank),
            Projection("kv_b_proj", heads * (nope + model.v_head_dim), model.kv_lora_rank),
            Projection("o_proj", model.hidden, heads * model.v_head_dim),
            Projection("q_nope_absorb", model.kv_lora_rank, nope, batch=heads),
            Projection("out_absorb", model.v_head_dim, model.kv_lora_rank, batch=heads),
        ]
    else:
        out += [
            Projection("qkv_proj", env["qkv_n"], model.hidden),
            Projection("o_proj", model.hidden, env["q_size"]),
        ]
    if model.dense_mlp_layers:
        inter = env["intermediate_per_rank"]
        out += [
            Projection("gate_up_proj", 2 * inter, model.hidden),
            Projection("down_proj", model.hidden, inter),
        ]
    if model.is_moe:
        moe = env["moe_intermediate_per_rank"]
        out += [
            Projection("router", model.num_experts, model.hidden),
            Projection("expert_gate_up", 2 * moe, model.hidden),
            Projection("expert_down", model.hidden, moe),
        ]
        if model.n_shared_experts:
            shared = model.n_shared_experts * moe
            out += [
                Projection("shared_expert_gate_up", 2 * shared, model.hidden),
                Projection("shared_expert_down", model.hidden, shared),
            ]
    out.append(Projection("lm_head", env["vocab_per_rank"], model.hidden))
    return out


def expert_parallel_projections(model: ModelConfig) -> list[Projection]:
    """Whole-expert GEMMs under expert parallelism (empty for dense models or without EP)."""
    if not model.is_moe or not model.ep_sizes:
        return []
    return [
        Projection("expert_gate_up_ep", 2 * model.moe_intermediate, model.hidden),
        Projection("expert_down_ep", model.hidden, model.moe_intermediate),
    ]


def model_projections(model: ModelConfig) -> Iterator[tuple[int, Projection]]:
    """``(tp, projection)`` for every TP size of the model, then the EP expert forms (tp 1)."""
    for tp in model.tp_sizes:
        for projection in projections_at_tp(model, tp):
            yield tp, projection
    for projection in expert_parallel_projections(model):
        yield 1, projection


def gemm_pairs(model: ModelConfig, kind: str = "linear") -> set[tuple[int, int]]:
    """The distinct (N, K) pairs ``model`` needs over its TP (and EP) sizes, of one kind."""
    return {(p.n, p.k) for _, p in model_projections(model) if p.kind == kind}
