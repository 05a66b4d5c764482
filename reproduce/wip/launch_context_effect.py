"""How long a small kernel takes depending on what the device did just before it was launched.

Investigates the decode gap of ``benchmarks/model_coverage.py``: element-wise kernels of one
decode token take 1.1-2.5 us in a model run and replay 10-25 % faster in every cache mode.  A
model in decode is host-bound, so each kernel starts on an idle device after other kernels ran;
a replay queues its repeats back to back.  For a few decode-sized kernels this times, in one
torch.profiler session per variant, the same call

* ``queued``: 30 repeats back to back (how the harness times a case);
* ``after-other``: each repeat right after another small kernel (queued behind it);
* ``idle``: each repeat launched after the device finished everything (synchronize, 20 us host
  wait), caches left warm;
* ``idle-after-gemm``: as ``idle``, with a 4096x4096 GEMM run before the synchronize.

and prints the median device duration per variant.  Prerequisites: an NVIDIA GPU and torch with
CUDA.  ``python reproduce/wip/launch_context_effect.py``
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

REPEATS = 30


def kernels_of(call: Callable[[], Any]) -> set[str]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}


def timed(call: Callable[[], Any], before: Callable[[], Any] | None, names: set[str]) -> float:
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPEATS):
            if before is not None:
                before()
            call()
        torch.cuda.synchronize()
    durations = [e.device_time for e in prof.events()
                 if e.device_type == torch.autograd.DeviceType.CUDA and e.name in names]
    return statistics.median(durations)


def main() -> None:
    device = torch.device("cuda")
    bf16 = torch.bfloat16
    a, b = torch.randn(1, 1, 4096, device=device, dtype=bf16), torch.randn(1, 1, 4096, device=device, dtype=bf16)
    g, u = torch.randn(1, 1, 14336, device=device, dtype=bf16), torch.randn(1, 1, 14336, device=device, dtype=bf16)
    f32 = torch.randn(1, 1, 4096, device=device)
    other = torch.randn(1000, device=device)
    x, w = torch.randn(4096, 4096, device=device, dtype=bf16), torch.randn(4096, 4096, device=device, dtype=bf16)
    cases = {
        "add [1,1,4096] bf16": lambda: a + b,
        "mul [1,1,14336] bf16": lambda: g * u,
        "cast [1,1,4096] f32->bf16": lambda: f32.to(bf16),
        "rsqrt [1,1,1] f32": lambda: torch.rsqrt(f32[..., :1]),
        "mean [1,1,4096] f32": lambda: f32.mean(-1, keepdim=True),
    }

    def idle() -> None:
        torch.cuda.synchronize()
        end = time.perf_counter() + 20e-6
        while time.perf_counter() < end:
            pass

    def idle_after_gemm() -> None:
        torch.mm(x, w)
        idle()

    variants: dict[str, Callable[[], Any] | None] = {
        "queued": None,
        "after-other": lambda: other.mul_(1.0),
        "idle": idle,
        "idle-after-gemm": idle_after_gemm,
    }
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  median of {REPEATS} repeats, us")
    print(f"{'kernel':<28}" + "".join(f"{name:>17}" for name in variants))
    for label, call in cases.items():
        names = kernels_of(call)
        values = [timed(call, before, names) for before in variants.values()]
        print(f"{label:<28}" + "".join(f"{v:>17.3f}" for v in values))


if __name__ == "__main__":
    main()
