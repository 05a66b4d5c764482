"""An MoE layer's token gather (``x[token_idx]``, the permutation of tokens by expert) timed over
index patterns: the model's, the replay's uniform draw, and others of the same shape.

An MoE layer that dispatches by sorting its (token, slot) pairs by expert gathers its tokens with
``token_idx = argsort(expert_ids.flatten()) // top_k``: every token ``top_k`` times, ascending within
each expert's group. The replay of an ``aten.index`` row draws its indices uniformly over the
indexed dimension. The gather's kernel reads one source row per output row; this measures whether
the pattern moves its time, with the source cached (just written) and after a read of twice the
last-level cache.

Not run yet: written for the next GPU session (the combine's gather, ``out[inverse_perm]``, and the
dispatch's, ``hidden[perm // k]``, replayed at 0.82-0.92 of their in-model times in six MoE models
on an H100: docs/coverage.md).

Prerequisites: torch with CUDA.

    python reproduce/wip/permute_gather_indices.py

Expected output: per source shape and cache state, one line per pattern with the kernel's median
time (profiler kernel durations).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any


def patterns(tokens: int, experts: int, top_k: int) -> dict[str, Any]:
    import torch

    g = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.rand(tokens, experts, generator=g).argsort(dim=1)[:, :top_k]
    order = ids.flatten().argsort(stable=True)
    model = order // top_k
    count = tokens * top_k
    each_k_shuffled = torch.arange(count)[torch.randperm(count, generator=g)] // top_k
    return {
        "model (by expert)": model,
        "uniform draw (replay)": torch.randint(0, tokens, (count,), generator=g),
        "each token k times, shuffled": each_k_shuffled,
        "each token k times, sorted": torch.arange(count) // top_k,
        "tokens in order, k passes": torch.arange(count) % tokens,
    }


def time_gather(x: Any, index: Any, flush: Any, iterations: int) -> float:
    import torch
    from torch.profiler import ProfilerActivity, profile

    def once() -> None:
        if flush is not None:
            flush.sum()
        else:
            x.mul_(1.0)  # the source just written, as its producer left it
        x[index]

    for _ in range(3):
        once()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iterations):
            once()
        torch.cuda.synchronize()
    gathers = [e.device_time for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA and "gather" in e.name]
    return statistics.median(gathers)


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=6)
    parser.add_argument("--iterations", type=int, default=50)
    args = parser.parse_args(argv)
    flush = torch.empty(2 * 50 * 2**20 // 4, device="cuda")
    found = patterns(args.tokens, args.experts, args.top_k)
    for hidden, dtype in ((4096, torch.bfloat16), (2048, torch.float32), (7168, torch.bfloat16)):
        x = torch.randn(args.tokens, hidden, device="cuda", dtype=dtype)
        for state, evict in (("source cached", None), ("cache evicted", flush)):
            print(f"x [{args.tokens},{hidden}] {dtype}, {state}:")
            for name, index in found.items():
                us = time_gather(x, index.to("cuda"), evict, args.iterations)
                print(f"  {name:>30}: {us:7.3f} us")
    # the combine's gather: the experts' outputs back in token order, ``out[inverse_perm]``
    count = args.tokens * args.top_k
    g = torch.Generator(device="cpu").manual_seed(1)
    perm = torch.rand(args.tokens, args.experts, generator=g).argsort(dim=1)[:, :args.top_k].flatten().argsort(stable=True)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(count)
    rows = {"inverse permutation (model)": inverse, "uniform draw (replay)": torch.randint(0, count, (count,), generator=g),
            "random permutation": torch.randperm(count, generator=g)}
    for hidden, dtype in ((4096, torch.bfloat16), (4096, torch.float32)):
        x = torch.randn(count, hidden, device="cuda", dtype=dtype)
        for state, evict in (("source cached", None), ("cache evicted", flush)):
            print(f"x [{count},{hidden}] {dtype}, {state}:")
            for name, index in rows.items():
                us = time_gather(x, index.to("cuda"), evict, args.iterations)
                print(f"  {name:>30}: {us:7.3f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
