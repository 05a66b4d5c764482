"""Whether a kernel's time depends on where its small activation input lies in device memory.

The decode grouped GEMMs of MoE models replayed at 1.10-1.18x (down projection) and 0.87-0.90x
(gate/up) of their in-model durations on an H200, each row one call of the model, while the
replay's own repeats spread by under 2 %.  Here the same GEMMs (an OLMoE-like layer: 64 experts,
8 rows over 8 of them, ``torch._grouped_mm`` on transposed expert weights) and a dense decode
GEMM of the same size read their activation from 48 places of one 128 MB buffer (512-byte
aligned, scattered), each timed 10 times after an eviction of the cache by reads and a rewrite
of the activation; the per-place medians are measured twice, and against 12 fresh allocations
as a replay makes them.

Result on an H200 (torch 2.11, CUDA 13), main kernel in us: the grouped down GEMM 18.83-22.22 by
place (median 20.86, mean 20.83; the same places measured again: correlation 0.96), fresh
allocations 21.6-22.6; the grouped gate/up GEMM 30.54-37.41 by place (median 31.82, mean 32.40;
correlation 0.98), fresh allocations 30.8-32.1; the dense 8x4096 by 14336 GEMM 29.5-31.3 with no
relation to the place (correlation -0.01).  No alignment of the address explains it (means by
the address modulo 1 KiB to 2 MiB move by at most 1.7 us, without a pattern), so it follows the
physical placement.  The model's own calls: down 18.9-21.5 us (7 calls), gate/up 31.1-36.1 us.

Replaying every repeat at another place (8 copies of the cached inputs, side by side or 2 MiB
apart, each rewritten before its repeat) spread the replay's repeats (standard deviation 0.4 ->
1.4-1.8 us) but left the down GEMM's mean at 22.0 us and moved element-wise prefill rows of
16 MB (masked_fill, mul) from 1.02 to 1.25-1.27x; OLMoE's time within [0.9, 1.1] fell from
95.3 / 94.8 % (two profiles) to 92.1 / 90.4 %: not adopted (docs/input-values.md).

Prerequisites: a CUDA GPU with ``torch._grouped_mm`` (Hopper), torch 2.9 or later.

    python reproduce/wip/input_address_effect.py

Expected output: three lines per GEMM (the spread by place, the correlation of a second pass,
the fresh allocations).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch
from torch.profiler import ProfilerActivity, profile

DEVICE = "cuda"
EXPERTS, HIDDEN, INTERMEDIATE = 64, 2048, 1024
# cumulative row ends per expert of one decode call of the profiled model: 8 rows, 8 experts
ENDS = [1] * 6 + [2] * 3 + [3] * 2 + [4] * 21 + [5] * 4 + [6] * 8 + [7] * 4 + [8] * 16
PLACES = 48


def _timed(op: Callable[[torch.Tensor], object], inputs: Sequence[torch.Tensor], evict: torch.Tensor,
           iterations: int = 12) -> list[float]:
    """Per input, the median device time of the GEMM's main kernel over ``iterations`` - 2 calls."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iterations):
            for x in inputs:
                evict.amax()
                x.mul_(1)
                op(x)
        torch.cuda.synchronize()
    times = [e.device_time for e in prof.events()
             if e.device_type.name == "CUDA" and ("device_kernel" in e.name or "nvjet" in e.name)]
    return [statistics.median(times[i::len(inputs)][2:]) for i in range(len(inputs))]


def main() -> None:
    torch.manual_seed(0)
    evict = torch.empty(1 << 28, device=DEVICE, dtype=torch.int32)  # 1 GiB, read before every call
    offsets = torch.tensor(ENDS, dtype=torch.int32, device=DEVICE)
    down = torch.randn(EXPERTS, HIDDEN, INTERMEDIATE, device=DEVICE, dtype=torch.bfloat16).transpose(1, 2)
    gate_up = torch.randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN, device=DEVICE, dtype=torch.bfloat16).transpose(1, 2)
    dense = torch.randn(14336, 4096, device=DEVICE, dtype=torch.bfloat16)
    pool = torch.randn(64 << 20, device=DEVICE, dtype=torch.bfloat16)
    cases: dict[str, tuple[int, Callable[[torch.Tensor], object]]] = {
        "grouped down": (INTERMEDIATE, lambda x: torch._grouped_mm(x, down, offs=offsets)),
        "grouped gate/up": (HIDDEN, lambda x: torch._grouped_mm(x, gate_up, offs=offsets)),
        "dense 8x4096 by 14336": (4096, lambda x: x @ dense.t()),
    }
    for name, (width, op) in cases.items():
        size = 8 * width
        places = [i * 4099 * 256 % (pool.numel() - size) // 256 * 256 for i in range(PLACES)]
        inputs = [pool[p:p + size].view(8, width) for p in places]
        first, second = _timed(op, inputs, evict), _timed(op, inputs, evict)
        ranked = sorted(first)
        print(f"{name}: by place min {ranked[0]:.2f} median {statistics.median(first):.2f} "
              f"max {ranked[-1]:.2f} mean {statistics.mean(first):.2f} us")
        print(f"{name}: the same places again, correlation {statistics.correlation(first, second):.3f}")
        fresh = [_timed(op, [torch.randn(8, width, device=DEVICE, dtype=torch.bfloat16)], evict, 10)[0]
                 for _ in range(12)]
        print(f"{name}: 12 fresh allocations " + " ".join(f"{t:.1f}" for t in fresh))


if __name__ == "__main__":
    main()
