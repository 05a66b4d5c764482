"""How much of a real model's kernel time the database measures, and how faithfully.

For each model (decoder architectures from ``transformers``, built from their configurations
with random weights, no download): profile a prefill and decode steps with ``torch.profiler``,
ingest the trace into a fresh database (``perfdb ingest``'s pipeline), replay it with
``pytest bench``, and report

* coverage: the share of the trace's device kernel time that lands in rows which replay and
  pass (the denominator also holds the kernels launched outside any operator and the rows that
  could not replay);
* fidelity: for the rows that replay, replayed over in-model duration (``Average Duration(us)``
  over ``Profiling Average Duration(us)``), the share of rows and of kernel time within
  [0.9, 1.1], once per ``--cache-modes`` entry (the same database replayed in each mode; an
  entry ``MODE+markers`` also delimits every repeat with marker kernels, ``--perf-repeat-markers``,
  and ``MODE+placements=N`` cycles the repeats through N placements of the inputs,
  ``--perf-input-placements``);
* with ``--reference-spread``: the model profiled a second time, and the share of rows and of
  kernel time whose second in-model duration is within [0.9, 1.1] of the first -- how far the
  reference itself moves between two runs of the same code, the bound a replay is judged against;
  and a third time with every parameter moved to a new allocation (``replace_parameters``), which
  shows also how far the reference moves with where its weights lie in device memory;
* with ``--second-process``: the model built and profiled once more in a new process (the same
  seed, so the same weights and routing), as a second profiling run is: how far the reference
  moves between processes (``reference_spread_process.json``), and the replay of the first
  profile judged against the second one's in-model durations too.  Small decode kernels move
  between processes by more than between two profiles in one (Phi-3 on an H200: 91.4 % of the
  time within 10 %, where two profiles in one process agree on 100 %).

Models (``--models``): ``llama`` (Llama-3.1-8B dimensions, SDPA attention), ``qwen3-moe``
(Qwen3-30B-A3B dimensions: 128 experts, top-8), ``llama-fp8`` (the Llama model with every
linear layer an FP8 GEMM through ``torch._scaled_mm``, per-tensor scales; CUDA only), each with
``--layers`` decoder layers.  Models the database was never tuned on: ``mixtral`` (Mixtral-8x7B
dimensions: 8 experts, top-2, about one M-tile per expert on a 512-token prefill),
``deepseek-v3`` (DeepSeek-V3-style: MLA attention, 64 routed experts in 8 groups, top-6 by group,
one shared expert; reduced width), ``olmoe`` (OLMoE-1B-7B dimensions: 64 small experts, top-8),
``qwen2`` (Qwen2-7B dimensions: biased QKV) and ``phi3`` (Phi-3-mini dimensions: fused QKV and
gate/up projections).  ``hf:TYPE`` builds any other ``transformers`` architecture at its
configuration's default dimensions (``hf:gpt_oss``, ``hf:qwen2_moe``, ``hf:gemma3_text``, ...);
what a configuration leaves open that its model needs is set as the published model has it
(``PUBLISHED_WHERE_OPEN``), an expert width that is no 16-byte stride is rounded up to one, and a
model whose first layers are dense keeps its last measured layer one of routed experts.
MoE models run ``transformers``' ``grouped_mm`` experts.

Every profile runs inside ``perf_plugin.capture.capture_input_values`` (``--no-capture``: not),
which writes ``trace.values.json`` beside the trace: the grouped GEMM rows then carry the
model's rows per expert, and replay exactly those groups.  It also writes the execution trace,
``trace.et.json`` (``--no-execution-trace``: not), from which ingest finds the kernel that wrote
each input by its storage rather than by its shape (``perf_plugin.ingest.execution_trace``).

Routing of the MoE model.  With random weights the router's inputs share a few directions
across tokens (the residual stream of random layers), so every token picks the same experts:
on 512 prefill tokens, the second of three layers routed to 52 of 128 experts, the busiest
getting 15x the mean.  A trained MoE is balanced by its load-balancing loss, and a grouped GEMM
that reads 40 experts' weights is much faster than one reading 128 (the replay draws balanced
group sizes, as the row records only the expert count).  So the benchmark whitens each router's
weight against its inputs on the profiled prompt (``balance_routing``), layer by layer: every
expert is then used, with the spread of a uniform random routing (the busiest 1.3-1.6x the
mean).  The routing of the profiled prefill is printed per layer.

Prerequisites: torch with CUDA (or ``--device cpu --tiny`` for a quick check of the script),
``transformers`` (5.x), this project installed (``pip install -e .``).

    python benchmarks/model_coverage.py --device cuda --out OUTDIR
    python benchmarks/model_coverage.py --device cpu --tiny --models llama --out /tmp/mc

Expected output: one table per model (kernel type, rows, replayed, profiled time share, median
ratio) and a summary line per model, then ``OUTDIR/model_coverage.json`` with every row's
durations (a model measured by an earlier run into the same OUTDIR stays in it, one measured again
is replaced).  The databases stay under ``OUTDIR/<model>/db`` (re-run ``pytest bench`` on them).
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BAND = (0.9, 1.1)


@dataclass
class RowOutcome:
    kernel_type: str
    line: int
    profiled_us: float  # average in the model
    count: int
    replayed_us: float | None
    kernels_differ: bool = False  # the replay launched other kernels than the model (Profiling Kernels)
    key: tuple[str, ...] = ()  # kernel type and identity cells (``row_key``): the row in another profile

    @property
    def total_us(self) -> float:
        return self.profiled_us * self.count

    @property
    def ratio(self) -> float | None:
        return None if self.replayed_us is None or self.profiled_us <= 0 else self.replayed_us / self.profiled_us


@dataclass
class ModelReport:
    model: str
    trace_kernel_us: float = 0.0  # every device kernel of the profiled steps
    unattributed_us: float = 0.0
    rows: list[RowOutcome] = field(default_factory=list)
    replay_seconds: float = 0.0
    reference_spread: dict[str, Any] | None = None  # --reference-spread: in-model profiles compared
    against_second: dict[str, Any] | None = None  # --second-process: the replay against that profile
    against_replaced: dict[str, Any] | None = None  # --reference-spread: against the re-placed profile

    def summary(self) -> dict[str, Any]:
        passed = [r for r in self.rows if r.replayed_us is not None]
        passed_us = sum(r.total_us for r in passed)
        inside = [r for r in passed if r.ratio is not None and BAND[0] <= r.ratio <= BAND[1]]
        return {
            "model": self.model,
            "rows": len(self.rows),
            "rows_passed": len(passed),
            "trace_kernel_us": round(self.trace_kernel_us, 1),
            "coverage_time": passed_us / self.trace_kernel_us if self.trace_kernel_us else 0.0,
            "fidelity_rows": len(inside) / len(passed) if passed else 0.0,
            "fidelity_time": sum(r.total_us for r in inside) / passed_us if passed_us else 0.0,
            "other_kernels_rows": sum(1 for r in passed if r.kernels_differ),
            "other_kernels_time": sum(r.total_us for r in passed if r.kernels_differ) / passed_us if passed_us else 0.0,
            "replay_seconds": round(self.replay_seconds, 1),
            "reference_spread": self.reference_spread,
            "against_second_process": self.against_second,
            "against_replaced_parameters": self.against_replaced,
        }


# ----------------------------------------------------------------------------- models
def llama_config(tiny: bool) -> Any:
    from transformers import LlamaConfig

    if tiny:
        return LlamaConfig(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=64, vocab_size=1024, num_hidden_layers=1)
    return LlamaConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                       head_dim=128, vocab_size=128256, rope_theta=500000.0)


def qwen3_moe_config(tiny: bool) -> Any:
    from transformers import Qwen3MoeConfig

    if tiny:
        return Qwen3MoeConfig(hidden_size=256, moe_intermediate_size=128, intermediate_size=512, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=64, vocab_size=1024, num_experts=8, num_experts_per_tok=2,
                              num_hidden_layers=1, decoder_sparse_step=1, mlp_only_layers=[])
    return Qwen3MoeConfig(hidden_size=2048, moe_intermediate_size=768, intermediate_size=6144, num_attention_heads=32,
                          num_key_value_heads=4, head_dim=128, vocab_size=151936, num_experts=128,
                          num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[])


class Fp8Linear:
    """A linear layer whose GEMM is FP8 (e4m3) with per-tensor scales, as FP8 serving runs it."""

    def __init__(self, linear: Any) -> None:
        import torch

        weight = linear.weight.detach().float()
        self.weight_scale = (weight.abs().amax() / 448.0).clamp(min=1e-12).reshape(())
        # _scaled_mm wants the second operand column-major: keep the transposed view of [N,K]
        self.weight = (weight / self.weight_scale).to(torch.float8_e4m3fn).t()
        self.bias = linear.bias

    def __call__(self, x: Any) -> Any:
        import torch

        flat = x.reshape(-1, x.shape[-1])
        scale = (flat.abs().amax().float() / 448.0).clamp(min=1e-12)
        quantized = (flat / scale).to(torch.float8_e4m3fn)
        out = torch._scaled_mm(quantized, self.weight, scale_a=scale, scale_b=self.weight_scale, out_dtype=x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], out.shape[-1])


def to_fp8_linears(model: Any) -> None:
    import torch

    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear) and name != "lm_head":
                wrapper = Fp8Linear(child)
                setattr(module, name, _as_module(wrapper))


def _as_module(function: Any) -> Any:
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.function = function

        def forward(self, x: Any) -> Any:
            return self.function(x)

    return Wrapped()


def router_modules(model: Any) -> list[tuple[str, Any]]:
    """The MoE routers (``mlp.gate``, or ``mlp.router`` in GPT-OSS and PhiMoE, of every sparse
    layer), in layer order."""
    return [(name, module) for name, module in model.named_modules() if name.endswith(("mlp.gate", "mlp.router"))]


def router_inputs(model: Any, ids: Any) -> dict[str, tuple[Any, Any]]:
    """Per router: its input rows (float32) and the experts it chose, from one forward pass."""
    import torch

    seen: dict[str, tuple[Any, Any]] = {}
    top_k = model.config.num_experts_per_tok

    def chosen(out: Any) -> Any:
        # transformers 5 routers return (logits, scores, indices), others the indices elsewhere in
        # a tuple; a plain linear gate, its logits
        if isinstance(out, tuple):
            indices = [t for t in out if isinstance(t, torch.Tensor) and not t.is_floating_point()]
            return indices[-1].detach() if indices else out[0].detach().topk(top_k, dim=-1).indices
        return out.detach().topk(top_k, dim=-1).indices

    hooks = [
        module.register_forward_hook(
            lambda _m, args, out, name=name: seen.__setitem__(
                name, (args[0].detach().reshape(-1, args[0].shape[-1]).float(), chosen(out))
            )
        )
        for name, module in router_modules(model)
    ]
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def balance_routing(model: Any, ids: Any) -> None:
    """Whiten every router's weight against its inputs on the prompt ``ids`` (see the module
    docstring), layer by layer, since balancing one layer changes the next one's inputs.

    The whitening holds for the prompt it was computed on (the profiled prefill's): calibrated
    on another prompt, even of more tokens than the hidden size, routing stayed collapsed (its
    inputs depend on the sequence through attention)."""
    import torch

    for name, module in router_modules(model):
        if not isinstance(getattr(module, "weight", None), torch.Tensor):  # a router of its own make (JetMoE's)
            print(f"  {name}: a router without a weight matrix, left as it routes")
            continue
        x, _ = router_inputs(model, ids)[name]
        _, singular, vh = torch.linalg.svd(x, full_matrices=False)
        keep = singular > singular[0] * 1e-4
        basis, singular = vh[keep].T, singular[keep]
        whitening = basis @ torch.diag(singular.mean() / singular) @ basis.T
        module.weight.data = (module.weight.data.float() @ whitening).to(module.weight.dtype)


def routing_balance(model: Any, ids: Any, experts: int) -> list[str]:
    """Per router: experts used and the busiest expert's share over the mean."""
    import torch

    lines = []
    for name, (_, chosen) in router_inputs(model, ids).items():
        counts = torch.bincount(chosen.reshape(-1), minlength=experts).float()
        lines.append(f"{name}: {int((counts > 0).sum())}/{experts} experts used, busiest {counts.max() / counts.mean():.2f}x the mean")
    return lines


def mixtral_config(tiny: bool) -> Any:
    from transformers import MixtralConfig

    if tiny:
        return MixtralConfig(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                             vocab_size=1024, num_local_experts=4, num_experts_per_tok=2)
    return MixtralConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                         vocab_size=32000, num_local_experts=8, num_experts_per_tok=2)


