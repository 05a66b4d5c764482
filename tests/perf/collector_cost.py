"""Where a small case's time goes: replay work alone vs profiler sessions of several batch sizes.

Runs N small-kernel cases (Add of k x 256 floats) through the ReplayRunner with (a) a collector
that only runs the repeats (no profiler), and (b) the torch.profiler collector at several batch
sizes, and on CUDA with a marker kernel per repeat instead of per case; prints cases/s for each,
and the cost of one empty profiler start/stop cycle.

    python tests/perf/collector_cost.py --backend cuda --cases 1000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_overhead import small_cases  # noqa: E402


class RepeatsOnly:
    kind = "none"

    def measure(self, case, run_once, repeats, before_repeat=None):  # type: ignore[no-untyped-def]
        for _ in range(repeats):
            run_once()

    def drain(self):  # type: ignore[no-untyped-def]
        return []

    def finish(self):  # type: ignore[no-untyped-def]
        return []


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--cases", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()

    from perf_plugin.backends.select import resolve_backend
    from perf_plugin.profiling.torch_profiler import TorchProfilerCollector
    from perf_plugin.run.runner import ReplayRunner

    backend = resolve_backend(args.backend)
    cases = small_cases(args.cases)

    def timed(collector) -> float:  # type: ignore[no-untyped-def]
        runner = ReplayRunner(backend, collector, args.repeats, 5)
        start = time.perf_counter()
        for case in cases:
            runner.run(case)
            collector.drain()
        collector.finish()
        backend.synchronize()
        return time.perf_counter() - start

    timed(TorchProfilerCollector(backend, batch_size=8))  # warm everything (imports, CUPTI, kernels)
    print(f"{'collector':28}{'cases/s':>10}{'ms/case':>10}")
    wall = timed(RepeatsOnly())
    print(f"{'repeats only (no profiler)':28}{len(cases) / wall:>10.0f}{1e3 * wall / len(cases):>10.2f}")
    variants = [(f"torch.profiler batch {batch}", batch, False) for batch in (32, 128, 512)]
    if args.backend == "cuda":
        variants.append(("batch 32, marker per repeat", 32, True))
    for label, batch, repeat_markers in variants:
        wall = timed(TorchProfilerCollector(backend, batch_size=batch, repeat_markers=repeat_markers))
        print(f"{label:28}{len(cases) / wall:>10.0f}{1e3 * wall / len(cases):>10.2f}")
    collector = TorchProfilerCollector(backend, batch_size=1)
    start = time.perf_counter()
    for _ in range(10):
        collector._ensure_started()
        collector._stop()
    print(f"empty profiler start/stop cycle: {100 * (time.perf_counter() - start):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
