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

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reference_input_sensitivity import ITERS, WARMUP, reference_style, session_durations_us  # noqa: E402


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    import torch

    kernels: dict[str, Callable[[], Callable[[], object]]] = {
        "cast": lambda: (lambda x: lambda: x.to(torch.float32))(reference_style((1, 4096, 1024), torch.bfloat16)),
        "mixed-add": lambda: (lambda x, y: lambda: x.add(y))(
            reference_style((4096, 1024), torch.float32), reference_style((4096, 1024), torch.bfloat16)
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
