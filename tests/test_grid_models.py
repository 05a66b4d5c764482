"""Model configurations, their per-rank sizes and the GEMM (N, K) candidate set."""

from __future__ import annotations

import pytest

from perf_plugin.database.errors import DatabaseError
from perf_plugin.grid.generators import GENERATORS
from perf_plugin.grid.models import MODELS, find_model, parse_model_list
from perf_plugin.grid.projections import gemm_pairs, projections_at_tp


def pairs_at(model_name: str, tp: int) -> dict[str, tuple[int, int]]:
    return {p.name: (p.n, p.k) for p in projections_at_tp(find_model(model_name), tp) if p.kind == "linear"}


# Hand-computed from Qwen3-32B's config.json: hidden 5120, 64 heads, 8 KV heads, head_dim 128,
# intermediate 25600, vocab 151936 (a multiple of 64, so no padding).
QWEN3_32B = {
    1: {"qkv_proj": (10240, 5120), "o_proj": (5120, 8192), "gate_up_proj": (51200, 5120),
        "down_proj": (5120, 25600), "lm_head": (151936, 5120)},
    2: {"qkv_proj": (5120, 5120), "o_proj": (5120, 4096), "gate_up_proj": (25600, 5120),
        "down_proj": (5120, 12800), "lm_head": (75968, 5120)},
    4: {"qkv_proj": (2560, 5120), "o_proj": (5120, 2048), "gate_up_proj": (12800, 5120),
        "down_proj": (5120, 6400), "lm_head": (37984, 5120)},
    8: {"qkv_proj": (1280, 5120), "o_proj": (5120, 1024), "gate_up_proj": (6400, 5120),
        "down_proj": (5120, 3200), "lm_head": (18992, 5120)},
    # 8 KV heads < 16 ranks: one KV head per rank (replicated), so qkv N = (4 + 2) * 128
    16: {"qkv_proj": (768, 5120), "o_proj": (5120, 512), "gate_up_proj": (3200, 5120),
         "down_proj": (5120, 1600), "lm_head": (9496, 5120)},
}
# Llama-3.1-70B: hidden 8192, 64 heads, 8 KV heads, head_dim 128, intermediate 28672, vocab 128256.
LLAMA_70B = {
    2: {"qkv_proj": (5120, 8192), "o_proj": (8192, 4096), "gate_up_proj": (28672, 8192),
        "down_proj": (8192, 14336), "lm_head": (64128, 8192)},
    4: {"qkv_proj": (2560, 8192), "o_proj": (8192, 2048), "gate_up_proj": (14336, 8192),
        "down_proj": (8192, 7168), "lm_head": (32064, 8192)},
    8: {"qkv_proj": (1280, 8192), "o_proj": (8192, 1024), "gate_up_proj": (7168, 8192),
        "down_proj": (8192, 3584), "lm_head": (16032, 8192)},
    16: {"qkv_proj": (768, 8192), "o_proj": (8192, 512), "gate_up_proj": (3584, 8192),
         "down_proj": (8192, 1792), "lm_head": (8016, 8192)},
}


@pytest.mark.parametrize("tp", sorted(QWEN3_32B))
def test_qwen3_32b_pairs(tp: int) -> None:
    assert pairs_at("qwen3-32b", tp) == QWEN3_32B[tp]


@pytest.mark.parametrize("tp", sorted(LLAMA_70B))
def test_llama_70b_pairs(tp: int) -> None:
    assert pairs_at("llama-3.1-70b", tp) == LLAMA_70B[tp]


def test_model_pair_sets_are_the_union_over_tp_sizes() -> None:
    assert gemm_pairs(find_model("qwen3-32b")) == {p for table in QWEN3_32B.values() for p in table.values()}
    assert gemm_pairs(find_model("llama-3.1-70b")) == {p for table in LLAMA_70B.values() for p in table.values()}