def deepseek_v3_config(tiny: bool) -> Any:
    from transformers import DeepseekV3Config

    if tiny:
        return DeepseekV3Config(hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_attention_heads=4,
                                num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                                n_shared_experts=1, q_lora_rank=128, kv_lora_rank=64, qk_rope_head_dim=32,
                                qk_nope_head_dim=32, v_head_dim=32, vocab_size=1024, first_k_dense_replace=0)
    return DeepseekV3Config(hidden_size=2048, intermediate_size=8192, moe_intermediate_size=1024, num_attention_heads=16,
                            num_key_value_heads=16, n_routed_experts=64, num_experts_per_tok=6, n_group=8, topk_group=3,
                            n_shared_experts=1, q_lora_rank=768, kv_lora_rank=512, qk_rope_head_dim=64,
                            qk_nope_head_dim=128, v_head_dim=128, vocab_size=102400, first_k_dense_replace=0)


def olmoe_config(tiny: bool) -> Any:
    from transformers import OlmoeConfig

    if tiny:
        return OlmoeConfig(hidden_size=256, intermediate_size=64, num_attention_heads=4, num_key_value_heads=4,
                           vocab_size=1024, num_experts=8, num_experts_per_tok=4)
    return OlmoeConfig(hidden_size=2048, intermediate_size=1024, num_attention_heads=16, num_key_value_heads=16,
                       vocab_size=50304, num_experts=64, num_experts_per_tok=8)


