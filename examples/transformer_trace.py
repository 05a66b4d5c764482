"""Profile decoder layers of a real architecture, ingest the trace, ready for ``pytest bench``.

The layer follows a model configuration of ``perf_plugin.grid.models`` (Llama-3.1 by default:
RMSNorm, grouped-query attention with rotary embeddings, SwiGLU MLP) with random weights, so no
download is needed.  Its forward pass runs under ``torch.profiler`` with ``record_shapes=True``;
``perf_plugin.ingest.ingest_profiler`` turns the live profiler into a database directory whose
rows the replays can run.

Prerequisites: torch (with CUDA for ``--device cuda``), this project installed
(``pip install -e .``).

    python examples/transformer_trace.py --device cuda --dtype bf16 --tokens 512 --layers 4 --iterations 3 --out DIR
    pytest bench --perf-database-path DIR --perf-backend cuda

``--scale`` divides hidden size, heads and intermediate size (keeping head_dim and the GQA ratio)
for quick CPU runs; the project's tests use it (``tests/test_transformer_trace_replay.py`` loads
this file by path).

Expected output: a line naming the model, layers, passes, tokens, dtype and device, then one
line per CSV written to ``DIR`` (kernel type and rows).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LayerShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int


def layer_shape(model: str, scale: int = 1) -> LayerShape:
    from perf_plugin.grid.models import find_model

    config = find_model(model)
    heads = max(config.heads // scale, config.heads // config.kv_heads)
    kv_heads = max(heads * config.kv_heads // config.heads, 1)
    return LayerShape(
        hidden=heads * config.head_dim,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=config.head_dim,
        intermediate=config.intermediate // scale,
        vocab=config.vocab // scale,
    )


def build_weights(shape: LayerShape, tokens: int, device: str, dtype: Any, layers: int = 1) -> dict[str, Any]:
    """Random weights (one set per decoder layer) and inputs, built outside the profiled region."""
    import torch

    def weight(*dims: int) -> Any:
        return torch.randn(*dims, device=device, dtype=dtype) / math.sqrt(dims[-1])

    def layer() -> dict[str, Any]:
        return {
            "wq": weight(shape.heads * shape.head_dim, shape.hidden),
            "wk": weight(shape.kv_heads * shape.head_dim, shape.hidden),
            "wv": weight(shape.kv_heads * shape.head_dim, shape.hidden),
            "wo": weight(shape.hidden, shape.heads * shape.head_dim),
            "w_gate": weight(shape.intermediate, shape.hidden),
            "w_up": weight(shape.intermediate, shape.hidden),
            "w_down": weight(shape.hidden, shape.intermediate),
            "norm1": torch.ones(shape.hidden, device=device, dtype=dtype),
            "norm2": torch.ones(shape.hidden, device=device, dtype=dtype),
        }

    positions = torch.arange(tokens, device=device, dtype=torch.float32)
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, shape.head_dim, 2, device=device, dtype=torch.float32) / shape.head_dim))
    angles = torch.outer(positions, inv_freq)
    return {
        "embed": weight(shape.vocab, shape.hidden),
        "final_norm": torch.ones(shape.hidden, device=device, dtype=dtype),
        "layers": [layer() for _ in range(layers)],
        "ids": torch.randint(0, shape.vocab, (tokens,), device=device),
        "cos": angles.cos().to(dtype)[:, None, :],
        "sin": angles.sin().to(dtype)[:, None, :],
        "causal": torch.ones(tokens, tokens, device=device, dtype=torch.bool).triu(1),
    }


def decoder_layer(shape: LayerShape, w: dict[str, Any], layer: dict[str, Any], hidden: Any) -> Any:
    """One Llama-style decoder layer, written with plain torch ops."""
    import torch
    import torch.nn.functional as F

    tokens = hidden.shape[0]
    half = shape.head_dim // 2

    def rope(x: Any) -> Any:  # x: [tokens, heads, head_dim], rotate-half form
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * w["cos"] - x2 * w["sin"], x2 * w["cos"] + x1 * w["sin"]), dim=-1)

    x = F.rms_norm(hidden, (shape.hidden,), layer["norm1"], eps=1e-5)
    q = rope(F.linear(x, layer["wq"]).view(tokens, shape.heads, shape.head_dim))
    k = rope(F.linear(x, layer["wk"]).view(tokens, shape.kv_heads, shape.head_dim))
    v = F.linear(x, layer["wv"]).view(tokens, shape.kv_heads, shape.head_dim)
    groups = shape.heads // shape.kv_heads
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    scores = torch.bmm(q.transpose(0, 1), k.transpose(0, 1).transpose(1, 2)) * (1.0 / math.sqrt(shape.head_dim))
    probs = scores.masked_fill(w["causal"], float("-inf")).softmax(dim=-1)
    attn = torch.bmm(probs, v.transpose(0, 1)).transpose(0, 1).contiguous().view(tokens, -1)
    hidden = hidden + F.linear(attn, layer["wo"])
    x = F.rms_norm(hidden, (shape.hidden,), layer["norm2"], eps=1e-5)
    return hidden + F.linear(F.silu(F.linear(x, layer["w_gate"])) * F.linear(x, layer["w_up"]), layer["w_down"])


def model_forward(shape: LayerShape, w: dict[str, Any]) -> Any:
    """Embedding, the decoder layers in order, final norm."""
    import torch.nn.functional as F

    hidden = F.embedding(w["ids"], w["embed"])
    for layer in w["layers"]:
        hidden = decoder_layer(shape, w, layer, hidden)
    return F.rms_norm(hidden, (shape.hidden,), w["final_norm"], eps=1e-5)


def profile_and_ingest(
    model: str,
    tokens: int,
    device: str,
    dtype_name: str,
    out: Path,
    scale: int = 1,
    layers: int = 1,
    iterations: int = 1,
) -> Any:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from perf_plugin.ingest.pipeline import ingest_profiler

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    shape = layer_shape(model, scale)
    weights = build_weights(shape, tokens, device, dtype, layers)
    model_forward(shape, weights)  # warm-up: lazy initialisation stays out of the trace
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=activities, record_shapes=True) as prof:
        # back to back, as in serving: each layer's kernels find in the cache what the previous
        # kernels left there, and the weights of distinct layers do not
        for _ in range(iterations):
            model_forward(shape, weights)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    return ingest_profiler(prof, out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--scale", type=int, default=1)
    parser.add_argument("--layers", type=int, default=1, help="decoder layers, each with its own weights")
    parser.add_argument("--iterations", type=int, default=1, help="forward passes profiled back to back")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    profile_and_ingest(args.model, args.tokens, args.device, args.dtype, args.out, args.scale, args.layers, args.iterations)
    print(
        f"{args.model}: {args.layers} decoder layer(s) x {args.iterations} forward pass(es), {args.tokens} tokens, "
        f"{args.dtype} on {args.device} -> {args.out}"
    )
    for path in sorted(args.out.glob("*.csv")):
        rows = max(len(path.read_text().splitlines()) - 1, 0)
        print(f"{path.stem:28} {rows:4} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
