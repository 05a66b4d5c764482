"""Which Kineto settings shrink a CUDA profiling session of many small kernels, and at what cost.

One session of N small ``add`` calls (plus a marker kernel every 30 calls, as the harness
launches) per setting; for each it prints the events Kineto returns by kind (device activity,
CPU-side runtime records), the host time to stop the session and to read its events, per event,
and whether every kernel came back.  Settings: torch's defaults and ``disable_external_correlation``.
A Kineto configuration string restricting the activity types
(``custom_profiler_config="ACTIVITY_TYPES=kernel,gpu_memcpy,gpu_memset"``) crashed the process
(segmentation fault) with torch 2.11 on an H100, so it is not tried here.

    python tests/perf/kineto_config_cost.py [--calls 4000]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from typing import Any

SETTINGS: dict[str, dict[str, Any]] = {
    "default": {},
    "no-external-correlation": {"disable_external_correlation": True},
}


def session(calls: int, experimental: dict[str, Any]) -> tuple[Counter, float, float, int]:
    import torch
    from torch._C._profiler import _ExperimentalConfig
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(64, 256, device="cuda")
    y = torch.randn(64, 256, device="cuda")
    prof = profile(activities=[ProfilerActivity.CUDA], experimental_config=_ExperimentalConfig(**experimental))
    prof.__enter__()
    for call in range(calls):
        if call % 30 == 0:
            torch.cuda._sleep(1)
        x.add(y)
    torch.cuda.synchronize()
    start = time.perf_counter()
    prof.__exit__(None, None, None)
    stopped = time.perf_counter()
    raw = prof.profiler.kineto_results.events()
    kinds = Counter("device" if e.device_type() != DeviceType.CPU else "cpu" for e in raw)
    kernels = sum(1 for e in raw if e.device_type() != DeviceType.CPU and "spin_kernel" not in e.name())
    read = time.perf_counter()
    return kinds, stopped - start, read - stopped, kernels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=4000)
    args = parser.parse_args()
    session(200, {})  # the first session loads CUPTI
    print(f"{'setting':26}{'device ev':>10}{'cpu ev':>8}{'stop ms':>9}{'read ms':>9}{'us/event':>10}  kernels back")
    for name, experimental in SETTINGS.items():
        try:
            kinds, stop, read, kernels = session(args.calls, experimental)
        except Exception as exc:  # an unsupported setting in this torch build: say so, go on
            print(f"{name:26}error: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
            continue
        total = sum(kinds.values())
        print(f"{name:26}{kinds['device']:>10}{kinds['cpu']:>8}{1e3 * stop:>9.1f}{1e3 * read:>9.1f}"
              f"{1e6 * (stop + read) / max(total, 1):>10.2f}  {kernels}/{args.calls}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
