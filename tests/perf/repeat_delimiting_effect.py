"""Does delimiting every repeat change the measured durations?  Paired cases, same session.

Each of N small-kernel rows (the overhead benchmark's Add database) is replayed twice in a row
through one collector: once with the case's repeats delimited as a whole (the default: one
labelled range on the CPU, two marker kernels on CUDA) and once with every repeat delimited
(``--repeat-markers``), the order alternating from row to row.  Prints the distribution over rows
of the ratio of the two per-row means (and of the two minima): a ratio away from 1 that repeats
from run to run is what delimiting every repeat does to the durations.

    python tests/perf/repeat_delimiting_effect.py [--backend cpu] [--cases 400]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_overhead import small_cases  # noqa: E402


def quartiles(values: list[float]) -> str:
    ordered = sorted(values)
    return (f"median {statistics.median(ordered):.3f}, p25 {ordered[len(ordered) // 4]:.3f}, "
            f"p75 {ordered[3 * len(ordered) // 4]:.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--cases", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()

    from perf_plugin.backends.select import resolve_backend
    from perf_plugin.profiling.torch_profiler import TorchProfilerCollector
    from perf_plugin.run.runner import ReplayRunner

    backend = resolve_backend(args.backend)
    cases = small_cases(args.cases)
    collector = TorchProfilerCollector(backend, batch_size=32)
    runner = ReplayRunner(backend, collector, args.repeats, 5, cache_mode="warm")
    results = {}
    for index, case in enumerate(cases):
        for every_repeat in ((False, True) if index % 2 else (True, False)):
            collector.repeat_markers = every_repeat
            ref = dataclasses.replace(case.ref, case_id=f"{case.ref.case_id}|{every_repeat}")
            runner.run(dataclasses.replace(case, ref=ref))
            results.update((r.ref.case_id, r) for r in collector.drain())
    results.update((r.ref.case_id, r) for r in collector.finish())
    pairs = [(results[f"{c.ref.case_id}|False"], results[f"{c.ref.case_id}|True"]) for c in cases]
    pairs = [(whole, every) for whole, every in pairs if whole.samples_us and every.samples_us]
    means = [statistics.fmean(whole.samples_us) / statistics.fmean(every.samples_us) for whole, every in pairs]
    minima = [min(whole.samples_us) / min(every.samples_us) for whole, every in pairs]
    print(f"backend={args.backend} ({backend.device_name()}) rows={len(pairs)} repeats={args.repeats}")
    print(f"repeats delimited as a whole / every repeat delimited, per-row mean: {quartiles(means)}")
    print(f"the same, per-row minimum: {quartiles(minima)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
