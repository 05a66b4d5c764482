"""Whether a weight-streaming decode kernel's duration depends on where its operands lie in device
memory, or on what the device did just before it.

Two fresh models replayed their largest decode kernels off their in-model durations in every
cache mode (H200, ``benchmarks/model_coverage.py --models hf:granitemoe,hf:ernie4_5_moe``):
GraniteMoE's gate/up grouped GEMM (2 rows over 8 experts of 4096 x 22016) and ERNIE-4.5's
vocabulary GEMV (1 x 2560 by 103424).  Here both kernels are timed alone at those shapes, from
the profiler's kernel durations (as the harness and the in-model trace time them; CUDA events
around a call also count the launch and the device's wake-up, which the kernel does not see):

* on copies of one operand, the values equal, each copy a new allocation: the weight for both
  kernels, and the 16 KB activation for the grouped GEMM;
* on the first copy, after several kinds of preceding work: none (back to back), the host's wait,
  1 ms of idle device, a 200 us device-side spin, a read of twice the last-level cache (clean
  lines), a write of it (dirty lines).

Prerequisites: a CUDA GPU with ``torch._grouped_mm`` (Hopper), torch with ``torch.cuda._sleep``.

    python reproduce/wip/placement_effect.py

Expected output: per kernel, the median of 20 calls on each copy of each operand, then the same
on the first copy after each kind of preceding work.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

DEVICE = "cuda"
COPIES = 6
CALLS = 20
CYCLES_PER_US = 1980  # the H200's SM clock in MHz: torch.cuda._sleep counts clock cycles


def device_kernels(run: Callable[[], object]) -> list[tuple[str, float]]:
    """(name, us) of every kernel ``run`` launches, in order, from the profiler."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    events = [e for e in prof.profiler.kineto_results.events() if e.device_type() == torch.autograd.DeviceType.CUDA]
    return [(e.name(), e.duration_ns() / 1000) for e in sorted(events, key=lambda e: e.start_ns())]


def kernel_us(call: Callable[[], object], before: Callable[[], object] | None) -> float:
    """Median device time of ``CALLS`` calls of ``call`` (its own kernels only, ``before``'s left out)."""
    for _ in range(3):
        call()
    own = {name for name, _ in device_kernels(call)}
    per_call = len(device_kernels(call))

    def calls() -> None:
        for _ in range(CALLS):
            if before is not None:
                before()
            call()

    timed = [us for name, us in device_kernels(calls) if name in own]
    totals = [sum(timed[i * per_call:(i + 1) * per_call]) for i in range(CALLS)]
    return round(statistics.median(totals), 1)


def main() -> None:
    torch.manual_seed(0)
    experts = torch.empty(8, 22016, 4096, device=DEVICE, dtype=torch.bfloat16).normal_(0, 0.02)
    tokens = torch.randn(2, 4096, device=DEVICE, dtype=torch.bfloat16)
    offsets = torch.tensor([0, 1, 2, 2, 2, 2, 2, 2], device=DEVICE, dtype=torch.int32)  # one row to each of two experts
    vocabulary = torch.empty(103424, 2560, device=DEVICE, dtype=torch.bfloat16).normal_(0, 0.02)
    hidden = torch.randn(1, 2560, device=DEVICE, dtype=torch.bfloat16)
    buffer = torch.zeros(2 * 60 * 2**20, dtype=torch.uint8, device=DEVICE)  # twice the H200's last-level cache

    def grouped(x: torch.Tensor, w: torch.Tensor) -> Callable[[], object]:
        return lambda: torch._grouped_mm(x, w.transpose(1, 2), offs=offsets)

    def gemv(x: torch.Tensor, w: torch.Tensor) -> Callable[[], object]:
        return lambda: torch.nn.functional.linear(x, w)

    kernels = {"grouped GEMM": (grouped, tokens, experts), "vocabulary GEMV": (gemv, hidden, vocabulary)}
    for name, (make, x, w) in kernels.items():
        weights = [w] + [w.clone() for _ in range(2 if name == "grouped GEMM" else COPIES - 1)]
        print(f"{name}, weight copies: {[kernel_us(make(x, copy), None) for copy in weights]} us")
        if name == "grouped GEMM":
            activations = [x] + [x.clone() for _ in range(COPIES - 1)]
            print(f"{name}, activation copies: {[kernel_us(make(copy, w), None) for copy in activations]} us")
        del weights
    preceding: dict[str, Callable[[], object] | None] = {
        "nothing": None,
        "the host's wait": torch.cuda.synchronize,
        "1 ms idle": lambda: (torch.cuda.synchronize(), time.sleep(0.001)),
        "200 us spin": lambda: torch.cuda._sleep(200 * CYCLES_PER_US),
        "a read of twice the cache": lambda: buffer.sum(dtype=torch.int32),
        "a write of twice the cache": lambda: buffer.fill_(1),
    }
    for name, (make, x, w) in kernels.items():
        figures = {label: kernel_us(make(x, w), before) for label, before in preceding.items()}
        print(f"{name}, after: {figures}")


if __name__ == "__main__":
    main()