def qwen2_config(tiny: bool) -> Any:
    from transformers import Qwen2Config

    if tiny:
        return Qwen2Config(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                           vocab_size=1024)
    return Qwen2Config(hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4,
                       vocab_size=152064)


def phi3_config(tiny: bool) -> Any:
    from transformers import Phi3Config

    if tiny:
        return Phi3Config(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=4,
                          vocab_size=1024, pad_token_id=0)
    return Phi3Config(hidden_size=3072, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=32,
                      vocab_size=32064, pad_token_id=0)


CONFIGS: dict[str, Callable[[bool], Any]] = {
    "llama": llama_config, "llama-fp8": llama_config, "qwen3-moe": qwen3_moe_config, "mixtral": mixtral_config,
    "deepseek-v3": deepseek_v3_config, "olmoe": olmoe_config, "qwen2": qwen2_config, "phi3": phi3_config,
}


TINY_DIMENSIONS = {
    "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "vocab_size": 1024, "num_experts": 8, "num_local_experts": 8, "n_routed_experts": 8,
    # Mamba-2 layers (Bamba, Granite-4.0-H): heads x head size = the expanded width (2 x 256)
    "mamba_n_heads": 8, "mamba_d_head": 64,
    # the same width as other configurations name it: Mamba-2's heads (of head_dim 64), Falcon-H1's
    # expanded width, Zamba2's head size and its shared attention's width and heads
    "num_heads": 8, "mamba_d_ssm": 512, "mamba_headdim": 64, "attention_hidden_size": 512, "attention_head_dim": 128,
}


