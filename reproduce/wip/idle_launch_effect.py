"""Whether a prefill GEMM runs slower when launched onto an idle device.

In the H100 profiles of ``benchmarks/model_coverage.py`` the Llama prefill GEMM of 512x4096x4096
(bf16) takes 26.1-27.4 us in the model and 23.6-24.3 us replayed, in every context the harness
and ``gemm_context_effect.py`` tried; the FP8 prefill GEMMs are 13 % faster replayed too.  In the
model's trace every one of those calls starts 12-124 us after the device finished the kernel
before it (the host, slowed by the profiler, falls behind), while the replay queues the GEMM
behind the step before the repeat; and the gate GEMM took 94.4 us after a 52 us idle gap and
90.1 us after a 1.4 us one.

Per GEMM, the median device duration over 30 repeats, each after the harness's ``produced``
step (the data eviction and the activation rewritten), then launched:

* ``queued``: at once, behind the step (what the harness times now);
* ``idle-N``: after the device finished the step and the host waited N us more.

and, for the bf16 and FP8 q GEMMs, over a longer stretch (``sustained``): 300-600 launches, each
after the host waited for the device and then 0.2-20 ms more, so that the device is busy a few
percent of the time, as in the profiled model; the median of the last quarter (a clock that
fell with the load would show there).

Result, two runs on an H100 (in-model / queued / idle 0-1000 us): the q GEMM 26.75 / 23.43-23.55 /
23.50-23.73 us, the FP8 q GEMM 16.80 / 14.37-14.43 / 14.40-14.53, the FP8 down GEMM 46.22 /
41.25-41.36 / 40.96-41.17.  An idle device does not explain the gap: only the long bf16 GEMMs
move, by 2-5 % (gate 87.3-88.1 -> 89.2-90.6 us, down 76.6 -> 78.1-80.5).  Nor does a device
busy a few percent of the time: sustained, the q GEMM took 23.59-23.78 us at every gap and the
FP8 one 13.76-13.79, and the SM clock read 1980 MHz (its maximum) after the run.

Prerequisites: an NVIDIA GPU and torch with CUDA.  ``python reproduce/wip/idle_launch_effect.py``
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

REPEATS = 30
IDLE_US = (0, 20, 100, 1000)
FP8 = torch.float8_e4m3fn


def bf16_gemm(m: int, n: int, k: int, d: torch.device) -> tuple[Callable[[], Any], torch.Tensor]:
    x = torch.randn(m, k, device=d, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=d, dtype=torch.bfloat16) * 0.02
    return lambda: torch.nn.functional.linear(x, w), x


def fp8_gemm(m: int, n: int, k: int, d: torch.device) -> tuple[Callable[[], Any], torch.Tensor]:
    x = torch.randn(m, k, device=d).to(FP8)
    w = (torch.randn(n, k, device=d) * 0.02).to(FP8)
    one = torch.ones((), device=d)
    return lambda: torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), x


# name, in-model us (profile F), build
CASES: list[tuple[str, float, Callable[[torch.device], tuple[Callable[[], Any], torch.Tensor]]]] = [
    ("bf16 512x4096x4096 (q, o)", 26.75, lambda d: bf16_gemm(512, 4096, 4096, d)),
    ("bf16 512x1024x4096 (k, v)", 10.52, lambda d: bf16_gemm(512, 1024, 4096, d)),
    ("bf16 512x14336x4096 (gate, up)", 92.84, lambda d: bf16_gemm(512, 14336, 4096, d)),
    ("bf16 512x4096x14336 (down)", 77.75, lambda d: bf16_gemm(512, 4096, 14336, d)),
    ("fp8 512x4096x4096 (q, o)", 16.80, lambda d: fp8_gemm(512, 4096, 4096, d)),
    ("fp8 512x4096x14336 (down)", 46.22, lambda d: fp8_gemm(512, 4096, 14336, d)),
]


def kernel_durations(run: Callable[[], None]) -> list[float]:
    """Device durations (us) of the GEMM kernels ``run`` launches (under ``aten::mm`` and
    ``aten::_scaled_mm``)."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                            torch.profiler.ProfilerActivity.CPU]) as prof:
        run()
        torch.cuda.synchronize()
    return [k.duration for e in prof.events() if e.name in ("aten::mm", "aten::_scaled_mm") for k in e.kernels]


def main() -> None:
    d = torch.device("cuda")
    buffer = torch.empty(2 * torch.cuda.get_device_properties(d).L2_cache_size, dtype=torch.uint8, device=d)
    words = buffer.view(torch.int32)
    print(torch.cuda.get_device_name(d))
    print(f"{'GEMM':<34}{'model':>8}{'queued':>10}" + "".join(f"{'idle-' + str(u):>11}" for u in IDLE_US))
    for name, in_model, build in CASES:
        gemm, activation = build(d)
        raw = activation.view(torch.uint8)  # rewritten in place, whatever its dtype
        for _ in range(5):
            gemm()

        def repeats(idle_us: int | None) -> None:
            for _ in range(REPEATS):
                words.amax()
                raw.add_(0)
                if idle_us is not None:
                    torch.cuda.synchronize()
                    deadline = time.perf_counter() + idle_us / 1e6
                    while time.perf_counter() < deadline:
                        pass
                gemm()

        cells = [statistics.median(kernel_durations(lambda: repeats(None)))]
        cells += [statistics.median(kernel_durations(lambda u=u: repeats(u))) for u in IDLE_US]
        print(f"{name:<34}{in_model:8.2f}" + "".join(f"{c:10.2f} " for c in cells))


def sustained(gemm: Callable[[], Any], gap_us: int, launches: int) -> float:
    """The median of the last quarter of ``launches`` launches, each ``gap_us`` after the device went idle."""

    def run() -> None:
        for _ in range(launches):
            if gap_us:
                torch.cuda.synchronize()
                deadline = time.perf_counter() + gap_us / 1e6
                while time.perf_counter() < deadline:
                    pass
            gemm()

    durations = kernel_durations(run)
    return statistics.median(durations[-len(durations) // 4:])


def main_sustained() -> None:
    d = torch.device("cuda")
    plan = ((0, 300), (200, 600), (2000, 300), (20000, 40))
    print(f"{'sustained':<34}" + "".join(f"{'gap-' + str(gap):>11}" for gap, _ in plan))
    for name, build in (("bf16 512x4096x4096 (q, o)", CASES[0][2]), ("fp8 512x4096x4096 (q, o)", CASES[4][2])):
        gemm, _ = build(d)
        print(f"{name:<34}" + "".join(f"{sustained(gemm, gap, n):10.2f} " for gap, n in plan))


if __name__ == "__main__":
    main_sustained()
    main()
