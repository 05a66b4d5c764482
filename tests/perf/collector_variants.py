"""Ways of driving torch.profiler for many small cases, side by side: cost per case and agreement.

Every variant runs the same N small-kernel rows (Add of k x n floats, the overhead benchmark's
database) through the real ``ReplayRunner`` (inputs, verification, warm-up, timed repeats) and
differs only in how the profiler is driven:

* ``none``: the repeats run with no profiler (the replay work alone);
* ``batch``: the harness's collector as it is (one ``torch.profiler.profile`` session per 32
  cases; on the CPU collection is toggled off outside the timed repeats, on CUDA it is not);
* ``batch-repeat-markers``: the same with ``--repeat-markers`` (a labelled range, on CUDA a
  marker kernel, before every repeat instead of one per case);
* ``batch-always-on``: the same session with collection on throughout (set-up, verification and
  warm-up of every case but the first are recorded too);
* ``batch-lowlevel``: the same, through ``torch.autograd.profiler``'s prepare/enable/disable
  functions directly (no ``torch.profiler`` Python layer);
* ``per-case``: one low-level session per case, around the timed repeats only;
* ``batch-toggled``: one session per 32 cases, collection toggled off outside the timed repeats
  (``toggle_collection_dynamic``), on CUDA too;
* ``batch-filtered``: CUDA only, where torch supports activity filters: kernels, memcpy and memset
  without the runtime API records.

For each it prints ms/case (median over alternating rounds), profiler events per case, how many
cases were measured, and the median over cases of the per-case mean duration relative to
``batch-always-on`` (a variant that measures something else shows up there).  A last table compares the
cost of stopping a session holding only marker kernels (short names) with one holding the same
number of elementwise kernels (long templated names).

    python tests/perf/collector_variants.py --backend cuda --cases 512 --rounds 2 2>/dev/null
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_overhead import small_cases  # noqa: E402

from perf_plugin.profiling.torch_profiler import TorchProfilerCollector, _quiet_native_stderr, read_events  # noqa: E402


def _activity_set(backend_name: str) -> set[Any]:
    from torch._C._profiler import ProfilerActivity

    return {ProfilerActivity.CUDA if backend_name == "cuda" else ProfilerActivity.CPU}


def _low_level_config() -> Any:
    from torch._C._profiler import ProfilerConfig, ProfilerState, _ExperimentalConfig

    return ProfilerConfig(ProfilerState.KINETO, False, False, False, False, False, _ExperimentalConfig())


class NoProfiler:
    kind = "none"

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.events = 0

    def measure(self, case, run_once, repeats, before_repeat=None):  # type: ignore[no-untyped-def]
        for _ in range(repeats):
            run_once()

    def drain(self) -> list:
        return []

    def finish(self) -> list:
        self.backend.synchronize()
        return []


class Counting(TorchProfilerCollector):
    """The harness's collector, counting the events each stop returns."""

    events = 0

    def _stop(self):  # type: ignore[no-untyped-def]
        found = super()._stop()
        self.events += len(found)
        return found