# What some configurations' defaults leave open (None) although their models need it, as the
# published models have it: DeepSeek-V2 routes each token to 6 of its experts; dots.llm1 to 6 of
# 128, beside 2 shared experts; LFM2-MoE's layers are short convolutions with an attention layer
# among every few (LFM2-8B-A1B: 6 of 24), here one in four of the configuration's 32.
PUBLISHED_WHERE_OPEN: dict[str, dict[str, Any]] = {
    "deepseek_v2": {"num_experts_per_tok": 6},
    "dots1": {"n_routed_experts": 128, "num_experts_per_tok": 6, "n_shared_experts": 2},
    "lfm2_moe": {"layer_types": ["full_attention" if i % 4 == 2 else "conv" for i in range(32)]},
}
# The fields that keep a model's first layers dense (a dense MLP before its routed experts)
DENSE_FIRST_LAYERS = ("first_k_dense_replace", "num_dense_layers")


def architecture_config(model_type: str, tiny: bool) -> Any:
    """``hf:TYPE``: any ``transformers`` architecture at its configuration class's default
    dimensions (for most, those of the model the architecture was published with), so a model
    the database was never tuned on is measured the same way as the named ones."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type)
    for name, value in PUBLISHED_WHERE_OPEN.get(model_type, {}).items():
        if getattr(config, name, None) is None:
            setattr(config, name, value)
    width = getattr(config, "moe_intermediate_size", None)
    if isinstance(width, int) and width % 8:  # DeepSeek-V2's 1407: grouped_mm needs 16-byte strides
        config.moe_intermediate_size = width + 8 - width % 8  # 1408, DeepSeek-V2-Lite's
    if tiny:
        for name, value in TINY_DIMENSIONS.items():
            if getattr(config, name, None):
                try:
                    setattr(config, name, value)
                except AttributeError:  # derived from others (Falcon's head_dim)
                    pass
        experts = expert_count(config)
        if experts and (getattr(config, "num_experts_per_tok", None) or 0) > experts:  # Qwen3-Next: 10 of 512
            config.num_experts_per_tok = 2
        if getattr(config, "kv_lora_rank", None):  # MLA (DeepSeek-V2): a key and value per query head
            config.num_key_value_heads = config.num_attention_heads
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):  # within the smaller vocabulary
            if isinstance(getattr(config, name, None), int) and getattr(config, name) >= config.vocab_size:
                setattr(config, name, None)
    return config


def model_config(name: str, tiny: bool) -> Any:
    if name.startswith("hf:"):
        return architecture_config(name.removeprefix("hf:"), tiny)
    if name not in CONFIGS:
        raise SystemExit(f"unknown model {name!r}: one of {', '.join(CONFIGS)}, or hf:MODEL_TYPE")
    return CONFIGS[name](tiny)


def expert_count(config: Any) -> int:
    for name in ("num_experts", "num_local_experts", "n_routed_experts"):
        if getattr(config, name, None):
            return int(getattr(config, name))
    return 0


def fill_open_defaults(config: Any) -> None:
    """The dimensions some configurations' defaults leave open (None), set as their models
    usually have them: a key and value head per query head (Nemotron), and heads of the hidden
    size over the head count (HunYuan, Ministral)."""
    if getattr(config, "num_key_value_heads", 0) is None:
        config.num_key_value_heads = config.num_attention_heads
    if hasattr(config, "head_dim") and config.head_dim is None:
        config.head_dim = config.hidden_size // config.num_attention_heads


FULL_ATTENTION = "full_attention"


def kept_layer_types(types: list[str], layers: int) -> list[str]:
    """The kinds of the first ``layers`` layers of a hybrid model (``layer_types``), each kind the
    model has kept at least once where ``layers`` allows, a full-attention layer first: Qwen3-Next's
    two layers are a linear- and a full-attention one, not its first two linear ones.  A model of
    state-keeping layers alone (Granite-4.0-H's defaults) gets one attention layer too: a cache
    asks an attention layer the sequence length (transformers refuses a cache of states alone)."""
    kept = types[:layers]
    kinds = list(dict.fromkeys(types))
    if FULL_ATTENTION not in kept and (FULL_ATTENTION in kinds or "linear_attention" in kinds):
        kinds.insert(0, FULL_ATTENTION)
    for kind in dict.fromkeys(kinds):
        if kind not in kept and (len(set(kept)) < layers or kind == FULL_ATTENTION):
            # replace the last of the kind kept most often
            most = max(dict.fromkeys(kept), key=kept.count)
            kept[len(kept) - 1 - kept[::-1].index(most)] = kind
    return kept


def fit_hybrid_layers(config: Any, layers: int) -> None:
    """A hybrid model's ``layers`` layers as ``kept_layer_types`` says, through the fields its
    configuration derives them from where ``layer_types`` is read-only: Jamba's attention period
    and offset, Bamba's attention indices (none by default)."""
    types = getattr(config, "layer_types", None)
    if not isinstance(types, list) or (len(types) <= layers and FULL_ATTENTION in types):
        return
    kept = kept_layer_types(types, layers)
    try:
        config.layer_types = kept
        return
    except AttributeError:  # derived from other fields
        pass
    attention = [i for i, kind in enumerate(kept) if kind == FULL_ATTENTION]
    if getattr(config, "attn_layer_period", None) and attention:
        config.attn_layer_period, config.attn_layer_offset = layers, attention[0]
    if hasattr(config, "attn_layer_indices"):
        config.attn_layer_indices = attention


def build_model(name: str, layers: int, device: str, tiny: bool, tokens: int) -> Any:
    import torch

    config = model_config(name, tiny)
    config.num_hidden_layers = layers
    fit_hybrid_layers(config, layers)
    for dense in DENSE_FIRST_LAYERS:  # a layer of routed experts among the few measured
        if expert_count(config) and (getattr(config, dense, None) or 0) >= layers:
            setattr(config, dense, layers - 1)
    fill_open_defaults(config)
    config._attn_implementation = "sdpa"
    if expert_count(config):
        config._experts_implementation = "grouped_mm"
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: random weights of billions of parameters
        model = _from_config(config)
    if name == "llama-fp8":
        to_fp8_linears(model)
    if expert_count(config):
        balance_routing(model, prefill_ids(model, device, tokens))
    return model


def _from_config(config: Any) -> Any:
    """The model of ``config`` in bf16, with SDPA and grouped-GEMM experts where the architecture
    takes them: an architecture without SDPA (GPT-OSS's attention sinks) runs its own attention,
    one whose experts take no other implementation (JetMoE) its own experts."""
    import torch
    from transformers import AutoModelForCausalLM

    for _ in range(3):
        try:
            return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
        except ValueError as error:
            if "scaled_dot_product_attention" in str(error):
                config._attn_implementation = "eager"
            elif "experts implementation" in str(error):
                config._experts_implementation = None
            else:
                raise
    return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()


# ----------------------------------------------------------------------------- profile and ingest
def prefill_ids(model: Any, device: str, tokens: int) -> Any:
    """The prompt of every profiled run: the same tokens each time (seeded)."""
    import torch

    generator = torch.Generator(device=device).manual_seed(0)
    return torch.randint(0, model.config.vocab_size, (1, tokens), device=device, generator=generator)


# Layer kinds whose cache is keys and values alone: any other (linear attention, convolution)
# keeps a state the cache makes only from the model's configuration.
ATTENTION_KINDS = frozenset({"full_attention", "sliding_attention", "chunked_attention"})


def new_cache(config: Any) -> Any:
    """An empty cache for a prefill: keys and values per layer, or, for a hybrid model whose
    layers keep other states (Qwen3-Next's, Kimi-Linear's linear attention), the layers its
    configuration names."""
    from transformers import DynamicCache

    if set(getattr(config, "layer_types", None) or ()) - ATTENTION_KINDS:
        return DynamicCache(config=config)
    return DynamicCache()


def run_steps(model: Any, device: str, tokens: int, decode_steps: int) -> None:
    import torch

    ids = prefill_ids(model, device, tokens)
    with torch.no_grad():
        try:
            out = model(input_ids=ids, past_key_values=new_cache(model.config), use_cache=True)
        except ValueError as error:  # a model with a cache of its own kind (MiniMax) makes it
            if "cache" not in str(error).lower():
                raise
            out = model(input_ids=ids, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        for step in range(decode_steps):
            if hasattr(out, "past_key_values"):
                out = model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
            else:  # a state-space output of transformers 5.17 (5.25: past_key_values): states, and a position
                position = torch.tensor([ids.shape[-1] + step], device=token.device)
                out = model(input_ids=token, cache_params=out.cache_params, cache_position=position, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)


def profile_model(model: Any, device: str, tokens: int, decode_steps: int, trace: Path, capture: bool = True,
                  execution_trace: bool = True) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from perf_plugin.capture import capture_input_values, execution_trace_observer
    from perf_plugin.trace.values_file import sidecar_path

    run_steps(model, device, tokens, decode_steps)  # warm-up: allocator, kernels chosen, caches
    if device == "cuda":
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    # profile_memory: the allocator's events say which tensors were still alive at each call,
    # which ingest uses to find the kernel that wrote each input (``perf_plugin.ingest.input_reuse``)
    # the execution trace (trace.et.json) names the tensor each input was, so ingest finds its
    # producer by storage rather than by shape (``perf_plugin.ingest.execution_trace``)
    observer = execution_trace_observer(trace) if execution_trace else None
    with profile(activities=activities, record_shapes=True, profile_memory=True,
                 execution_trace_observer=observer) as prof:
        # the grouped GEMMs' rows per expert, recorded beside the trace (trace.values.json)
        with capture_input_values(sidecar_path(trace) if capture else None):
            run_steps(model, device, tokens, decode_steps)
        if device == "cuda":
            torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))


