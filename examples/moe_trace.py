"""Profile a routed MoE layer with its routing recorded, ingest it, ready for ``pytest bench``.

The layer is a Mixtral-style sparse block: a linear router, softmax, top-k, tokens sorted by
expert, ``torch.histc`` counts and ``cumsum`` offsets, then the experts' SwiGLU MLP as two
``torch._grouped_mm`` calls (gate+up, down), as ``transformers``' ``grouped_mm`` experts run it.
How many rows each expert gets sets the grouped GEMMs' time, and the shapes do not say it: the
forward pass runs under ``torch.profiler`` and ``perf_plugin.capture.capture_input_values``, so
the ingested ``GroupedMatmul`` rows carry the model's groups (``Input Values``).

``--skew`` adds a Zipf-shaped bias to the router's logits (expert ``i`` gets ``-skew * log(i+1)``):
0 routes about evenly (random weights), larger values send more tokens to the first experts.

Prerequisites: torch (with CUDA for ``--device cuda``; ``torch._grouped_mm`` takes BF16), this
project installed (``pip install -e .``).

    python examples/moe_trace.py --device cuda --tokens 4096 --experts 8 --top-k 2 --skew 1.0 --out DIR
    pytest bench --perf-database-path DIR --perf-backend cuda

Expected output: the rows per expert of the profiled pass, then the ingest report (the capture's
calls attached, rows measured) and the database directory.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class MoeShape:
    hidden: int = 4096
    intermediate: int = 14336
    experts: int = 8
    top_k: int = 2


def build_layer(shape: MoeShape, device: str, skew: float, seed: int = 0) -> Any:
    import torch

    class SparseMoe(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            generator = torch.Generator(device=device).manual_seed(seed)  # drawn where they live: GBs of weights

            def weight(*size: int) -> torch.Tensor:
                w = torch.randn(*size, generator=generator, device=device).div_(math.sqrt(size[-2]))
                return torch.nn.Parameter(w.to(torch.bfloat16), requires_grad=False)

            self.router = weight(shape.hidden, shape.experts)
            self.gate_up = weight(shape.experts, shape.hidden, 2 * shape.intermediate)
            self.down = weight(shape.experts, shape.intermediate, shape.hidden)
            bias = [-skew * math.log(i + 1) for i in range(shape.experts)]
            self.register_buffer("router_bias", torch.tensor(bias, device=device, dtype=torch.float32))

        def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            """(expert weights [T,k], the sorted order of token-expert pairs, cumulative offsets)."""
            logits = (x @ self.router).float() + self.router_bias
            weights, experts = torch.softmax(logits, dim=-1).topk(shape.top_k, dim=-1)
            flat = experts.reshape(-1)
            sorted_experts, order = torch.sort(flat)
            counts_input = sorted_experts.float() if x.device.type == "cpu" else sorted_experts.int()
            counts = torch.histc(counts_input, bins=shape.experts, min=0, max=shape.experts - 1)
            return weights, order, torch.cumsum(counts, dim=0, dtype=torch.int32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            weights, order, offsets = self.route(x)
            rows = x[order // shape.top_k]
            h = torch._grouped_mm(rows, self.gate_up, offs=offsets)
            gate, up = h.chunk(2, dim=-1)
            y = torch._grouped_mm(torch.nn.functional.silu(gate) * up, self.down, offs=offsets)
            y = y * weights.reshape(-1)[order].unsqueeze(1).to(y.dtype)
            return torch.zeros_like(x).index_add_(0, order // shape.top_k, y)

    return SparseMoe().eval()


def rows_per_expert(layer: Any, x: Any) -> list[int]:
    """How many rows each expert gets for ``x`` (the routing the profiled pass will see)."""
    import torch

    with torch.no_grad():
        _, _, offsets = layer.route(x)
    ends = offsets.tolist()
    return [end - start for start, end in zip([0, *ends], ends)]


def profile_layer(layer: Any, x: Any, trace: Path, iterations: int = 1, capture: bool = True) -> None:
    """One warm-up pass, then ``iterations`` passes under the profiler (and the capture, which
    writes ``<trace>.values.json`` beside the trace)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from perf_plugin.capture import capture_input_values
    from perf_plugin.trace.values_file import sidecar_path

    cuda = x.device.type == "cuda"
    with torch.no_grad():
        layer(x)
        if cuda:
            torch.cuda.synchronize()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities, record_shapes=True) as prof:
            with capture_input_values(sidecar_path(trace) if capture else None):
                for _ in range(iterations):
                    layer(x)
            if cuda:
                torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))


def main(argv: list[str] | None = None) -> int:
    import torch

    from perf_plugin.ingest.pipeline import ingest_path

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--intermediate", type=int, default=14336)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--skew", type=float, default=0.0)
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--no-capture", action="store_true", help="profile without recording the routing")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    shape = MoeShape(args.hidden, args.intermediate, args.experts, args.top_k)
    layer = build_layer(shape, args.device, args.skew)
    x = torch.randn(args.tokens, args.hidden, generator=torch.Generator().manual_seed(1)).to(args.device, torch.bfloat16)
    print(f"rows per expert: {rows_per_expert(layer, x)}")
    args.out.mkdir(parents=True, exist_ok=True)
    trace = args.out / "moe_trace.json"
    profile_layer(layer, x, trace, args.iterations, capture=not args.no_capture)
    report = ingest_path(trace, args.out / "db")
    print("\n".join(report.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
