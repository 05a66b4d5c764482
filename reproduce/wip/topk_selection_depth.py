"""Whether a router's top-k time is set by how deep each row's radix selection reads.

CUDA's top-k over short rows (``sbtopk::gatherTopK``, one block per row) stops reading a row's
bits once its k-th value shares its prefix with no other value of the row; a tie reads every
digit, and one launch takes as long as its deepest rows.  Routers give ties: a softmax of
bfloat16 logits gives equal scores to experts with equal logits.  Here each router's top-k is
timed (kernel durations from the profiler, median of 60 calls, caches warm) on:

* ``model``: the router's own scores (bfloat16 logits of normal hidden states, nn.Linear's
  initialisation, a float32 softmax; GraniteMoE takes its top-k of the bfloat16 logits);
* ``fp32 logits``: the same router computed in float32 (no ties);
* ``quantiles``: values drawn from the scores' 17 quantiles, as a row without depths replays;
* ``+ depths``: those draws rebuilt to the scores' selection depths, as a row with
  ``Profiling Selection Depths`` replays (``perf_plugin.replay.value_draws.with_recorded_depths``).

Prerequisites: a CUDA GPU; the project installed (``pip install -e .``).

    python reproduce/wip/topk_selection_depth.py

Expected output: per router and seed, the tied rows and deepest row of each input, and the
gatherTopK kernel's median duration on each.
"""

from __future__ import annotations

import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from perf_plugin.capture.pending_copies import quantiles_of
from perf_plugin.capture.selection_depth import depth_histogram
from perf_plugin.replay.value_draws import draw_from_quantiles, with_recorded_depths

DEVICE = torch.device("cuda")
CALLS = 60
HIDDEN = 4096
# name, tokens, experts, k, top-k of the softmax (else of the bfloat16 logits)
ROUTERS = [
    ("Mixtral prefill", 512, 8, 2, True),
    ("Mixtral decode", 1, 8, 2, True),
    ("OLMoE prefill", 512, 64, 8, True),
    ("Qwen2-MoE prefill", 512, 60, 4, True),
    ("GraniteMoE prefill", 512, 40, 8, False),
]


def gather_topk_us(x: torch.Tensor, k: int) -> float:
    for _ in range(5):
        torch.topk(x, k)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            torch.topk(x, k)
        torch.cuda.synchronize()
    return statistics.median(e.device_time for e in prof.events() if "gatherTopK" in e.name)


def router(tokens: int, experts: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    hidden = torch.randn(tokens, HIDDEN, device=DEVICE, generator=generator).to(torch.bfloat16)
    bound = HIDDEN ** -0.5
    weight = ((torch.rand(experts, HIDDEN, device=DEVICE, generator=generator) * 2 - 1) * bound).to(torch.bfloat16)
    return hidden.to(dtype) @ weight.to(dtype).t()


def summary(x: torch.Tensor, k: int) -> str:
    dtype = str(x.dtype).removeprefix("torch.")
    histogram = depth_histogram(x.tolist(), k, True, dtype)
    width = x.element_size() * 8
    return f"{histogram.get(width, 0)} tied, deepest {max(histogram)}"


def main() -> None:
    print(torch.__version__, torch.cuda.get_device_name())
    for name, tokens, experts, k, softmax in ROUTERS:
        for seed in (0, 1):
            logits = router(tokens, experts, seed, torch.bfloat16)
            exact = router(tokens, experts, seed, torch.float32)
            model = torch.softmax(logits, -1, dtype=torch.float32) if softmax else logits
            unquantised = torch.softmax(exact, -1) if softmax else exact.to(torch.bfloat16)
            generator = torch.Generator(device=DEVICE).manual_seed(7)
            quantiles = quantiles_of(model.flatten().float().tolist())
            drawn = draw_from_quantiles(quantiles, model.numel(), model.dtype, DEVICE, generator).view(model.shape)
            dtype = str(model.dtype).removeprefix("torch.")
            histogram = depth_histogram(model.tolist(), k, True, dtype)
            rebuilt = with_recorded_depths(drawn, k, -1, True, histogram, generator)
            inputs = {"model": model, "fp32 logits": unquantised, "quantiles": drawn, "+ depths": rebuilt}
            times = {label: gather_topk_us(x, k) for label, x in inputs.items()}
            print(f"{name} [{tokens}, {experts}] top-{k}, seed {seed}: "
                  + "; ".join(f"{label} {summary(x, k)}" for label, x in inputs.items()))
            print("   gatherTopK us: " + "  ".join(f"{label} {us:.2f}" for label, us in times.items())
                  + f"  (+ depths / model {times['+ depths'] / times['model']:.3f},"
                  f" quantiles / model {times['quantiles'] / times['model']:.3f})")


if __name__ == "__main__":
    main()