def trace_kernel_us(trace: Path) -> float:
    """Every device kernel's time in the trace (memcpy and memset too, as ingest counts them), but
    the copies of streams that ran nothing else: the capture's (``capture_input_values`` copies
    its values to the host on a side stream of its own), not the model's work."""
    from perf_plugin.ingest.json_file import load_json_file

    document = load_json_file(trace, "trace")
    categories = {"kernel", "gpu_memcpy", "gpu_memset"}
    device = [e for e in document.get("traceEvents", []) if e.get("cat") in categories]
    working = {(e.get("pid"), e.get("tid")) for e in device if e.get("cat") != "gpu_memcpy"}
    return sum(float(e.get("dur", 0)) for e in device if (e.get("pid"), e.get("tid")) in working)


def replay(db: Path, device: str, repeats: int, warmup: int, variant: str) -> float:
    """``pytest bench`` on ``db``; ``variant`` is a cache mode, ``+markers`` for per-repeat markers."""
    started = time.perf_counter()
    cache_mode, _, extra = variant.partition("+")
    command = [sys.executable, "-m", "pytest", str(ROOT / "bench" / "test_kernels.py"), "--perf-database-path", str(db),
               "--perf-backend", device, "--perf-repeat-count", str(repeats), "--perf-warmup-count", str(warmup),
               "--perf-cache-mode", cache_mode, "-p", "no:cacheprovider", "-q", "--no-header", "-p", "no:randomly"]
    if extra == "markers":
        command.append("--perf-repeat-markers")
    elif extra.startswith("placements="):
        command += ["--perf-input-placements", extra.removeprefix("placements=")]
    elif extra:
        raise SystemExit(f"--cache-modes entry {variant!r}: the suffixes are +markers and +placements=N")
    completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    tail = completed.stdout.strip().splitlines()[-3:]
    print(f"  pytest bench (exit {completed.returncode}):", " | ".join(tail))
    if completed.returncode not in (0, 1):
        print("\n".join((completed.stdout + completed.stderr).strip().splitlines()[-25:]))
    return time.perf_counter() - started


