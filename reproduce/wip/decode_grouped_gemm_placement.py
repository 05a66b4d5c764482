"""Whether a decode grouped GEMM's time follows its weights' values, its launch, or their placement.

Jamba's decode ``[2,4096] x [16,4096,28672]`` grouped GEMM (two routed rows, experts 2 and 3) took
183 us inside the model in ``benchmarks/model_coverage.py``'s process, and 226 replayed (H100);
Nemotron-H's and Granite-4.0-H's decode grouped GEMMs likewise.  Here a process first allocates
and frees 0.6 GB of other tensors, then builds the same two-layer Jamba model, profiles its
512-token prefill and four decode steps, and times the call alone (a read of twice the last-level
cache before each): on the model's own weights, on a clone of them, and on fresh weights drawn
uniform in +-[0.5, 1.5] (the replay's draw), normal(0, 0.02) (the model's initialisation) or zero;
launched back to back, or onto an idle device (2 ms host gap).

Result on an H100 80GB HBM3 (torch 2.11, CUDA 13, transformers 5.17; measured with the tensors of
``scan_slice_reads.py`` allocated and freed before the model, 0.6 GB), us: in the model's decode
steps 224.0-227.1; alone, every variant 229.3-229.5 (spread 227.7-231.6).  Neither the values nor
the launch moves the call; the model itself ran it 40 us slower than in the benchmark's process,
where its weights had been allocated first.  ``weight_placement_effect.py`` measures the same on
an H200 over eight allocations of one weight (89-109 us).

Prerequisites: a CUDA GPU with ``torch._grouped_mm`` (Hopper), ``transformers``, this project installed.

    python reproduce/wip/decode_grouped_gemm_placement.py

Expected output: the in-model calls per shape, then one line per variant, ``variant  MEDIAN_US``.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import model_coverage  # noqa: E402

REPEATS = 30


def grouped_us(prof: profile) -> list[float]:
    return [sum(k.duration for k in e.kernels) for e in prof.events() if e.name == "aten::_grouped_mm" and e.kernels]


def main() -> None:
    device = "cuda"
    other = [torch.empty(2**27, device=device) for _ in range(5)]  # 0.6 GB allocated and freed first
    del other
    torch.cuda.empty_cache()
    cache = torch.cuda.get_device_properties(0).L2_cache_size
    evict_words = torch.empty(2 * cache // 4, dtype=torch.int32, device=device)

    model = model_coverage.build_model("hf:jamba", 2, device, False, 512)
    model_coverage.run_steps(model, device, 512, 4)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        model_coverage.run_steps(model, device, 512, 4)
        torch.cuda.synchronize()
    calls: dict[str, list[float]] = {}
    for event in prof.events():
        if event.name == "aten::_grouped_mm" and event.kernels:
            calls.setdefault(str(event.input_shapes[:2]), []).append(sum(k.duration for k in event.kernels))
    for shapes, times in calls.items():
        print(f"in the model {shapes}: " + ", ".join(f"{t:.1f}" for t in times))

    experts = next(m for m in model.modules() if hasattr(m, "gate_up_proj"))
    weight = experts.gate_up_proj  # [E, N, K], multiplied transposed
    count, n, k = weight.shape
    x = torch.randn(2, k, device=device, dtype=torch.bfloat16)
    offsets = torch.tensor([0, 0, 1] + [2] * (count - 3), device=device, dtype=torch.int32)

    def timed(w: torch.Tensor, idle: bool) -> float:
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(REPEATS):
                evict_words.amax()
                x.mul_(1)
                if idle:
                    torch.cuda.synchronize()
                    time.sleep(0.002)
                torch._grouped_mm(x, w, offs=offsets)
            torch.cuda.synchronize()
        return statistics.median(grouped_us(prof)[3:])

    uniform = torch.empty(count, n, k, device=device, dtype=torch.bfloat16).uniform_(0.5, 1.5)
    uniform.copysign_(torch.randint(-1, 1, uniform.shape, device=device, dtype=torch.int8))
    variants = {"model weights": weight.data, "clone of the model weights": weight.data.clone(),
                "uniform +-[0.5, 1.5]": uniform}
    for name, w in list(variants.items()):
        for idle in (False, True):
            print(f"{name + (', idle launch' if idle else ''):<40} {timed(w.transpose(-2, -1), idle):.1f}")
    del variants, uniform
    for name, fill in (("normal(0, 0.02)", lambda t: t.normal_(0, 0.02)), ("zeros", lambda t: t.zero_())):
        w = fill(torch.empty(count, n, k, device=device, dtype=torch.bfloat16))
        print(f"{name:<40} {timed(w.transpose(-2, -1), False):.1f}")
        del w


if __name__ == "__main__":
    main()
