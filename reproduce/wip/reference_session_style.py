"""Whether a bare CUPTI loop's timing depends on where its session starts (CUDA).

Reproduces docs/measured.md, "Measured" (H100), the reference comparison's second note: "in a fresh
process (``reference_session_style.py``, three sessions of each style on the same tensors, two
processes) the cast took 10.24-10.30 us and the mixed add 17.45-17.56 us whether the session
started before or after the warm-up calls".

``compare_reference_cuda.py`` times each kernel two ways: a session started before 5 warm-up
calls (``plain``, the harness's situation: its session is already running when a case warms
up) and a session started at the first timed call (``@start``).  Here both styles alternate
three times on the same tensors in one fresh process, for the two short memory-bound kernels
whose harness/reference ratios moved most, and every session prints its device event count
(one kernel per call is expected), its mean and median per-call duration and its first and
last five durations.  Equal figures for both styles, and different ones from
``compare_reference_cuda.py``'s process for the same shapes, mean that the spread of such
kernels comes from the process (where its tensors lie, what ran before), not from the
session's shape.  The bare loop and the input drawing are the ones of
``reference_input_sensitivity.py`` (kept in step with it by hand).

Verification missing: it needs an NVIDIA GPU, so it was not run on the CPU machine the scripts
in ``reproduce/`` were verified on, and only one process was run, not README's two.  One run of
this version on an H100 80GB HBM3 (torch 2.11, CUDA 13) gave the cast 10.27-10.35 us (mean of
the timed calls, six sessions) and the mixed add 17.45-17.49 us, both styles alike (README:
10.24-10.30 and 17.45-17.56 us).

Prerequisites: an NVIDIA GPU, torch built for CUDA, this project installed (``pip install -e .``:
only for the JSON report's environment).

    python reproduce/wip/reference_session_style.py [--out DIR]

Expected output: six lines per kernel (``cast``, ``mixed-add``), alternating ``plain`` and
``start``, each with ``events`` (55 for plain, 50 for start), the mean and median of the timed
calls and the first and last five durations; then ``DIR/reference_session_style.json`` (by
default in a new temporary directory) with every session's figures under ``stats``.
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

NAME = "reference_session_style"
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


def reference_style(shape: tuple[int, ...], dtype: "torch.dtype") -> "torch.Tensor":
    """An input drawn as ``compare_reference_cuda.py`` draws its own: magnitudes in [0.5, 1.5], random signs."""
    import torch

    sign = torch.randint(0, 2, shape, device="cuda") * 2 - 1
    return ((torch.rand(shape, device="cuda") + 0.5) * sign).to(dtype)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help=f"directory of {NAME}.json (default: a new temporary directory)")
    args = parser.parse_args(argv)
    import torch

    started = time.perf_counter()
    kernels: dict[str, Callable[[], Callable[[], object]]] = {
        "cast": lambda: (lambda x: lambda: x.to(torch.float32))(reference_style((1, 4096, 1024), torch.bfloat16)),
        "mixed-add": lambda: (lambda x, y: lambda: x.add(y))(
            reference_style((4096, 1024), torch.float32), reference_style((4096, 1024), torch.bfloat16)
        ),
    }
    sessions: dict[str, list[dict[str, Any]]] = {}
    for name, make in kernels.items():
        function = make()
        for _ in range(WARMUP):
            function()
        torch.cuda.synchronize()
        for style in ("plain", "start") * 3:
            calls = WARMUP + ITERS if style == "plain" else ITERS
            durations = session_durations_us(function, calls)
            timed = durations[WARMUP:] if style == "plain" else durations
            print(f"{name:10} {style:6} events {len(durations):3} mean(timed) {statistics.mean(timed):.2f} "
                  f"median {statistics.median(timed):.2f} first5 {[round(v, 2) for v in durations[:5]]} "
                  f"last5 {[round(v, 2) for v in durations[-5:]]}", flush=True)
            sessions.setdefault(name, []).append({"style": style, "events": len(durations),
                                                  "mean_us": statistics.mean(timed),
                                                  "median_us": statistics.median(timed)})

    out = args.out or Path(tempfile.mkdtemp(prefix=f"{NAME}_"))
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": f"perf_plugin.reproduce:{NAME}",
        "script": f"reproduce/wip/{NAME}.py",
        "workflow": "bare torch.profiler loop",
        "pass_n": 3,  # three sessions of each style per kernel
        "ops_count": len(kernels),
        "elapsed_s": time.perf_counter() - started,
        "device_ids": [torch.cuda.current_device()],
        "max_concurrency": 1,
        "llm_concurrency": LLM_CONCURRENCY,
        "env_spec": collect_env_spec("cuda"),
        "task_log_dir": str(out),
        "stats": {"warmup": WARMUP, "iters": ITERS, "sessions": sessions},
    }
    path = out / f"{NAME}.json"
    path.write_text(report_json(finite_values(report), indent=2) + "\n", encoding="utf-8")
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