def passed_rows(db: Path) -> set[tuple[str, int]]:
    reports = sorted((db / "reports").glob("run_report_*.json"))
    if not reports:
        return set()
    results = json.loads(reports[-1].read_text())["results"]
    return {(r["csv_file"], int(r["row_line"])) for r in results if r["outcome"] == "passed" and r["row_line"]}


def collect_rows(db: Path) -> list[RowOutcome]:
    from perf_plugin.database.kernel_breakdown import kernel_difference

    passed = passed_rows(db)
    rows = []
    for path in sorted(db.glob("*.csv")):
        if path.name.endswith(".quarantine.csv"):
            continue
        with path.open(newline="") as handle:
            for line, cells in enumerate(csv.DictReader(handle), start=2):
                profiled = float(cells.get("Profiling Average Duration(us)") or 0.0)
                count = int(float(cells.get("Profiling Count") or 1))
                replayed = cells.get("Average Duration(us)") or ""
                ok = (path.name, line) in passed and replayed != ""
                differ = ok and kernel_difference(
                    cells.get("Profiling Kernels", ""), cells.get("MicroBench Kernels", "")
                ) is not None
                rows.append(RowOutcome(path.stem, line, profiled, count, float(replayed) if ok else None, differ,
                                       row_key(path.stem, cells)))
    return rows


def row_key(kernel_type: str, cells: Mapping[str, str]) -> tuple[str, ...]:
    """A row's kernel type and identity cells, spelled alike in an ingest's rows and a CSV's."""
    from perf_plugin.ingest.merge import cells_key

    return (kernel_type, *cells_key(cells))


Rows = dict[tuple[str, ...], tuple[float, int]]


def profiled_rows(trace: Path) -> Rows:
    """``row_key`` -> (in-model average, calls) of a trace's ingested rows."""
    from perf_plugin.ingest.pipeline import ingest_path

    return {row_key(r.kernel_type, r.cells): (r.average, r.count) for r in ingest_path(trace, None).rows}


def against_profile(rows: list[RowOutcome], other: Rows) -> dict[str, Any]:
    """The replayed rows judged against another profile's in-model durations: the share of the
    matched rows, and of their time in that profile, whose replay is within ``BAND`` of it."""
    matched = [(row.replayed_us, other[row.key]) for row in rows if row.replayed_us is not None and row.key in other]
    inside = [(avg, count) for replayed, (avg, count) in matched if avg > 0 and BAND[0] <= replayed / avg <= BAND[1]]
    total = sum(avg * count for _, (avg, count) in matched) or 1.0
    return {
        "rows_matched": len(matched),
        "rows_replayed": sum(1 for row in rows if row.replayed_us is not None),
        "rows_within": len(inside) / len(matched) if matched else 0.0,
        "time_within": sum(avg * count for avg, count in inside) / total,
    }


def measure(name: str, args: argparse.Namespace) -> list[ModelReport]:
    """Profile the model, then ingest and replay its trace (``replay_trace``)."""
    out = Path(args.out) / name.replace(":", "-")
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "trace.json"
    model = build_model(name, args.layers, args.device, args.tiny, args.tokens)
    if router_modules(model):
        for line in routing_balance(model, prefill_ids(model, args.device, args.tokens), expert_count(model.config)):
            print(f"  routing of the profiled prefill, {line}")
    profile = functools.partial(profile_model, model, args.device, args.tokens, args.decode_steps,
                                capture=not args.no_capture, execution_trace=not args.no_execution_trace)
    profile(trace)
    if args.profile_only:
        return []
    spread: dict[str, Any] | None = None
    replaced: Rows | None = None
    first = profiled_rows(trace) if args.reference_spread or args.second_process else {}
    if args.reference_spread:
        second = out / "trace_second.json"
        profile(second)
        spread = reference_spread(first, profiled_rows(second), out)
        moved = out / "trace_replaced.json"
        pad = replace_parameters(model)  # held while profiling: activations land elsewhere too
        profile(moved)
        del pad
        replaced = profiled_rows(moved)
        spread["replaced"] = reference_spread(first, replaced, out, "reference_spread_replaced.json")
    del profile, model  # the partial holds the model too
    release_device_memory(args.device)
    other = profiled_rows(profile_in_new_process(name, args, out)) if args.second_process else None
    if other is not None:
        spread = dict(spread or {}, process=reference_spread(first, other, out, "reference_spread_process.json"))
    reports = replay_trace(name, trace, out, args)
    for report in reports:
        report.reference_spread = spread
        if other is not None:
            report.against_second = against_profile(report.rows, other)
        if replaced is not None:
            report.against_replaced = against_profile(report.rows, replaced)
    return reports


