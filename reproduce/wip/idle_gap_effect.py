"""Whether a short kernel launched onto an idle device takes longer the longer the device idled.

Decode kernels of 1-3 us replay within 10 % of their in-model durations for most rows but not all,
in both directions, and a profile of the same model in another process moves them by 12-18 %
(Phi-3 on an H200, ``benchmarks/model_coverage.py --second-process``).  A host-bound decode step
leaves the device idle for 20-400 us before each of them; the replay's ``idle`` wait is shorter.
Here four such kernels (an in-place add of one element, ``rsqrt`` of one, a bf16-to-float copy of
``[1,1,3072]``, a rotary ``mul`` of ``[1,16,1,128]`` by ``[1,1,1,128]``) are each launched 40
times: back to back; after a synchronisation and a host spin of 0, 20, 100, 1000 and 5000 us;
after a write of 256 MB (inputs and code evicted from the L2); after a 4096-cube GEMM; after 16
other element-wise kernels (code evicted from the instruction caches); after both.  Durations are
the profiler's kernel times.

Result on an H200 (torch 2.11, CUDA 13), median us of 40 launches:

    kernel    back to back  idle 0-5000 us   after the write  after the GEMM  code evicted  write + code
    add1      0.83          0.83-0.90        0.96             0.96            0.86          1.02
    rsqrt     0.99          0.99             1.15             1.15            1.02          1.15
    cast      2.00          2.02             3.10             3.17            2.30          3.07
    mul_rot   1.66          1.66             2.78             2.85            1.92          2.91

How long the device idled does not move them (within 0.07 us from 0 to 5000 us); where their
inputs and code were does, by up to 75 %: what ``produced`` and the code eviction reproduce from
each row's reuse distances.  The spread between processes is not explained by the idle time.

Prerequisites: a CUDA GPU, torch.

    python reproduce/wip/idle_gap_effect.py

Expected output: one line per kernel and condition (median, min, max, the median gap before it).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

DEVICE = "cuda"
GAPS_US = {"sync0": 0, "sync20": 20, "sync100": 100, "sync1000": 1000, "sync5000": 5000}
CONDITIONS = ("b2b", *GAPS_US, "flush", "gemm", "code", "flush_code")


def spin(us: float) -> None:
    end = time.perf_counter_ns() + int(us * 1000)
    while time.perf_counter_ns() < end:
        pass


def main() -> None:
    one = torch.ones(1, device=DEVICE)
    scalar = torch.rand(1, 1, 1, device=DEVICE) + 0.5
    hidden = torch.randn(1, 1, 3072, device=DEVICE, dtype=torch.bfloat16)
    query = torch.randn(1, 16, 1, 128, device=DEVICE, dtype=torch.bfloat16)
    cos = torch.randn(1, 1, 1, 128, device=DEVICE, dtype=torch.bfloat16)
    big = torch.randn(4096, 4096, device=DEVICE, dtype=torch.bfloat16)
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=DEVICE)
    small = torch.randn(1024, device=DEVICE)
    others = (torch.sin, torch.cos, torch.exp, torch.log1p, torch.tanh, torch.sigmoid, torch.sqrt, torch.abs,
              torch.neg, torch.floor, torch.ceil, torch.round, torch.erf, torch.expm1, torch.log, torch.reciprocal)
    kernels: dict[str, tuple[Callable[[], object], Callable[[str], bool]]] = {
        "add1": (lambda: one.add_(1.0), lambda name: "OnSelf_add" in name),
        "rsqrt": (lambda: torch.rsqrt(scalar), lambda name: "rsqrt" in name),
        "cast": (lambda: hidden.float(), lambda name: "copy" in name),
        "mul_rot": (lambda: query * cos, lambda name: "Mul" in name),
    }

    def prepare(condition: str) -> None:
        if condition == "b2b":
            return
        if condition in ("flush", "flush_code"):
            flush.zero_()
        if condition == "gemm":
            big @ big
        if condition in ("code", "flush_code"):
            for function in others:
                function(small)
        torch.cuda.synchronize()
        spin(GAPS_US.get(condition, 0))

    for name, (launch, is_target) in kernels.items():
        for condition in CONDITIONS:
            for _ in range(5):
                prepare(condition)
                launch()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(40):
                    prepare(condition)
                    launch()
                torch.cuda.synchronize()
            spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                           if e.device_type.name == "CUDA")
            durations, gaps = [], []
            for previous, (start, end, kernel) in zip([None, *spans], spans):
                if is_target(kernel):
                    durations.append(end - start)
                    if previous is not None:
                        gaps.append(start - previous[1])
            print(f"{name:8s} {condition:10s} median {statistics.median(durations):.3f} min {min(durations):.3f} "
                  f"max {max(durations):.3f} gap {statistics.median(gaps) if gaps else float('nan'):.1f}")


if __name__ == "__main__":
    main()
