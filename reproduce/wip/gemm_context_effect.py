"""How long a prefill GEMM takes depending on what the device ran around it.

Investigates the prefill gap of ``benchmarks/model_coverage.py``: some prefill GEMMs of a Llama
model replay faster than they ran inside the model.  For the GEMMs of one Llama-3.1-8B decoder
layer at 512 tokens (bf16, ``F.linear``), this times, in one torch.profiler session per variant:

* ``produced``: each repeat after an eviction by reads and a rewrite of the activation (how the
  harness's ``produced`` mode times a case), one weight, 30 repeats;
* ``warm``: 30 repeats back to back on one weight;
* ``weights-pool``: 30 repeats cycling through 8 weights of the same shape (a model reads each
  layer's weights once);
* ``layers``: a layer's sequence of GEMMs (q, k, v, o, gate, up, down, with the element-wise
  kernels between them) over 4 layers of distinct weights, 3 passes, as the model runs them;
* ``layers-shared``: the same sequence with one set of weights for every layer.

and prints, per GEMM shape and variant, the median device duration, with each variant's ratio
to ``layers``.  Prerequisites: an NVIDIA GPU and torch with CUDA.
``python reproduce/wip/gemm_context_effect.py``
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

REPEATS = 30
TOKENS, HIDDEN, KV, INTER = 512, 4096, 1024, 14336
SHAPES = {"q": (HIDDEN, HIDDEN), "k": (KV, HIDDEN), "v": (KV, HIDDEN), "o": (HIDDEN, HIDDEN),
          "gate": (INTER, HIDDEN), "up": (INTER, HIDDEN), "down": (HIDDEN, INTER)}


def gemm_durations(run: Callable[[], Any]) -> dict[tuple[int, ...], list[float]]:
    """Device durations (us) of the GEMM kernels ``run`` launches, keyed by (M, N, K) of the call."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        run()
        torch.cuda.synchronize()
    found: dict[tuple[int, ...], list[float]] = defaultdict(list)
    for event in prof.events():
        if event.name not in ("aten::mm", "aten::addmm") or not event.input_shapes:
            continue
        a, b = event.input_shapes[-2], event.input_shapes[-1]
        for kernel in event.kernels:
            found[(a[0], b[1], a[1])].append(kernel.duration)
    return found


def main() -> None:
    device = torch.device("cuda")
    bf16 = torch.bfloat16
    torch.manual_seed(0)
    x = torch.randn(TOKENS, HIDDEN, device=device, dtype=bf16)
    xi = torch.randn(TOKENS, INTER, device=device, dtype=bf16)
    layers = [{name: torch.randn(shape, device=device, dtype=bf16) * 0.02 for name, shape in SHAPES.items()}
              for _ in range(4)]
    evict_buffer = torch.empty(2 * torch.cuda.get_device_properties(device).L2_cache_size, dtype=torch.uint8,
                               device=device).view(torch.int32)

    def layer_pass(weights_per_layer: list[dict[str, torch.Tensor]]) -> None:
        for weights in weights_per_layer:
            h = x * 1.0001
            F.linear(h, weights["q"]); F.linear(h, weights["k"]); F.linear(h, weights["v"])
            F.linear(h * 1.0001, weights["o"])
            gate, up = F.linear(h, weights["gate"]), F.linear(h, weights["up"])
            F.linear(F.silu(gate) * up, weights["down"])

    variants: dict[str, Callable[[str], Callable[[], Any]]] = {}

    def inputs_of(name: str) -> torch.Tensor:
        return xi if name == "down" else x

    def produced(name: str) -> Callable[[], Any]:
        def run() -> None:
            time.sleep(0.05)
            for _ in range(REPEATS):
                evict_buffer.amax()
                inputs_of(name).mul_(1)
                F.linear(inputs_of(name), layers[0][name])
        return run

    def warm(name: str) -> Callable[[], Any]:
        return lambda: [F.linear(inputs_of(name), layers[0][name]) for _ in range(REPEATS)]

    pool = {name: [torch.randn(shape, device=device, dtype=bf16) for _ in range(8)] for name, shape in SHAPES.items()}

    def weights_pool(name: str) -> Callable[[], Any]:
        return lambda: [F.linear(inputs_of(name), pool[name][k % 8]) for k in range(REPEATS)]

    variants.update({"produced": produced, "warm": warm, "weights-pool": weights_pool})
    for _ in range(3):
        layer_pass(layers)
    results: dict[str, dict[tuple[int, ...], float]] = {}
    for variant, make in variants.items():
        results[variant] = {}
        for name in SHAPES:
            durations = gemm_durations(make(name))
            for key, values in durations.items():
                results[variant][key] = statistics.median(values)
    for variant, weights in (("layers", layers), ("layers-shared", [layers[0]] * 4)):
        durations = gemm_durations(lambda: [layer_pass(weights) for _ in range(3)])
        results[variant] = {key: statistics.median(values) for key, values in durations.items()}
    names = list(results)
    print(f"{'M x N x K':<22}" + "".join(f"{n:>16}" for n in names))
    for key in sorted(results["layers"]):
        base = results["layers"][key]
        cells = [f"{results[n].get(key, float('nan')):8.2f} ({results[n].get(key, float('nan')) / base:4.2f})" for n in names]
        print(f"{'x'.join(map(str, key)):<22}" + "".join(f"{c:>16}" for c in cells))


if __name__ == "__main__":
    main()
