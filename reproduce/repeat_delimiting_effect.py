"""Does delimiting every repeat change the measured durations?  Paired cases, same session.

Reproduces docs/database.md, "What a row holds after a run": on the CPU the per-repeat ranges of
``--repeat-markers`` lengthen a small op's profiled time "by 3.5-4 % for a few-microsecond Add,
the median over 400 paired rows" (a ratio of 0.960-0.966, repeats delimited as a whole over
every repeat delimited).

Each of N small-kernel rows (the Add rows of ``benchmarks/bench_overhead.py``) is replayed twice
in a row through one collector: once with the case's repeats delimited as a whole (the default:
one labelled range on the CPU, two marker kernels on CUDA) and once with every repeat delimited
(``--repeat-markers``), the order alternating from row to row.  Prints the distribution over rows
of the ratio of the two per-row means (and of the two minima): a ratio away from 1 that repeats
from run to run is what delimiting every repeat does to the durations.

Prerequisites: a CPU (verified: 2-core x86-64, Python 3.11, torch 2.13 CPU build), or an NVIDIA
GPU with torch built for CUDA (``--backend cuda``; not verified on this version); this project
installed (``pip install -e .``).

    python reproduce/repeat_delimiting_effect.py [--backend cpu] [--cases 400] [--out DIR]

Expected output (CPU, a few seconds):

    backend=cpu (CPU_X86_64) rows=400 repeats=30
    repeats delimited as a whole / every repeat delimited, per-row mean: median 0.962, p25 0.936, p75 0.978
    the same, per-row minimum: median 0.971, p25 0.957, p75 0.981

The median of the per-row mean ratio moves from run to run: ten runs of this version on a
2-core x86 machine gave 0.947-0.965, four of them inside README's 0.960-0.966 (a lengthening of
3.6-5.6 %; README: 3.5-4 %).

and ``DIR/repeat_delimiting_effect.json`` (by default in a new temporary directory) with the
quartiles under ``stats``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

from perf_plugin.report.environment import collect_env_spec
from perf_plugin.report.run_json import LLM_CONCURRENCY, finite_values, report_json

NAME = "repeat_delimiting_effect"
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


def quartiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "p25": ordered[len(ordered) // 4],
            "p75": ordered[3 * len(ordered) // 4]}


def describe(figures: dict[str, float]) -> str:
    return ", ".join(f"{key} {value:.3f}" for key, value in figures.items())


def device_ids(backend_name: str) -> list[int]:
    if backend_name != "cuda":
        return []
    import torch

    return [torch.cuda.current_device()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--cases", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path, help=f"directory of {NAME}.json (default: a new temporary directory)")
    args = parser.parse_args(argv)

    from perf_plugin.backends.select import resolve_backend
    from perf_plugin.profiling.torch_profiler import TorchProfilerCollector
    from perf_plugin.run.runner import ReplayRunner

    started = time.perf_counter()
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
    pairs = [(results.get(f"{c.ref.case_id}|False"), results.get(f"{c.ref.case_id}|True")) for c in cases]
    pairs = [(whole, every) for whole, every in pairs if whole and every and whole.samples_us and every.samples_us]
    means = quartiles([statistics.fmean(whole.samples_us) / statistics.fmean(every.samples_us) for whole, every in pairs])
    minima = quartiles([min(whole.samples_us) / min(every.samples_us) for whole, every in pairs])
    print(f"backend={args.backend} ({backend.device_name()}) rows={len(pairs)} repeats={args.repeats}")
    print(f"repeats delimited as a whole / every repeat delimited, per-row mean: {describe(means)}")
    print(f"the same, per-row minimum: {describe(minima)}")

    out = args.out or Path(tempfile.mkdtemp(prefix=f"{NAME}_"))
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": f"perf_plugin.reproduce:{NAME}",
        "script": f"reproduce/{NAME}.py",
        "workflow": "ReplayRunner, paired delimiting styles",
        "pass_n": 1,  # every row runs once in each style
        "ops_count": len(cases),
        "elapsed_s": time.perf_counter() - started,
        "device_ids": device_ids(args.backend),
        "max_concurrency": 1,
        "llm_concurrency": LLM_CONCURRENCY,
        "env_spec": collect_env_spec(args.backend),
        "task_log_dir": str(out),
        "stats": {
            "total_ops": len(cases),
            "passed_ops": len(pairs),
            "failed_ops": len(cases) - len(pairs),
            "pass_rate": round(len(pairs) / len(cases), 3) if cases else 0.0,
            "backend": args.backend,
            "device": backend.device_name(),
            "repeats": args.repeats,
            "ratio_of_means": means,
            "ratio_of_minima": minima,
            "lengthening_percent": 100 * (1 / means["median"] - 1),
        },
    }
    path = out / f"{NAME}.json"
    path.write_text(report_json(finite_values(report), indent=2) + "\n", encoding="utf-8")
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
