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
* ``alone, fresh operands``: a copy of the weight and input in new allocations, cold;
* ``after the expert before``: right after the previous expert's GEMM, cold before the pair;
* ``after an 8 MB copy``: right after a copy of 8 MB of other memory, cold before the pair.

Result on an H100 80GB HBM3 (torch 2.11, CUDA 13, transformers 5.17), us, for the calls of 103
to 144 rows: in the model 6.7-9.3, the same call alike in every forward pass (136 rows: 8.96,
9.09, 9.25); through the module's loop, cold before it, 6.5-9.2 per GEMM (6.91 7.65 9.20 8.61
7.15 7.09 6.51 6.56, as the model's); alone, warm 5.6-6.6, cold 6.5-6.9, cold + idle 6.6-6.9,
fresh operands 6.6-6.9; after the expert before 7.5-8.5; after an 8 MB copy 8.1-8.9.  A GEMM
launched right behind a kernel that streamed megabytes runs 15-30 % longer than after a gap,
whatever memory that kernel touched; placement, cache state and an idle device do not move it.

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


def kernel_times(fn: Callable[[], Any], before: Callable[[], Any] | None = None) -> list[float]:
    """The median time of each kernel ``fn`` launches, in launch order, over the repeats."""
    runs = []
    for _ in range(REPEATS):
        if before is not None:
            before()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        kernels = sorted((e.time_range.start, e.time_range.elapsed_us()) for e in prof.events()
                         if e.device_type == torch.autograd.DeviceType.CUDA)
        runs.append([us for _, us in kernels])
    return [statistics.median(run[i] for run in runs) for i in range(min(map(len, runs)))]


def kernel_us(fn: Callable[[], Any], before: Callable[[], Any] | None = None) -> float:
    """The median time of ``fn``'s last kernel (its GEMM)."""
    return kernel_times(fn, before)[-1]


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
            loop = kernel_times(lambda: module(inputs, sizes), cold)  # noqa: B023
            print(f"module loop, cold, each GEMM   {inputs.shape[0]}  " + " ".join(f"{us:.2f}" for us in loop))
            split = inputs.split(sizes)
            other = torch.empty(8 * 2**20 // 2, device="cuda", dtype=inputs.dtype)
            copied = torch.empty_like(other)
            for expert, x in enumerate(split):
                if x.shape[0] == 0 or expert == 0:
                    continue
                w, x_prev, w_prev = weight[expert], split[expert - 1], weight[expert - 1]
                fresh_w, fresh_x = w.clone(), x.clone()
                rows = x.shape[0]
                for label, fn, before in (
                    ("alone, warm", lambda: F.linear(x, w), None),  # noqa: B023
                    ("alone, cold", lambda: F.linear(x, w), cold),  # noqa: B023
                    ("alone, cold + idle", lambda: F.linear(x, w), cold_idle),  # noqa: B023
                    ("alone, fresh operands", lambda: F.linear(fresh_x, fresh_w), cold),  # noqa: B023
                    ("after the expert before", lambda: (F.linear(x_prev, w_prev), F.linear(x, w)), cold),  # noqa: B023
                    ("after an 8 MB copy", lambda: (copied.copy_(other), F.linear(x, w)), cold),  # noqa: B023
                ):
                    print(f"{label:30s}{rows:5d}  {kernel_us(fn, before):.2f}")
    for rows, us in in_model:
        print(f"{'model':30s}{rows:5d}  {us:.2f}")


if __name__ == "__main__":
    main()
