"""Why JetMoE's attention experts' GEMMs replay at 0.79-0.89 of their in-model time (H100).

JetMoE's mixture of attention heads projects each expert's routed rows with ``F.linear(x_i,
W[i])`` (``JetMoeParallelExperts``: a loop over the experts, ``W`` one ``[E,2048,2048]``
parameter, ``x_i`` the expert's slice of one gathered tensor).  The replayed rows
(``[96-151,2048] x [2048,2048]``) ran faster than the model ran them.

Here the model (``benchmarks/model_coverage.py``'s ``hf:jetmoe``, two layers, a 512-token
prefill) runs under ``torch.profiler``; each ``ParallelExperts`` call's inputs are kept, and its
expert GEMMs timed again, kernel time from the profiler, median over 20 repeats:

* ``model``: the GEMM in the model's forward;
* ``module loop``: the module's own loop over its experts, called again and again on its inputs;
* ``alone, warm``: one expert's GEMM back to back (its 8 MB weight stays in the L2);
* ``alone, cold``: the same after a read of twice the L2 (what ``cold`` does);
* ``alone, cold + idle``: and the device left idle for 1 ms before each launch;
* ``alone, fresh operands``: a copy of the weight and input in new allocations, cold.

Result on an H100 80GB HBM3 (torch 2.11, CUDA 13, transformers 5.17), us, for the calls of 95
to 167 rows: in the model 6.7-9.1, the same call alike in two forward passes (136 rows: 8.96,
9.09); the module loop's longest GEMM 7.54; alone, warm 5.6-6.7, cold 6.6-6.9, cold + idle
6.5-6.9, fresh operands 6.6-6.9 (136 rows: 6.40, 6.86, 6.82, 6.88).  Placement, cache state and
an idle device leave a GEMM alone 1-2 us short of its time inside the loop over the experts.

Prerequisites: a CUDA GPU, transformers, this project installed.

    python reproduce/wip/jetmoe_expert_gemm.py

Expected output: one line per scenario and expert call, ``scenario  M  MEDIAN_US``.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from model_coverage import build_model  # noqa: E402  (the benchmark's own model builder)

REPEATS = 20


def kernel_us(fn: Callable[[], Any], before: Callable[[], Any] | None = None) -> float:
    """The median kernel time of ``fn``'s GEMM (the longest kernel of each call)."""
    times = []
    for _ in range(REPEATS):
        if before is not None:
            before()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        kernels = [e.time_range.elapsed_us() for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        times.append(max(kernels))
    return statistics.median(times)


def main() -> None:
    model = build_model("hf:jetmoe", 2, "cuda", False, 512)
    calls: list[tuple[torch.nn.Module, torch.Tensor, list[int]]] = []

    def keep(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        inputs, sizes = args[0], args[1]
        if inputs.shape[-1] == 2048 and module.weight.shape[-2:] == (2048, 2048):
            calls.append((module, inputs.detach().clone(), [int(s) for s in sizes]))

    hooks = [m.register_forward_pre_hook(keep) for m in model.modules() if type(m).__name__.endswith("ParallelExperts")]
    ids = torch.randint(0, model.config.vocab_size, (1, 512), device="cuda")
    with torch.no_grad():
        model(ids)
        torch.cuda.synchronize()
        calls.clear()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            model(ids)
            torch.cuda.synchronize()
    for hook in hooks:
        hook.remove()
    in_model = [(e.input_shapes[0][0], e.device_time_total) for e in prof.events()
                if e.name == "aten::mm" and e.input_shapes and e.input_shapes[0][1:] == [2048]
                and e.input_shapes[1] == [2048, 2048]]
    print(f"{len(calls)} expert calls kept, {len(in_model)} in-model GEMMs of [M,2048] x [2048,2048]")
    flush = torch.empty(2 * 50 * 2**20 // 4, device="cuda")

    def cold() -> None:
        flush.add_(1)

    def cold_idle() -> None:
        flush.add_(1)
        torch.cuda.synchronize()
        time.sleep(0.001)

    with torch.no_grad():
        for module, inputs, sizes in calls[:2]:
            weight = module.weight
            loop = kernel_us(lambda: module(inputs, sizes))  # noqa: B023
            print(f"module loop (longest kernel)  {inputs.shape[0]}  {loop:.2f}")
            for expert, x in enumerate(inputs.split(sizes)):
                if x.shape[0] == 0:
                    continue
                w = weight[expert]
                fresh_w, fresh_x = w.clone(), x.clone()
                rows = x.shape[0]
                for label, fn, before in (
                    ("alone, warm", lambda: F.linear(x, w), None),  # noqa: B023
                    ("alone, cold", lambda: F.linear(x, w), cold),  # noqa: B023
                    ("alone, cold + idle", lambda: F.linear(x, w), cold_idle),  # noqa: B023
                    ("alone, fresh operands", lambda: F.linear(fresh_x, fresh_w), cold),  # noqa: B023
                ):
                    print(f"{label:30s}{rows:5d}  {kernel_us(fn, before):.2f}")
    for rows, us in in_model:
        print(f"{'model':30s}{rows:5d}  {us:.2f}")


if __name__ == "__main__":
    main()
