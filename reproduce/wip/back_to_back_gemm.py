"""What makes a small GEMM run longer right behind a kernel that streamed megabytes (H100).

JetMoE's attention experts' GEMMs (``[96-151,2048] x [2048,2048]`` bf16) ran 15-30 % longer in
the model than replayed (``jetmoe_expert_gemm.py``): longer right behind another expert's GEMM
or an 8 MB copy than after a gap.  Two explanations differ in what they predict:

* dirty lines: the kernel before left written lines in the L2, and the GEMM's weight stream pays
  their write-back; a read-only kernel before it would cost nothing, and an idle gap after a
  write would not help unless the L2 cleans lines while idle;
* back-to-back traffic: any kernel that streamed memory just before (read or write) slows it.

Each scenario runs its kernels inside one profiled region and takes the GEMM's kernel time,
median of 20 (us): ``clean`` reads twice the L2 (a sum), ``dirty`` writes twice the L2 (a fill),
``gap`` synchronises and sleeps 1 ms, ``copy 8`` copies 8 MB, ``read 8`` sums 8 MB, ``gemm``
runs another expert's GEMM on its own 8 MB weight.

Result on an H100 80GB HBM3 (torch 2.11, CUDA 13), us, 96 / 135 rows:

| before the GEMM | us |
|---|---|
| clean | 6.85 / 7.30 |
| clean, gap | 6.88 / 7.30 |
| dirty | 7.52 / 7.84 |
| dirty, gap | 7.52 / 7.81 |
| clean, gap, copy 8 | 6.37 / 6.58 |
| clean, gap, read 8 | 7.09 / 7.42 |
| clean, gap, gemm | 6.91 / 7.26 |
| dirty, gap, read 8 | 7.65 / 8.11 |
| dirty, gap, gemm | **8.35 / 8.70** |

Neither explanation alone: a cache full of dirty lines costs 7-10 %, and an idle millisecond does
not clean them; another GEMM right before costs nothing in a clean cache, but 11 % more on top of
the dirty lines (the write-backs of the lines its weight stream evicted, still draining when
this GEMM starts).  The model's calls (6.7-9.3 us) span that range: a replay that writes the
cache's recorded share dirty before each repeat reaches the "dirty" line, not the last one.

Prerequisites: a CUDA GPU.

    python reproduce/wip/back_to_back_gemm.py [ROWS ...]

Expected output: one line per scenario and row count, ``scenario  ROWS  MEDIAN_US``.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

REPEATS = 20


def last_kernel_us(steps: list[Callable[[], object]]) -> float:
    times = []
    for _ in range(REPEATS):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for step in steps:
                step()
            torch.cuda.synchronize()
        kernels = sorted((e.time_range.start, e.time_range.elapsed_us()) for e in prof.events()
                         if e.device_type == torch.autograd.DeviceType.CUDA)
        times.append(kernels[-1][1])
    return statistics.median(times)


def main() -> None:
    rows_list = [int(a) for a in sys.argv[1:]] or [96, 135]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print(f"device {torch.cuda.get_device_name()}  L2_cache_size {l2}")
    flush = torch.empty(2 * l2 // 4, device="cuda")
    eight = torch.empty(8 * 2**20 // 2, device="cuda", dtype=torch.bfloat16)
    eight_out = torch.empty_like(eight)
    w, w_other = (torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16) for _ in range(2))

    def clean() -> None:
        flush.sum()

    def dirty() -> None:
        flush.fill_(1.0)

    def gap() -> None:
        torch.cuda.synchronize()
        time.sleep(0.001)

    for rows in rows_list:
        x = torch.randn(rows, 2048, device="cuda", dtype=torch.bfloat16)
        x_other = torch.randn(rows, 2048, device="cuda", dtype=torch.bfloat16)

        def gemm() -> None:
            F.linear(x, w)  # noqa: B023

        scenarios = {
            "clean, gemm": [clean, gemm],
            "clean, gap, gemm": [clean, gap, gemm],
            "dirty, gemm": [dirty, gemm],
            "dirty, gap, gemm": [dirty, gap, gemm],
            "clean, gap, copy 8, gemm": [clean, gap, lambda: eight_out.copy_(eight), gemm],
            "clean, gap, read 8, gemm": [clean, gap, lambda: eight.sum(), gemm],
            "clean, gap, gemm, gemm": [clean, gap, lambda: F.linear(x_other, w_other), gemm],  # noqa: B023
            "dirty, gap, read 8, gemm": [dirty, gap, lambda: eight.sum(), gemm],
            "dirty, gap, gemm, gemm": [dirty, gap, lambda: F.linear(x_other, w_other), gemm],  # noqa: B023
        }
        for label, steps in scenarios.items():
            print(f"{label:28s}{rows:5d}  {last_kernel_us(steps):.2f}")


if __name__ == "__main__":
    main()
