"""Whether a memory-bound kernel's time depends on where its large weight was allocated.

Mixtral's decode down projections (a grouped GEMM of 2 rows over 8 experts of 14336 x 4096
bf16, two experts routed) fell into two populations inside a two-layer model on an H200, 90.7
and 102.7-104.4 us per call, whatever the routing, and replayed at 99.7-100.2 us.  Here the
project's own ``GroupedMatmul`` replay builds that row's inputs eight times (eight allocations of
the 940 MB weight) and times each; then DeepSeek-V3-sized vocabulary GEMVs (1 x 7168 by 129280,
1.85 GB) on six allocations and on six slices of one allocation.

Result on an H200 (torch 2.11, CUDA 13), median us of 40 calls: the grouped GEMM 89.0, 93.2, 94.0,
95.1, 96.0, 104.3, 107.1 and 109.0 over the eight allocations for one routing (87.1-111.0 for
another), each within 0.4 % when timed again: the place, not noise, sets the time.  The
vocabulary GEMV 420.1-422.2 over six allocations; of six slices of one allocation, the first
480.0, the others 420.3-421.3.

Replaying every repeat on another copy of the weight (eight fresh allocations, the rows' mean
over them) was built and replayed against the same profiles as the code without it: the down
projection replayed at 88 us for every row, below both in-model populations (0.97 of the fast
calls, 0.84-0.86 of the slow ones, against 1.12 and 0.97 before), Mixtral 93.8 against 94.4 % of
the time within [0.9, 1.1], DeepSeek-V3 83.4 against 85.1 % (its vocabulary GEMV at 1.11 either
way): not adopted (docs/coverage.md).  The copies are faster than the allocations a replay's
inputs get, as the model's fast layer is: which allocations are fast is not found.

Prerequisites: a CUDA GPU with ``torch._grouped_mm`` (Hopper), this project installed.

    python reproduce/wip/weight_placement_effect.py

Expected output: two lines for the grouped GEMM (per allocation, then again), two for the GEMV.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from perf_plugin.replay.registry import get_replay
from perf_plugin.replay.tensors import kernel_row_from_cells


def median_us(function: Callable[[], object], repeats: int = 40) -> float:
    for _ in range(5):
        function()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for start, end in events:
        start.record()
        function()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) * 1000 for start, end in events)


def grouped_down_projection(values: str) -> None:
    device, replay = torch.device("cuda"), get_replay("GroupedMatmul")
    assert replay is not None
    cells = {"Input Shapes": '"2,14336;8,14336,4096;;;;;;8"', "Input Data Types": "DT_BF16;DT_BF16;;;;;;INT64",
             "Output Shapes": '"2,4096"', "Output Data Types": "DT_BF16", "Input Values": f'";;;;;;;{values}"'}
    row = kernel_row_from_cells("GroupedMatmul", cells)
    allocations = [replay.make_inputs(row, device, torch.Generator("cuda").manual_seed(i)) for i in range(8)]
    first = [median_us(lambda a=a: replay.run(*a)) for a in allocations]
    again = [median_us(lambda a=a: replay.run(*a)) for a in reversed(allocations)][::-1]
    print(f"grouped down {values}: per allocation {' '.join(f'{t:.1f}' for t in first)}")
    print(f"grouped down {values}: again          {' '.join(f'{t:.1f}' for t in again)}")


def vocabulary_gemv() -> None:
    device = torch.device("cuda")
    x = torch.randn(1, 7168, device=device, dtype=torch.bfloat16)
    weights = [torch.randn(129280, 7168, device=device, dtype=torch.bfloat16) for _ in range(6)]
    times = [median_us(lambda w=w: torch.nn.functional.linear(x, w)) for w in weights]
    print(f"vocabulary GEMV per allocation: {' '.join(f'{t:.1f}' for t in times)}")
    del weights
    torch.cuda.empty_cache()
    size = 129280 * 7168
    whole = torch.empty(6 * size + 6 * 512, device=device, dtype=torch.bfloat16)
    slices = [whole[i * (size + 512):i * (size + 512) + size].view(129280, 7168) for i in range(6)]
    times = [median_us(lambda w=w: torch.nn.functional.linear(x, w)) for w in slices]
    print(f"vocabulary GEMV per slice of one allocation: {' '.join(f'{t:.1f}' for t in times)}")


def main() -> None:
    for values in ("0,1,1,1,2,2,2,2", "0,0,0,0,0,1,2,2"):
        grouped_down_projection(values)
    vocabulary_gemv()


if __name__ == "__main__":
    main()
