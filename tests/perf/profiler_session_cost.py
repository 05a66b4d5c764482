"""Where torch.profiler's cost goes for small CUDA cases, and whether toggling collection helps.

Runs B batches of 32 small-kernel "cases" (input creation, one verified call with a copy to the
host, 5 warm-ups, 30 timed repeats between two marker kernels: the harness's pattern) under one
``torch.profiler`` session per batch with CUDA activity only, in two variants:

* ``always on``: collection active for the whole session (the harness today);
* ``toggled``: ``profile.toggle_collection_dynamic`` switches CUDA activity off outside the
  markers-and-repeats, so set-up, verification and warm-up launch unrecorded.

Prints per case: wall time of the loop, of ``__exit__`` (the profiler's stop and processing),
of ``kineto_results.events()`` + reading the fields, and the events returned by device type.

    python tests/perf/profiler_session_cost.py [--batches 10] 2>/dev/null

(Kineto warns on stderr at every toggle.)  On an H100 with torch 2.11 and CUDA 13 the always-on
session returned 55 host-side CUDA runtime events and 47 device activities per case, and its
stop plus read-back cost 1.3-2.5 ms per case; the toggled session returned no events at all, so
toggling is no way to leave set-up and warm-up unrecorded there.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

CASES_PER_BATCH = 32


def one_case(k: int, prof: profile | None) -> None:
    shape = (1 + k % 97, 128 + 16 * (k // 97))
    x = (torch.rand(shape, device="cuda") + 0.5) * (torch.randint(0, 2, shape, device="cuda") * 2 - 1)
    y = torch.rand(shape, device="cuda") + 0.5
    out = x.add(y)
    out.cpu()  # verification: a copy to the host
    for _ in range(5):
        x.add(y)
    if prof is not None:
        prof.toggle_collection_dynamic(True, [ProfilerActivity.CUDA])
    torch.cuda._sleep(1)
    for _ in range(30):
        x.add(y)
    torch.cuda._sleep(1)
    if prof is not None:
        prof.toggle_collection_dynamic(False, [ProfilerActivity.CUDA])


def batch(first_case: int, toggled: bool, cpu_names: Counter | None = None) -> tuple[float, float, float, Counter]:
    start = time.perf_counter()
    prof = profile(activities=[ProfilerActivity.CUDA])
    prof.__enter__()
    if toggled:
        prof.toggle_collection_dynamic(False, [ProfilerActivity.CUDA])
    for k in range(first_case, first_case + CASES_PER_BATCH):
        one_case(k, prof if toggled else None)
    torch.cuda.synchronize()
    loop_done = time.perf_counter()
    prof.__exit__(None, None, None)
    stopped = time.perf_counter()
    raw = prof.profiler.kineto_results.events()
    kinds: Counter = Counter()
    for event in raw:
        kind = str(event.device_type()).split(".")[-1]
        kinds[kind] += 1
        if cpu_names is not None and kind == "CPU":
            cpu_names[event.name()] += 1
        event.name(), event.start_ns(), event.duration_ns(), event.correlation_id()
    read = time.perf_counter()
    return loop_done - start, stopped - loop_done, read - stopped, kinds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=10)
    args = parser.parse_args()
    for k in range(64):  # warm everything: kernels, CUPTI, the profiler itself
        one_case(k, None)
    cpu_names: Counter = Counter()
    batch(0, False, cpu_names)
    batch(0, True)
    print("CPU-side events of one always-on batch:", ", ".join(f"{n} {c}" for n, c in cpu_names.most_common(8)))
    print(f"{'variant':12}{'loop ms/case':>14}{'stop ms/case':>14}{'read ms/case':>14}  events per case")
    for toggled in (False, True, False, True):
        totals = [0.0, 0.0, 0.0]
        kinds: Counter = Counter()
        for b in range(args.batches):
            loop, stop, read, found = batch(b * CASES_PER_BATCH, toggled)
            totals = [totals[0] + loop, totals[1] + stop, totals[2] + read]
            kinds.update(found)
        cases = args.batches * CASES_PER_BATCH
        per = ", ".join(f"{name} {count / cases:.1f}" for name, count in kinds.most_common())
        label = "toggled" if toggled else "always on"
        print(f"{label:12}{1e3 * totals[0] / cases:>14.3f}{1e3 * totals[1] / cases:>14.3f}{1e3 * totals[2] / cases:>14.3f}  {per}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
