"""How a kernel's time follows the bytes the device moved since its input was written.

The ``produced`` cache mode replays an input as cached or as read from memory by one threshold on
its reuse distance (``perf_plugin.replay.cold_inputs``: half the last-level cache when this was
measured; 0.8 of it since, from these figures and the twelve models' rows).  On an H200,
DeepSeek-V3's rows whose input lay beyond it replayed slower than in the model: the decode
residual ``add`` (second input 44 MB away) 1.17-1.24x, the prefill expert ``mul`` (31 MB)
1.15x, the sum over 6 experts' outputs (a 25 MB input 38 MB away) 1.31x, the prefill rotary
``mul`` (its table 86 MB away) 1.13x.

Here each kernel's input is written, then ``D`` bytes of other traffic move through the device,
then the kernel's other inputs are rewritten and the kernel runs; the median device time over
repeats, per kind of traffic:

* ``read``: a reduction over a buffer of ``D`` bytes (clean lines, as a model's weight reads);
* ``gemv``: decode GEMVs over distinct 4 MB weights, ``D`` bytes of them (a decode layer);
* ``write``: a fill of ``D`` bytes (dirty lines, as activations).

``cold``: the input left evicted (what the replay does past the threshold).

Result on an H200 (60 MB of L2; torch 2.11, CUDA 13), us, the same for the three kinds of
traffic within the noise: inputs of a few KB (the decode ``add``, a 1 KB ``cast``, a 64 KB rotary
table) stay cached up to 32-40 MB (0.86, 2.30, 2.88) and are read from memory from 48 MB (1.04-1.15,
3.28-3.41, 3.04-3.20; cold 1.01, 3.26, 3.18); a 12 MB tensor read in half is cached to 8 MB (8.6)
and from memory from 24 MB (9.6-9.9, cold 9.7); a 25 MB float32 tensor summed over its middle
dimension takes 8.3 at 0 MB, 9.5-9.8 at 8 MB, 12.4 at 24 MB, 12.8-13.4 from 32 MB, and 10.9 when
never written since the eviction.  A replay that writes such inputs at their recorded distance,
each followed by that much traffic, was built and measured against four models' profiles
(docs/coverage.md): it did not bring those rows closer, and is not adopted.

Prerequisites: an NVIDIA GPU and torch with CUDA.  ``python reproduce/wip/reuse_distance_effect.py``

Expected output: per kernel, its time with the input cold, then a row of times by distance per
kind of traffic.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

DEVICE = "cuda"
MB = 1 << 20
DISTANCES_MB = (0, 8, 16, 24, 32, 40, 48, 64, 96)
ITERATIONS = 14
Case = tuple[Callable[[], object], torch.Tensor, list[torch.Tensor]]


def cases(d: str) -> dict[str, Case]:
    """name -> (the kernel, the input placed at a distance, the inputs written last)."""
    bf16 = torch.bfloat16
    x, y = torch.randn(1, 1, 2048, device=d, dtype=bf16), torch.randn(1, 1, 2048, device=d, dtype=bf16)
    up = torch.randn(3072, 1024, device=d, dtype=bf16)
    gate_up = torch.randn(3072, 2048, device=d, dtype=bf16)
    experts = torch.randn(512, 6, 2048, device=d)
    compressed = torch.randn(1, 1, 512, device=d, dtype=bf16)
    heads = torch.randn(1, 16, 512, 32, device=d, dtype=bf16)
    table = torch.randn(1, 1, 512, 64, device=d, dtype=bf16)
    return {
        "decode add [1,1,2048]": (lambda: x + y, y, [x]),
        "prefill mul [3072,1024] by a strided half": (lambda: up * gate_up[:, :1024], gate_up, [up]),
        "sum [512,6,2048] fp32 over dim 1": (lambda: experts.sum(1), experts, []),
        "cast [1,1,512] bf16 to fp32": (lambda: compressed.float(), compressed, []),
        "rotary mul [1,16,512,32] by half a table": (lambda: heads * table[..., :32], table, [heads]),
    }


def traffic(d: str) -> dict[str, Callable[[int], None]]:
    scratch = torch.ones(128 * MB // 4, device=d)
    weights = [torch.randn(1024, 2048, device=d, dtype=torch.bfloat16) for _ in range(32)]  # 4 MB each
    token = torch.randn(1, 2048, device=d, dtype=torch.bfloat16)

    def read(n: int) -> None:
        if n:
            scratch[: n // 4].amax()

    def gemv(n: int) -> None:
        for w in weights[: n // (4 * MB)]:
            torch.nn.functional.linear(token, w)

    def write(n: int) -> None:
        if n:
            scratch[: n // 4].fill_(1.0)

    return {"read": read, "gemv": gemv, "write": write}


def timed(case: Case, place: Callable[[], None] | None, evict: torch.Tensor, marker: torch.Tensor) -> float:
    """Median device time of the case's kernel: the kernel before each marker (a sine)."""
    kernel, distant, written_last = case
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(ITERATIONS):
            marker.sin()
            evict.amax()
            if place is not None:
                distant.mul_(1)
                place()
            for tensor in written_last:
                tensor.mul_(1)
            kernel()
        marker.sin()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    ends = [i for i, e in enumerate(kernels) if "sin_kernel" in e.name]
    times = [kernels[i - 1].device_time for i in ends[1:]]
    return statistics.median(times[2:])


def main() -> None:
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), "L2", torch.cuda.get_device_properties(0).L2_cache_size // MB, "MB")
    evict = torch.empty(256 * MB // 4, device=DEVICE, dtype=torch.int32)
    marker = torch.ones(4096, device=DEVICE)
    streams = traffic(DEVICE)
    header = "".join(f"{d:>7}" for d in DISTANCES_MB)
    for name, case in cases(DEVICE).items():
        print(f"\n{name}: cold {timed(case, None, evict, marker):.2f} us; by distance (MB):")
        print(f"{'':>8}{header}")
        for kind, stream in streams.items():
            row = [timed(case, lambda n=d * MB: stream(n), evict, marker) for d in DISTANCES_MB]
            print(f"{kind:>8}" + "".join(f"{t:7.2f}" for t in row))


if __name__ == "__main__":
    main()
