"""How much a short kernel's CUPTI duration depends on which input tensor it reads (CUDA).

The same bare loop (5 warm-up calls and 50 timed calls in one torch.profiler session, device
time summed per call, as ``compare_reference_cuda.py`` does) runs repeatedly on two tensors of
the same shape, dtype and value distribution: one drawn the way the reference script draws its
inputs, one drawn by the harness's ``random_tensor`` with its seeded generator.  Differences
between the two that repeat run after run are the floor under any harness-vs-reference
comparison of such a kernel: no timing method can remove them.

    python tests/perf/reference_input_sensitivity.py [--runs 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

WARMUP = 5
ITERS = 50


def session_durations_us(function: Callable[[], object], calls: int) -> list[float]:
    """Device durations of the kernels of ``calls`` calls in one profiler session, in launch order."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events.*", category=UserWarning)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                function()
            torch.cuda.synchronize()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.device_type() == DeviceType.CUDA),
        key=lambda e: e.correlation_id(),
    )
    return [e.duration_ns() / 1000.0 for e in events]


def device_us_per_call(function: Callable[[], object]) -> float:
    durations = session_durations_us(function, WARMUP + ITERS)
    per_call = len(durations) // (WARMUP + ITERS)
    return sum(durations[WARMUP * per_call :]) / ITERS


def reference_style(shape: tuple[int, ...], dtype: "torch.dtype") -> "torch.Tensor":
    import torch

    sign = torch.randint(0, 2, shape, device="cuda") * 2 - 1
    return ((torch.rand(shape, device="cuda") + 0.5) * sign).to(dtype)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()
    import torch

    from perf_plugin.replay.tensors import TensorSpec, random_tensor

    generator = torch.Generator(device="cuda")
    generator.manual_seed(0)
    cases = {
        "cast bf16->f32 [1,4096,1024]": ((1, 4096, 1024), "BF16", torch.bfloat16, lambda t: t.to(torch.float32)),
        "add f32+bf16 [4096,1024]": ((4096, 1024), "BF16", torch.bfloat16, None),
    }
    print(f"{'kernel':30}{'reference-drawn us':>20}{'harness-drawn us':>18}{'ratio':>8}")
    for name, (shape, spec_dtype, dtype, op) in cases.items():
        timings: dict[str, list[float]] = {}
        inputs = {
            "reference": reference_style(shape, dtype),
            "harness": random_tensor(TensorSpec(shape, spec_dtype, "ND"), "cuda", generator),
        }
        other = reference_style(shape, torch.float32) if op is None else None
        for label, tensor in inputs.items():
            call = (lambda t=tensor: op(t)) if op is not None else (lambda t=tensor: other.add(t))
            timings[label] = [device_us_per_call(call) for _ in range(args.runs)]
        reference, harness = (statistics.median(timings[key]) for key in ("reference", "harness"))
        print(f"{name:30}{reference:>20.2f}{harness:>18.2f}{harness / reference:>8.3f}   "
              f"runs: {', '.join(f'{v:.2f}' for v in timings['reference'])} | "
              f"{', '.join(f'{v:.2f}' for v in timings['harness'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