def test_qwen3_235b_kv_replication_and_experts() -> None:
    # 4 KV heads: at tp 8 each rank holds one replicated KV head -> (64/8 + 2) * 128
    at8 = pairs_at("qwen3-235b-a22b", 8)
    assert at8["qkv_proj"] == (1280, 4096)
    assert pairs_at("qwen3-235b-a22b", 4)["qkv_proj"] == ((16 + 2) * 128, 4096)
    assert at8["router"] == (128, 4096)
    assert at8["expert_gate_up"] == (2 * 1536 // 8, 4096)
    assert at8["expert_down"] == (4096, 1536 // 8)
    assert "gate_up_proj" not in at8  # every layer is MoE
    assert (3072, 4096) in gemm_pairs(find_model("qwen3-235b-a22b"))  # whole expert under EP
    assert (4096, 1536) in gemm_pairs(find_model("qwen3-235b-a22b"))


def test_deepseek_v3_mla_projections() -> None:
    model = find_model("dsv3")
    at8 = {p.name: p for p in projections_at_tp(model, 8)}
    assert (at8["fused_qkv_a_proj"].n, at8["fused_qkv_a_proj"].k) == (1536 + 512 + 64, 7168)
    assert (at8["q_b_proj"].n, at8["q_b_proj"].k) == (16 * (128 + 64), 1536)
    assert (at8["kv_b_proj"].n, at8["kv_b_proj"].k) == (16 * (128 + 128), 512)
    assert (at8["o_proj"].n, at8["o_proj"].k) == (7168, 16 * 128)
    assert (at8["q_nope_absorb"].batch, at8["q_nope_absorb"].n, at8["q_nope_absorb"].k) == (16, 512, 128)
    assert (at8["out_absorb"].batch, at8["out_absorb"].n, at8["out_absorb"].k) == (16, 128, 512)
    assert (at8["gate_up_proj"].n, at8["down_proj"].k) == (2 * 18432 // 8, 18432 // 8)
    assert (at8["shared_expert_gate_up"].n, at8["shared_expert_down"].k) == (2 * 2048 // 8, 2048 // 8)
    assert (at8["router"].n, at8["lm_head"].n) == (256, 129280 // 8)
    assert "qkv_proj" not in at8


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("qwen3-32b", dict(hidden=5120, heads=64, kv_heads=8, head_dim=128, intermediate=25600, vocab=151936)),
        ("qwen3-235b-a22b", dict(hidden=4096, heads=64, kv_heads=4, head_dim=128, num_experts=128, top_k=8,
                                 moe_intermediate=1536, vocab=151936)),
        ("deepseek-v3", dict(hidden=7168, heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64,
                             qk_nope_head_dim=128, v_head_dim=128, intermediate=18432, moe_intermediate=2048,
                             num_experts=256, n_shared_experts=1, top_k=8, vocab=129280)),
        ("llama-3.1-8b", dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256)),
        ("llama-3.1-70b", dict(hidden=8192, heads=64, kv_heads=8, head_dim=128, intermediate=28672, vocab=128256)),
    ],
)
def test_published_config_values(name: str, values: dict[str, int]) -> None:
    model = find_model(name)
    assert {key: getattr(model, key) for key in values} == values


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_listed_parallel_sizes_shard_evenly(model) -> None:  # type: ignore[no-untyped-def]
    model.check()
    assert model.tp_sizes


def test_names_aliases_and_hugging_face_ids() -> None:
    assert find_model("dsv3").name == "deepseek-v3"
    assert find_model("DeepSeek-V3").name == "deepseek-v3"
    assert find_model("Qwen/Qwen3-32B").name == "qwen3-32b"
    assert [m.name for m in parse_model_list("dsv3, qwen3-32b,dsv3")] == ["deepseek-v3", "qwen3-32b"]


def test_unknown_model_lists_the_known_ones() -> None:
    with pytest.raises(DatabaseError) as info:
        parse_model_list("qwen3-32b,gpt-5")
    message = str(info.value)
    assert "unknown model 'gpt-5'" in message
    for name in ("qwen3-32b", "qwen3-235b-a22b", "deepseek-v3 (alias dsv3)", "llama-3.1-8b", "llama-3.1-70b"):
        assert name in message


def test_target_models_restrict_the_gemm_candidates() -> None:
    gemm = GENERATORS["gemm"]
    raw = {"kind": "linear", "generic_n": "n", "generic_k": "k"}
    options = gemm.resolve_options(raw, {"n": (128, 256), "k": (64,)})
    qwen = (find_model("qwen3-32b"),)
    restricted = {(env["n"], env["k"]) for _, env in gemm.base_envs(qwen, options, restricted=True)}
    assert restricted == {p for table in QWEN3_32B.values() for p in table.values()}
    everything = list(gemm.base_envs(MODELS, options, restricted=False))
    generic = {(env["n"], env["k"]) for label, env in everything if label == "generic"}
    assert generic == {(128, 64), (256, 64)}
    assert restricted < {(env["n"], env["k"]) for _, env in everything}