def profile_in_new_process(name: str, args: argparse.Namespace, out: Path) -> Path:
    """The model built and profiled again by a new process of this script (``--profile-only``):
    a second profiling run, with its own allocations, launch history and device state."""
    folder = out / "second_process"
    command = [sys.executable, str(Path(__file__).resolve()), "--profile-only", "--models", name,
               "--device", args.device, "--layers", str(args.layers), "--tokens", str(args.tokens),
               "--decode-steps", str(args.decode_steps), "--out", str(folder)]
    command += ["--tiny"] * args.tiny + ["--no-capture"] * args.no_capture
    command += ["--no-execution-trace"] * args.no_execution_trace
    subprocess.run(command, cwd=ROOT, check=True)
    return folder / name.replace(":", "-") / "trace.json"


def release_device_memory(device: str) -> None:
    """Hands the model's device memory back to the driver before the replay's own process starts:
    the caching allocator would hold it for this process while the replay runs beside it."""
    if device != "cuda":
        return
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()


def replace_parameters(model: Any) -> Any:
    """Every parameter moved to a new allocation, the values kept: a kernel that streams a large
    weight runs at a speed that depends on where the weight lies in device memory, so a second
    profile in the same placement shows only part of how far the reference itself moves (another
    process, or the same model loaded again, places its weights elsewhere).  Returns an odd-sized
    allocation made first, which the caller holds while profiling so that activations too land
    at other addresses than before."""
    import torch

    pad = torch.empty(7 * 2**20 + 12345, dtype=torch.uint8, device=next(model.parameters()).device)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.data = parameter.data.clone()
    return pad


def reference_spread(first: Rows, second: Rows, out: Path, name: str = "reference_spread.json") -> dict[str, Any]:
    """Two profiles of the same steps (``profiled_rows``): the share of the first's rows (and of
    its time) whose duration in the second is within ``BAND`` of the first."""
    shared = [(first[key], second[key][0]) for key in first if key in second and first[key][0] > 0]
    inside = [(avg, count) for (avg, count), other in shared if BAND[0] <= other / avg <= BAND[1]]
    total = sum(avg * count for (avg, count), _ in shared) or 1.0
    result = {
        "rows_matched": len(shared),
        "rows_first": len(first),
        "rows_within": len(inside) / len(shared) if shared else 0.0,
        "time_within": sum(avg * count for avg, count in inside) / total,
    }
    (out / name).write_text(json.dumps(result, indent=1))
    return result


def replay_trace(name: str, trace: Path, out: Path, args: argparse.Namespace) -> list[ModelReport]:
    """One report per cache mode: the trace ingested once, the database replayed in each mode."""
    import shutil

    from perf_plugin.ingest.pipeline import ingest_path

    for stale in (out / "ingested", *out.glob("db_*")):  # an earlier run's rows would merge with these
        shutil.rmtree(stale, ignore_errors=True)
    ingested = ingest_path(trace, out / "ingested")
    total = trace_kernel_us(trace) if args.device == "cuda" else sum(r.average * r.count for r in ingested.rows)
    reports = []
    for mode in args.cache_modes.split(","):
        db = out / f"db_{mode}"
        shutil.copytree(out / "ingested", db, dirs_exist_ok=True)
        report = ModelReport(f"{name}/{mode}", trace_kernel_us=total)
        report.replay_seconds = replay(db, args.device, args.repeats, args.warmup, mode)
        report.rows = collect_rows(db)
        reports.append(report)
    return reports


def print_report(report: ModelReport) -> None:
    by_type: dict[str, list[RowOutcome]] = {}
    for row in report.rows:
        by_type.setdefault(row.kernel_type, []).append(row)
    total = report.trace_kernel_us or 1.0
    print(f"\n{report.model}: {'kernel type':<34} {'rows':>4} {'passed':>6} {'time %':>7} {'median ratio':>12}")
    for kernel_type, rows in sorted(by_type.items(), key=lambda kv: -sum(r.total_us for r in kv[1])):
        ratios = [r.ratio for r in rows if r.ratio is not None]
        median = f"{statistics.median(ratios):.3f}" if ratios else "-"
        share = 100 * sum(r.total_us for r in rows) / total
        passed = sum(1 for r in rows if r.replayed_us is not None)
        print(f"{'':<{len(report.model) + 2}}{kernel_type:<34} {len(rows):>4} {passed:>6} {share:>6.2f}% {median:>12}")
    for line in out_of_band_lines(report):
        print(line)
    s = report.summary()
    print(
        f"{report.model}: coverage {100 * s['coverage_time']:.1f}% of kernel time ({s['rows_passed']}/{s['rows']} rows); "
        f"fidelity within {BAND}: {100 * s['fidelity_time']:.1f}% of replayed time, {100 * s['fidelity_rows']:.1f}% of rows; "
        f"other kernels than the model: {s['other_kernels_rows']} rows, {100 * s['other_kernels_time']:.1f}% of replayed time"
    )
    spread = report.reference_spread or {}
    for key, what in (("", "a second in-model profile"), ("process", "a profile in another process"),
                      ("replaced", "parameters re-placed")):
        other = spread.get(key) if key else spread
        if other and "time_within" in other:
            print(f"{report.model}: reference spread, {what}: within {BAND} of the first for "
                  f"{100 * other['time_within']:.1f}% of the time, {100 * other['rows_within']:.1f}% of "
                  f"{other['rows_matched']} matched rows")


