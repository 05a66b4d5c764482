"""What the execution trace observer adds to each operator's host time in a CPU profile.

A CPU profile's durations are host time: the operator's own work and whatever the profiler does
inside its range.  Profiled with the execution trace observer (``perf_plugin.capture.
execution_trace_observer``), every operator also serialises its inputs' identities into the
execution trace, inside the operator's range.  Here a decode-sized ``F.linear`` (``[1,256]`` by
``[256,256]`` bf16, with bias: ``aten::addmm``) is profiled 50 times on the CPU with and without
the observer, and with and without ``profile_memory``, after 50 calls of warm-up; the median of
``aten::addmm``'s CPU time is printed.

Result on a 2-core x86 machine (Python 3.11, torch 2.13), us: 18.8 without the observer
(18.9 with ``profile_memory``), 98.3 with it (98.5).  The tiny models of
``benchmarks/model_coverage.py --device cpu --tiny`` are profiled with the observer, so their
decode GEMVs took 200-300 us in the model and 17-136 us replayed.  A CPU profile meant as the
reference for small operators is best made without the observer (docs/input-values.md).  On a
GPU the kernels' durations do not include host time.

Prerequisites: this project installed.

    python reproduce/wip/execution_trace_host_cost.py

Expected output: four lines, ``execution trace  profile_memory  MEDIAN_US``.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from perf_plugin.capture import execution_trace_observer

CALLS = 50


def addmm_us(with_execution_trace: bool, profile_memory: bool) -> float:
    x = torch.randn(1, 256, dtype=torch.bfloat16)
    weight, bias = torch.randn(256, 256, dtype=torch.bfloat16), torch.randn(256, dtype=torch.bfloat16)
    for _ in range(CALLS):
        torch.nn.functional.linear(x, weight, bias)
    settings: dict[str, Any] = {"activities": [ProfilerActivity.CPU], "record_shapes": True,
                                "profile_memory": profile_memory}
    with tempfile.TemporaryDirectory() as folder:
        if with_execution_trace:
            settings["execution_trace_observer"] = execution_trace_observer(Path(folder) / "trace.json")
        with profile(**settings) as prof:
            for _ in range(CALLS):
                torch.nn.functional.linear(x, weight, bias)
    return statistics.median(event.cpu_time_total for event in prof.events() if event.name == "aten::addmm")


def main() -> None:
    print("execution trace  profile_memory  median us")
    for with_execution_trace in (False, True):
        for profile_memory in (False, True):
            print(f"{str(with_execution_trace):<16} {str(profile_memory):<15} "
                  f"{addmm_us(with_execution_trace, profile_memory):.1f}")


if __name__ == "__main__":
    main()
