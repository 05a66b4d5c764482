"""How much a short kernel's CUPTI duration depends on which input tensor it reads (CUDA).

Reproduces docs/measured.md, "Measured" (H100), the reference comparison's third note: "Which tensor a
short kernel reads moves its duration by about 2 % either way (``reference_input_sensitivity.py``:
one bare loop, two inputs of the same shape and value distribution; 4 runs each, run-to-run
spread 0.3 %): the cast 10.24 vs 10.06 us (0.982), the mixed add 17.99 vs 18.34 us (1.019)".

The same bare loop (5 warm-up calls and 50 timed calls in one torch.profiler session, device
time summed per call, as ``compare_reference_cuda.py`` does) runs repeatedly on two tensors of
the same shape, dtype and value distribution: one drawn the way the reference script draws its
inputs, one drawn by the harness's ``random_tensor`` with its seeded generator.  Differences
between the two that repeat run after run are the floor under any harness-vs-reference
comparison of such a kernel: no timing method can remove them.

Verification missing: it needs an NVIDIA GPU, so it was not run on the CPU machine the scripts
in ``reproduce/`` were verified on.  One run of this version on an H100 80GB HBM3 (torch 2.11,
CUDA 13, ``--runs 4``) gave the cast 10.28 vs 10.09 us (0.981) and the mixed add 17.91 vs 18.18
us (1.015), as README says.

Prerequisites: an NVIDIA GPU, torch built for CUDA, this project installed (``pip install -e .``).

    python reproduce/wip/reference_input_sensitivity.py [--runs 4] [--out DIR]

Expected output: one line per kernel (the cast bf16->f32 and the mixed add): the median over
runs of the reference-drawn and the harness-drawn input's duration, their ratio (README: 0.982
and 1.011-1.019) and every run's figures; then ``DIR/reference_input_sensitivity.json`` (by
default in a new temporary directory) with the same under ``stats``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perf_plugin.report.environment import collect_env_spec
from perf_plugin.report.run_json import LLM_CONCURRENCY, finite_values, report_json

if TYPE_CHECKING:
    import torch

NAME = "reference_input_sensitivity"
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--out", type=Path, help=f"directory of {NAME}.json (default: a new temporary directory)")
    args = parser.parse_args(argv)
    import torch

    from perf_plugin.replay.tensors import TensorSpec, random_tensor

    started = time.perf_counter()
    generator = torch.Generator(device="cuda")
    generator.manual_seed(0)
    cases = {
        "cast bf16->f32 [1,4096,1024]": ((1, 4096, 1024), "BF16", torch.bfloat16, lambda t: t.to(torch.float32)),
        "add f32+bf16 [4096,1024]": ((4096, 1024), "BF16", torch.bfloat16, None),
    }
    figures: dict[str, dict[str, Any]] = {}
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
        figures[name] = {"reference_drawn_us": reference, "harness_drawn_us": harness, "ratio": harness / reference,
                         "runs_us": timings}

    out = args.out or Path(tempfile.mkdtemp(prefix=f"{NAME}_"))
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": f"perf_plugin.reproduce:{NAME}",
        "script": f"reproduce/wip/{NAME}.py",
        "workflow": "bare torch.profiler loop",
        "pass_n": args.runs,
        "ops_count": len(cases),
        "elapsed_s": time.perf_counter() - started,
        "device_ids": [torch.cuda.current_device()],
        "max_concurrency": 1,
        "llm_concurrency": LLM_CONCURRENCY,
        "env_spec": collect_env_spec("cuda"),
        "task_log_dir": str(out),
        "stats": {"warmup": WARMUP, "iters": ITERS, "kernels": figures},
    }
    path = out / f"{NAME}.json"
    path.write_text(report_json(finite_values(report), indent=2) + "\n", encoding="utf-8")
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
