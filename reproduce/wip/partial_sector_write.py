"""Why a decode norm's one-element kernels run slower in a model than after ``produced``'s rewrite.

Granite's decode ``rsqrt`` of one float took 1.18-1.22 us in the model and 0.99-1.03 us replayed;
so did the ``add`` of ``eps`` before it and the ``mul`` by its result after.  Two experiments, each
timed from ``torch.profiler``'s kernel durations (median over 30 repeats):

1. What precedes the norm: a decode GEMV streaming a 90 MB weight, a read of twice the last-level
   cache, or nothing, each followed by the norm's kernels (``to(float32)``, ``pow``, ``mean``,
   ``add eps``) and the ``rsqrt``; with 30 us host gaps between kernels, as eager decode has, or
   none.
2. How the ``rsqrt``'s input was written after a read of twice the cache: multiplied in place (a
   read, then a write: what ``produced`` did), or written without a read (``copy_`` from a clone,
   a byte copy, ``add(out=)``); and the same for eight floats, a whole 32-byte sector.

Result on an H200 (torch 2.11, CUDA 13; clocks at 1980 MHz throughout), us: after the GEMV 1.216,
after the read 1.216-1.248, after the norm's kernels alone 1.024, with or without host gaps.
Written without a read 1.184-1.216, multiplied in place 0.992; eight floats either way 0.992.
A write of part of a sector whose line has left the cache leaves the line partly valid, and the
reader fetches the rest from memory (``perf_plugin.replay.cache_modes.produce_inputs``).

Prerequisites: a CUDA GPU.

    python reproduce/wip/partial_sector_write.py

Expected output: one line per scenario, ``scenario  rsqrt  MEDIAN_US``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

REPEATS = 30


def spin(microseconds: float) -> None:
    """A host gap: eager decode launches each kernel tens of microseconds after the one before."""
    started = time.perf_counter()
    while (time.perf_counter() - started) * 1e6 < microseconds:
        pass


def median_rsqrt_us(before: Callable[[], Any], kernel: Callable[[], Any]) -> float:
    """The median device time of the ``rsqrt`` kernels ``kernel`` launches, each after ``before``."""
    for _ in range(5):
        before()
        kernel()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPEATS):
            before()
            kernel()
        torch.cuda.synchronize()
    times = [e.device_time for e in prof.events() if e.device_type.name == "CUDA" and "rsqrt" in e.name]
    return statistics.median(times)


def preceding_work() -> None:
    """Experiment 1: the norm's ``rsqrt`` after a GEMV, a read of twice the cache, or neither."""
    cache = torch.cuda.get_device_properties(0).L2_cache_size
    buffer = torch.ones(2 * cache // 4, device="cuda")
    weights = [torch.randn(11008, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(6)]
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    hidden = torch.randn(1, 1, 4096, device="cuda", dtype=torch.bfloat16)
    calls = iter(range(10**9))

    def norm(gap: float) -> None:
        states = hidden.to(torch.float32)
        spin(gap)
        squares = states.pow(2)
        spin(gap)
        variance = squares.mean(-1, keepdim=True)
        spin(gap)
        shifted = variance + 1e-6
        spin(gap)
        torch.rsqrt(shifted)
        spin(gap)

    def residual(gap: float) -> None:
        hidden.add_((x * 0.5).view(1, 1, 4096))
        spin(gap)

    def gemv(gap: float) -> None:
        x @ weights[next(calls) % len(weights)].t()
        spin(gap)
        residual(gap)

    def read(gap: float) -> None:
        buffer.sum()
        spin(gap)
        residual(gap)

    for gap in (30.0, 0.0):
        for name, step in (("after a GEMV", gemv), ("after a read of twice the cache", read), ("norm alone", residual)):
            us = median_rsqrt_us(lambda: None, lambda step=step: (step(gap), norm(gap)))
            print(f"{name + f', host gaps {gap:g} us':<48} rsqrt {us:.3f}", flush=True)


def input_writes() -> None:
    """Experiment 2: the ``rsqrt``'s input written with or without a read, after a read of twice the cache."""
    cache = torch.cuda.get_device_properties(0).L2_cache_size
    buffer = torch.ones(2 * cache // 4, device="cuda")
    one = torch.rand(1, 1, 1, device="cuda") + 0.5
    eight = torch.rand(8, device="cuda") + 0.5
    one_values, eight_values = one.clone(), eight.clone()
    one_bytes = one.view(torch.uint8).view(-1)
    one_bytes_values = one_bytes.clone()
    scenarios: dict[str, tuple[torch.Tensor, Callable[[], Any]]] = {
        "one float, multiplied in place": (one, lambda: one.mul_(1.0)),
        "one float, copy_ from a clone": (one, lambda: one.copy_(one_values)),
        "one float, its bytes copied": (one, lambda: one_bytes.copy_(one_bytes_values)),
        "one float, add(out=)": (one, lambda: torch.add(one_values, 0.0, out=one)),
        "eight floats, add(out=)": (eight, lambda: torch.add(eight_values, 0.0, out=eight)),
        "eight floats, multiplied in place": (eight, lambda: eight.mul_(1.0)),
    }
    for name, (tensor, write) in scenarios.items():
        us = median_rsqrt_us(lambda write=write: (buffer.sum(), write()), lambda tensor=tensor: torch.rsqrt(tensor))
        print(f"{name:<48} rsqrt {us:.3f}", flush=True)


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    preceding_work()
    input_writes()


if __name__ == "__main__":
    main()
