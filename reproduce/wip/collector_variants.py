"""Ways of driving torch.profiler for many small cases, side by side: cost per case and agreement.

Reproduces docs/measured.md, "Measured", the profiler's cost per small case: on the 2-core x86 CPU
machine "Profiler use per small case" (repeats alone 0.21-0.33 ms; the collector as it is, 31
events per case, 0.72-0.90 ms; a range per repeat, 60 events, 1.13-1.25 ms; collection on for
the whole batch, 141 events, 1.75-1.77 ms), and on the H100 the profiler's share of the bare
case in the overhead item (3.2 ms per case with the profiler, 1.3 ms without; toggling CUDA
collection: 32 instead of 52 events per case, 5.5 vs 3.2 ms; stopping a session 10-26 us per
event, reading it back 7-8 us).

Every variant runs the same N small-kernel rows (Add of k x n floats, the rows of
``benchmarks/bench_overhead.py``) through the real ``ReplayRunner`` (inputs, verification,
warm-up, timed repeats) and differs only in how the profiler is driven:

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
  without the runtime API records;
* ``kineto-no-external-correlation``: the low-level session with ``disable_external_correlation``;
* ``kineto-device-activity-types``: the low-level session with a Kineto configuration string that
  names the activity types (kernels, memcpy, memset and the runtime records that link them);
* ``cupti-python``, ``cupti-python-hw``: CUDA only, NVIDIA's ``cupti-python`` activity API instead
  of torch.profiler: kernel, memcpy and memset records only, enabled once, flushed every 32 cases,
  the harness's markers and attribution (``-hw``: CUPTI's hardware-based tracing as well).  CUPTI's
  activity callbacks are process-wide, so list these after the torch.profiler variants.

For each it prints ms/case (median over alternating rounds), profiler events per case, how many
cases were measured, and the median over cases of the per-case mean duration relative to
``batch-always-on`` (a variant that measures something else shows up there).  A last table (CUDA)
compares the cost of stopping a session holding only marker kernels (short names) with one
holding the same number of elementwise kernels (long templated names).

Verification missing: the CPU figures did not all reproduce on this version (2-core x86-64,
Python 3.11, torch 2.13 CPU build, three runs of ``--cases 512 --rounds 3`` on an idle
machine): ``batch`` took 0.72-0.76 ms with 31 events per case and ``batch-repeat-markers`` 60
events, as README says, but ``batch-repeat-markers`` took 0.94-0.96 ms (README: 1.13-1.25),
``batch-always-on`` recorded 131.8 events per case (README: 141) in 1.28-1.32 ms (README:
1.75-1.77) and ``none`` took 0.35-0.36 ms (README: 0.21-0.33); README's CPU item needs
re-measuring.  One CUDA run of this
version on an H100 80GB HBM3 (torch 2.11, CUDA 13, ``--cases 512 --rounds 2``): ``none`` 0.88
ms, ``batch`` 2.32 ms with 46.5 events per case (README: 1.3 and 3.2 ms, ~47 events),
``batch-toggled`` 5.41 ms with 32 events (README: 5.5 ms, 32 instead of 52), stopping a session
8.4-10.6 us per event and reading it back 4.3-7.0 us (README: 10-26 and 7-8 us); the host is
shared and its timings move by up to 2x between machines.  ``batch-filtered`` fails on torch
2.11 (``_prepare_profiler()`` takes no activity filter) and is reported as such.  A later run
(H100 80GB HBM3, ``--cases 512 --rounds 2``): ``none`` 0.90 ms, ``batch`` 2.15, ``batch-lowlevel``
2.49, ``kineto-no-external-correlation`` 2.60, ``cupti-python`` (13.2, on the image's CUPTI 13.0)
1.81 ms with 47 records per case but kernel durations 2.1x ``batch``'s for the same cases (not
investigated), ``cupti-python-hw`` not supported there (``CUPTI_ERROR_NOT_SUPPORTED``);
``kineto-device-activity-types``, run alone, crashed the process; stopping a session 9.6 us per
event for marker kernels and 31.4 us for add kernels.

Prerequisites: a CPU, or an NVIDIA GPU with torch built for CUDA (``--backend cuda``); this
project installed (``pip install -e .``).  Host timings move by 10-30 % between runs on a
shared machine: compare within one run, and run it more than once.

    python reproduce/wip/collector_variants.py --backend cpu --cases 512 --rounds 3 [--out DIR]
    python reproduce/wip/collector_variants.py --backend cuda --cases 512 --rounds 2 2>/dev/null

Expected output: a line per round, then one table line per variant (ms/case, cases/s,
events/case, cases measured, agreement with ``batch-always-on``); on the CPU about 31 events per
case for ``batch``, 60 for ``batch-repeat-markers`` and 131.8 for ``batch-always-on`` (this
version), the ms/case ordered none < batch <= batch-repeat-markers < batch-always-on.
``DIR/collector_variants.json`` (by default in a new temporary directory) holds the figures
under ``stats.variants``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from perf_plugin.profiling.torch_profiler import TorchProfilerCollector, quiet_native_stderr, read_events
from perf_plugin.report.environment import collect_env_spec
from perf_plugin.report.run_json import LLM_CONCURRENCY, finite_values, report_json

NAME = "collector_variants"
HEADER = "OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats"


def small_cases(count: int) -> list:
    """The cases of ``count`` small Add rows (the rows of ``benchmarks/bench_overhead.py``)."""
    from perf_plugin.replay.registry import get_replay
    from perf_plugin.run.cases import load_case_set

    rows = []
    for k in range(count):
        shape = f"{1 + k % 97},{128 + 16 * (k // 97)}"  # distinct shapes of at most ~60k elements
        rows.append(f'dynamic,AI_VECTOR_CORE,"""{shape};{shape}""",FLOAT;FLOAT,ND;ND,"""{shape}""",FLOAT,ND')
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "Add.csv").write_text("\n".join([HEADER, *rows]) + "\n")
        return load_case_set(Path(tmp), get_replay).cases


def _activity_set(backend_name: str) -> set[Any]:
    from torch._C._profiler import ProfilerActivity

    return {ProfilerActivity.CUDA if backend_name == "cuda" else ProfilerActivity.CPU}


def _low_level_config(**experimental: Any) -> Any:
    from torch._C._profiler import ProfilerConfig, ProfilerState, _ExperimentalConfig

    return ProfilerConfig(ProfilerState.KINETO, False, False, False, False, False, _ExperimentalConfig(**experimental))


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

            config, activities = self._config(), _activity_set(self.backend.name)
            with quiet_native_stderr():
                if self.filtered:
                    from torch._C._profiler import ProfilerActivity

                    kinds = {"CONCURRENT_KERNEL", "GPU_MEMCPY", "GPU_MEMSET"}
                    _prepare_profiler(config, activities, activity_filter={ProfilerActivity.CUDA: kinds})
                else:
                    _prepare_profiler(config, activities)
                _enable_profiler(config, activities)
            self._profiler = True

    def _config(self) -> Any:
        return _low_level_config()

    def _stop(self):  # type: ignore[no-untyped-def]
        if self._profiler is None:
            return []
        from torch.autograd.profiler import _disable_profiler

        self.backend.synchronize()
        self._profiler = None
        with quiet_native_stderr():
            result = _disable_profiler()
        found = read_events(result.events(), device_only=self._marker is not None)
        self.events += len(found)
        return found


class KinetoConfigured(LowLevel):
    """The low-level session with an experimental configuration: a Kineto configuration string
    (``custom_profiler_config``) or ``disable_external_correlation``."""

    def __init__(self, *args: Any, custom: str = "", no_external_correlation: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.custom, self.no_external_correlation = custom, no_external_correlation

    def _config(self) -> Any:
        return _low_level_config(disable_external_correlation=self.no_external_correlation, custom_profiler_config=self.custom)


class CuptiPython(Counting):
    """NVIDIA's cupti-python activity API: kernel, memcpy and memset records only (no runtime-API
    records), enabled once and flushed at every batch; the harness's markers and attribution.
    Records carry mangled kernel names (the marker's still contains ``spin_kernel``)."""

    def __init__(self, *args: Any, hw_trace: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._toggles = False
        self.hw_trace = hw_trace
        self.records: list[Any] = []
        self.enabled = False

    def _requested(self) -> tuple[int, int]:
        return 8 * 1024 * 1024, 0

    def _completed(self, activities: list[Any]) -> None:
        from perf_plugin.profiling.attribution import RawEvent

        for a in activities:
            name = getattr(a, "name", None) or f"memory {int(a.kind)}"
            self.records.append(RawEvent(name, True, a.start, a.end - a.start, a.correlation_id, 0, False))

    def _ensure_started(self) -> None:
        if not self.enabled:
            from cupti import cupti

            cupti.activity_register_callbacks(self._requested, self._completed)
            if self.hw_trace:
                cupti.activity_enable_hw_trace(1)
            for kind in (cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.MEMCPY, cupti.ActivityKind.MEMSET):
                cupti.activity_enable(kind)
            self.enabled = True
        self._profiler = True

    def _stop(self):  # type: ignore[no-untyped-def]
        if self._profiler is None:
            return []
        from cupti import cupti

        self.backend.synchronize()
        self._profiler = None
        cupti.activity_flush_all(1)
        found, self.records = self.records, []
        found.sort(key=lambda e: e.correlation_id)
        self.events += len(found)
        return found

    def close(self) -> None:
        """Disable the activities, so that a later torch.profiler session has CUPTI to itself."""
        from cupti import cupti

        for kind in (cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.MEMCPY, cupti.ActivityKind.MEMSET):
            cupti.activity_disable(kind)
        if self.hw_trace:
            cupti.activity_enable_hw_trace(0)
        cupti.activity_flush_all(1)


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
    if name == "kineto-no-external-correlation":
        return KinetoConfigured(backend, batch_size=32, no_external_correlation=True)
    if name == "kineto-device-activity-types":  # crashed (segfault) on torch 2.11 once: run it last
        return KinetoConfigured(backend, batch_size=32, custom="ACTIVITY_TYPES=kernel,gpu_memcpy,gpu_memset,cuda_runtime")
    if name in ("cupti-python", "cupti-python-hw"):
        return CuptiPython(backend, batch_size=32, hw_trace=name.endswith("-hw"))
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
    if hasattr(collector, "close"):
        collector.close()
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
            with quiet_native_stderr():
                _prepare_profiler(config, activities)
                _enable_profiler(config, activities)
            for _ in range(count):
                launch()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with quiet_native_stderr():
                result = _disable_profiler()
            t1 = time.perf_counter()
            events = result.events()
            for e in events:
                e.name(), e.start_ns(), e.duration_ns(), e.correlation_id()
            t2 = time.perf_counter()
        rows.append((label, 1e6 * (t1 - t0) / count, 1e6 * (t2 - t1) / count, len(events)))
    return rows


def device_ids(backend_name: str) -> list[int]:
    if backend_name != "cuda":
        return []
    import torch

    return [torch.cuda.current_device()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--cases", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", default="none,batch,batch-repeat-markers,batch-always-on,batch-lowlevel,per-case,"
                        "batch-toggled,batch-filtered")
    parser.add_argument("--out", type=Path, help=f"directory of {NAME}.json (default: a new temporary directory)")
    args = parser.parse_args(argv)

    from perf_plugin.backends.select import resolve_backend

    started = time.perf_counter()
    backend = resolve_backend(args.backend)
    cases = small_cases(args.cases)
    names = [n for n in args.variants.split(",") if n]
    if args.backend != "cuda":
        names = [n for n in names if n != "batch-filtered" and not n.startswith("cupti")]
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
    print(f"{'variant':22}{'ms/case':>9}{'cases/s':>9}{'events/case':>13}{'measured':>10}{'vs on':>10}  error")
    base = means.get("batch-always-on") or means.get("batch", {})
    variants: dict[str, dict[str, Any]] = {}
    for name in names:
        per_case = statistics.median(walls[name])
        common = [means[name][k] / base[k] for k in means[name] if k in base and base[k] > 0]
        agreement = f"{statistics.median(common):.3f}" if common else "-"
        print(f"{name:22}{1e3 * per_case:>9.2f}{1 / per_case:>9.0f}{events[name]:>13.1f}"
              f"{len(means[name]):>10}{agreement:>10}  {errors.get(name, '')}")
        variants[name] = {
            "ms_per_case": 1e3 * per_case,
            "ms_per_case_rounds": [1e3 * wall for wall in walls[name]],
            "cases_per_s": 1 / per_case,
            "events_per_case": events[name],
            "cases_measured": len(means[name]),
            "mean_vs_always_on": statistics.median(common) if common else None,
            "error": errors.get(name, ""),
        }
    stop_costs = []
    if args.backend == "cuda":
        print(f"\n{'session holding':18}{'stop us/event':>15}{'read us/event':>15}{'events':>8}")
        for label, stop_us, read_us, count in stop_cost(backend, 4000):
            print(f"{label:18}{stop_us:>15.2f}{read_us:>15.2f}{count:>8}")
            stop_costs.append({"session_holding": label, "stop_us_per_event": stop_us, "read_us_per_event": read_us,
                               "events": count})

    out = args.out or Path(tempfile.mkdtemp(prefix=f"{NAME}_"))
    out.mkdir(parents=True, exist_ok=True)
    measured = len(means.get("batch", {}))
    report = {
        "benchmark": f"perf_plugin.reproduce:{NAME}",
        "script": f"reproduce/wip/{NAME}.py",
        "workflow": "ReplayRunner per profiler variant",
        "pass_n": args.rounds,  # every case runs once per variant and round
        "ops_count": len(cases),
        "elapsed_s": time.perf_counter() - started,
        "device_ids": device_ids(args.backend),
        "max_concurrency": 1,
        "llm_concurrency": LLM_CONCURRENCY,
        "env_spec": collect_env_spec(args.backend),
        "task_log_dir": str(out),
        "stats": {
            "total_ops": len(cases),
            "passed_ops": measured,
            "failed_ops": len(cases) - measured,
            "pass_rate": round(measured / len(cases), 3) if cases else 0.0,
            "backend": args.backend,
            "device": backend.device_name(),
            "repeats": args.repeats,
            "rounds": args.rounds,
            "variants": variants,
            "stop_cost": stop_costs,
        },
    }
    path = out / f"{NAME}.json"
    path.write_text(report_json(finite_values(report), indent=2) + "\n", encoding="utf-8")
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