class LowLevel(Counting):
    def __init__(self, *args: Any, filtered: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.filtered = filtered
        self._toggles = False

    def _ensure_started(self) -> None:
        if self._profiler is None:
            from torch.autograd.profiler import _enable_profiler, _prepare_profiler

            config, activities = _low_level_config(), _activity_set(self.backend.name)
            with _quiet_native_stderr():
                if self.filtered:
                    from torch._C._profiler import ProfilerActivity

                    kinds = {"CONCURRENT_KERNEL", "GPU_MEMCPY", "GPU_MEMSET"}
                    _prepare_profiler(config, activities, activity_filter={ProfilerActivity.CUDA: kinds})
                else:
                    _prepare_profiler(config, activities)
                _enable_profiler(config, activities)
            self._profiler = True

    def _stop(self):  # type: ignore[no-untyped-def]
        if self._profiler is None:
            return []
        from torch.autograd.profiler import _disable_profiler

        self.backend.synchronize()
        self._profiler = None
        with _quiet_native_stderr():
            result = _disable_profiler()
        found = read_events(result.events(), device_only=self._marker is not None)
        self.events += len(found)
        return found


class PerCase(LowLevel):
    def measure(self, case, run_once, repeats, before_repeat=None):  # type: ignore[no-untyped-def]
        super().measure(case, run_once, repeats, before_repeat)
        self._flush()


def make(name: str, backend: Any) -> Any:
    if name == "none":
        return NoProfiler(backend)
    if name == "batch-repeat-markers":
        return Counting(backend, batch_size=32, repeat_markers=True)
    if name in ("batch", "batch-always-on", "batch-toggled"):
        collector = Counting(backend, batch_size=32)
        if name != "batch":
            collector._toggles = name == "batch-toggled"
        return collector
    if name == "batch-lowlevel":
        return LowLevel(backend, batch_size=32)
    if name == "per-case":
        return PerCase(backend, batch_size=1)
    if name == "batch-filtered":
        return LowLevel(backend, batch_size=32, filtered=True)
    raise ValueError(name)


def run_variant(name: str, backend: Any, cases: list, repeats: int) -> tuple[float, float, dict[str, float], str]:
    from perf_plugin.run.runner import ReplayRunner

    collector = make(name, backend)
    runner = ReplayRunner(backend, collector, repeats, 5, cache_mode="warm")
    results = []
    error = ""
    start = time.perf_counter()
    try:
        for case in cases:
            runner.run(case)
            results.extend(collector.drain())
        results.extend(collector.finish())
    except Exception as exc:  # a variant this torch does not support
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    wall = time.perf_counter() - start
    means = {r.ref.case_id: statistics.fmean(r.samples_us) for r in results if r.samples_us}
    return wall / len(cases), collector.events / len(cases), means, error


def stop_cost(backend: Any, count: int) -> list[tuple[str, float, float, int]]:
    """Stop + read cost of a session holding ``count`` marker kernels vs ``count`` add kernels."""
    import torch
    from torch.autograd.profiler import _disable_profiler, _enable_profiler, _prepare_profiler

    x = torch.rand(64, 256, device="cuda")
    y = torch.rand(64, 256, device="cuda")
    rows = []
    for label, launch in (("marker kernels", lambda: torch.cuda._sleep(1)), ("add kernels", lambda: x.add(y))):
        for _ in range(2):  # the second pass is reported (the first warms the profiler)
            config, activities = _low_level_config(), _activity_set("cuda")
            with _quiet_native_stderr():
                _prepare_profiler(config, activities)
                _enable_profiler(config, activities)
            for _ in range(count):
                launch()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with _quiet_native_stderr():
                result = _disable_profiler()
            t1 = time.perf_counter()
            events = result.events()
            for e in events:
                e.name(), e.start_ns(), e.duration_ns(), e.correlation_id()
            t2 = time.perf_counter()
        rows.append((label, 1e6 * (t1 - t0) / count, 1e6 * (t2 - t1) / count, len(events)))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--cases", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", default="none,batch,batch-repeat-markers,batch-always-on,batch-lowlevel,per-case,"
                        "batch-toggled,batch-filtered")
    args = parser.parse_args()

    from perf_plugin.backends.select import resolve_backend

    backend = resolve_backend(args.backend)
    cases = small_cases(args.cases)
    names = [n for n in args.variants.split(",") if n]
    if args.backend != "cuda":
        names = [n for n in names if n != "batch-filtered"]
    run_variant("batch", backend, cases[:64], args.repeats)  # warm: imports, CUPTI, kernels
    walls: dict[str, list[float]] = {n: [] for n in names}
    events: dict[str, float] = {}
    means: dict[str, dict[str, float]] = {}
    errors: dict[str, str] = {}
    for round_number in range(args.rounds):
        for name in names:
            per_case, per_case_events, found, error = run_variant(name, backend, cases, args.repeats)
            walls[name].append(per_case)
            events[name], means[name] = per_case_events, found
            if error:
                errors[name] = error
        print(f"round {round_number + 1}: " + ", ".join(f"{n} {1e3 * walls[n][-1]:.2f}" for n in names), flush=True)
    print(f"\nbackend={args.backend} ({backend.device_name()}) cases={args.cases} repeats={args.repeats} "
          f"rounds={args.rounds}, ms/case are medians over rounds")
    print(f"{'variant':16}{'ms/case':>9}{'cases/s':>9}{'events/case':>13}{'measured':>10}{'vs on':>10}  error")
    base = means.get("batch-always-on") or means.get("batch", {})
    for name in names:
        per_case = statistics.median(walls[name])
        common = [means[name][k] / base[k] for k in means[name] if k in base and base[k] > 0]
        agreement = f"{statistics.median(common):.3f}" if common else "-"
        print(f"{name:16}{1e3 * per_case:>9.2f}{1 / per_case:>9.0f}{events[name]:>13.1f}"
              f"{len(means[name]):>10}{agreement:>10}  {errors.get(name, '')}")
    if args.backend == "cuda":
        print(f"\n{'session holding':18}{'stop us/event':>15}{'read us/event':>15}{'events':>8}")
        for label, stop_us, read_us, count in stop_cost(backend, 4000):
            print(f"{label:18}{stop_us:>15.2f}{read_us:>15.2f}{count:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