def out_of_band_lines(report: ModelReport, limit: int = 8) -> list[str]:
    """The replayed rows outside ``BAND``, the most of the model's kernel time first: which rows
    the fidelity figure misses, by their ratio, time share, calls and identity cells."""
    total = report.trace_kernel_us or 1.0
    outside = [row for row in report.rows if row.ratio is not None and not BAND[0] <= row.ratio <= BAND[1]]
    outside.sort(key=lambda row: -row.total_us)
    indent = " " * (len(report.model) + 2)
    lines = [f"{indent}out of the band, most time first ({len(outside)} rows, "
             f"{100 * sum(row.total_us for row in outside) / total:.1f}% of the time):"] if outside else []
    for row in outside[:limit]:
        cells = " ".join(cell for cell in row.key[1:3] if cell)
        lines.append(f"{indent}  {100 * row.total_us / total:5.2f}%  ratio {row.ratio:.3f}  {row.kernel_type} "
                     f"line {row.line}  {row.profiled_us:.2f} us x{row.count}  {cells}")
    return lines


def print_against_other_profiles(report: ModelReport) -> None:
    for against, profile in ((report.against_second, "the profile of another process"),
                             (report.against_replaced, "the profile with parameters re-placed")):
        if against:
            print(f"{report.model}: the replay against {profile}: within {BAND} for "
                  f"{100 * against['time_within']:.1f}% of its time, {100 * against['rows_within']:.1f}% of "
                  f"{against['rows_matched']} matched rows (of {against['rows_replayed']} replayed)")


def planned_runs(args: argparse.Namespace) -> list[tuple[str, Callable[[], list[ModelReport]]]]:
    """(name, run) per model to profile, or per ``--traces`` file (named after its folder)."""
    if not args.traces:
        return [(name, functools.partial(measure, name, args)) for name in args.models.split(",")]
    runs: list[tuple[str, Callable[[], list[ModelReport]]]] = []
    for trace in map(Path, args.traces.split(",")):
        name = trace.parent.name or trace.stem
        runs.append((name, functools.partial(replay_trace, name, trace, Path(args.out) / name, args)))
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama,qwen3-moe,llama-fp8")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=512, help="prefill tokens")
    parser.add_argument("--decode-steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="small dimensions, for checking the script on a CPU")
    parser.add_argument("--cache-modes", default="auto",
                        help="replay the database once per cache mode (comma list; MODE+markers: every repeat delimited)")
    parser.add_argument("--reference-spread", action="store_true",
                        help="profile each model twice and report how far the in-model durations move between the runs")
    parser.add_argument("--second-process", action="store_true",
                        help="profile each model again in a new process: the reference's spread between processes, "
                             "and the replay judged against that second profile too")
    parser.add_argument("--profile-only", action="store_true", help="profile and write the trace; no ingest, no replay")
    parser.add_argument("--traces", help="replay these trace files (comma list) instead of profiling --models")
    parser.add_argument("--no-capture", action="store_true", help="profile without recording the grouped GEMMs' groups")
    parser.add_argument("--no-execution-trace", action="store_true",
                        help="profile without the execution trace (ingest then infers each input's producer from shapes)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    reports = []
    for name, run in planned_runs(args):
        if name == "llama-fp8" and args.device != "cuda":
            print("llama-fp8: skipped (FP8 GEMMs need CUDA)")
            continue
        for report in run():
            reports.append(report)
            print_report(report)
            print_against_other_profiles(report)
    path = Path(args.out) / "model_coverage.json"
    path.write_text(json.dumps(merged_document(path, reports, vars(args)), indent=1))
    return 0


def merged_document(path: Path, reports: list[ModelReport], settings: dict[str, Any]) -> dict[str, Any]:
    """The JSON document of ``reports``, with the models an earlier run wrote into ``path`` kept
    (a sweep run one model at a time into one folder keeps every model's rows); a model measured
    again replaces its earlier entry.  Each summary carries the settings it was measured with."""
    earlier = json.loads(path.read_text()) if path.exists() else {}
    measured = {report.model for report in reports}
    summary = [entry for entry in earlier.get("summary", []) if entry.get("model") not in measured]
    rows = {model: entries for model, entries in earlier.get("rows", {}).items() if model not in measured}
    summary += [dict(report.summary(), settings=settings) for report in reports]
    rows.update({report.model: [vars(row) for row in report.rows] for report in reports})
    return {"summary": summary, "rows": rows, "settings": settings}


if __name__ == "__main__":
    sys.exit(main())
