"""Whether a bare CUPTI loop's timing depends on where its session starts (CUDA).

``compare_reference_cuda.py`` times each kernel two ways: a session started before 5 warm-up
calls (``plain``, the harness's situation: its session is already running when a case warms
up) and a session started at the first timed call (``@start``).  Here both styles alternate
three times on the same tensors in one fresh process, for the two short memory-bound kernels
whose harness/reference ratios moved most, and every session prints its device event count
(one kernel per call is expected), its mean and median per-call duration and its first and
last five durations.  Equal figures for both styles, and different ones from
``compare_reference_cuda.py``'s process for the same shapes, mean that the spread of such
kernels comes from the process (where its tensors lie, what ran before), not from the
session's shape.

    python tests/perf/reference_session_style.py
"""

from __future__ import annotations

import statistics
import sys
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

WARMUP = 5
ITERS = 50


def reference_input(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    import torch

    sign = torch.randint(0, 2, shape, device="cuda") * 2 - 1
    return ((torch.rand(shape, device="cuda") + 0.5) * sign).to(dtype)


def session_durations_us(function: Callable[[], object], calls: int) -> list[float]:
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


def main() -> int:
    import torch

    kernels: dict[str, Callable[[], Callable[[], object]]] = {
        "cast": lambda: (lambda x: lambda: x.to(torch.float32))(reference_input((1, 4096, 1024), torch.bfloat16)),
        "mixed-add": lambda: (lambda x, y: lambda: x.add(y))(
            reference_input((4096, 1024), torch.float32), reference_input((4096, 1024), torch.bfloat16)
        ),
    }
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
