"""Cost of the end-of-run reports: ``collect_env_spec`` and ``write_reports`` on a large run.

Targets: ``collect_env_spec`` under 0.5 s (first call in a process that already imported torch,
as at the end of a run, including ``git``); all reports of a 20,000-case run written in under
2 s.  The run is synthetic but shaped like a real one: every case has 20 samples, one in ten
failed, one in twenty launched two kernels, every measured row has a gap entry.

Prerequisites: any CPU, torch, this project installed (``pip install -e .``); ``git`` on the
path for the environment's commit (optional).

    python benchmarks/report_speed.py [--cases 20000] [--backend cpu]

Expected output: the time of the first and of a second ``collect_env_spec`` call (with whether
git was found, the GPUs and any errors), the time ``write_reports`` took with the size of each
report file, and a ``MISSED:`` line per target missed.  Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from perf_plugin.results import CaseRef, CaseResult, FileWriteback, GapRow, KernelTime, RunSummary

ROOT = Path(__file__).resolve().parents[1]

ENV_TARGET_S = 0.5
REPORTS_TARGET_S = 2.0
KERNEL_TYPES = ("MatMulV3", "MatMulV2", "RmsNorm", "SwiGlu", "Add", "Cast", "Mul", "FlashAttentionScore")


def synthetic_summary(cases: int, seed: int = 0) -> RunSummary:
    rng = random.Random(seed)
    results, gaps = [], []
    for i in range(cases):
        kernel_type = KERNEL_TYPES[i % len(KERNEL_TYPES)]
        line = i // len(KERNEL_TYPES) + 2
        signature = f"{4096 + i},1024;1024,1024 | BF16;BF16 | ND;ND | {4096 + i},1024 | BF16"
        if i % 10 == 9:
            results.append(CaseResult(CaseRef(f"{kernel_type}-{i}", kernel_type, f"{kernel_type}.csv", line, signature),
                                      "failed", reason="relative error 0.2 exceeds 0.01"))
            continue
        base = rng.uniform(5.0, 500.0)
        samples = tuple(base * rng.uniform(0.97, 1.03) for _ in range(20))
        kernels = (KernelTime("gemm", base * 0.9, 1.0), KernelTime("reduce", base * 0.1, 1.0)) if i % 20 == 0 else ()
        results.append(CaseResult(CaseRef(f"{kernel_type}-{i}", kernel_type, f"{kernel_type}.csv", line, signature),
                                  "passed", backend="cpu", samples_us=samples, kernels=kernels))
        gaps.append(GapRow(f"{kernel_type}.csv", line, signature, base, base * rng.uniform(0.6, 1.5)))
    files = [FileWriteback(f"{k}.csv", rows_updated=cases // len(KERNEL_TYPES), written=True) for k in KERNEL_TYPES]
    return RunSummary("2026-03-02T10:15:00+00:00", 600.0, "cpu", "CPU_X86_64", "database/data/x", "all", 20, 5,
                      ["pytest", "bench"], results=results, files=files, gaps=gaps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=20000)
    parser.add_argument("--backend", default="cpu")
    args = parser.parse_args(argv)

    import torch  # noqa: F401  - as at the end of a run: torch is already imported

    from perf_plugin.report.environment import collect_env_spec
    from perf_plugin.report.writer import write_reports

    start = time.perf_counter()
    spec = collect_env_spec(args.backend, cwd=ROOT)
    env_first = time.perf_counter() - start
    start = time.perf_counter()
    collect_env_spec(args.backend, cwd=ROOT)
    env_again = time.perf_counter() - start
    print(f"collect_env_spec({args.backend!r}): first {env_first * 1000:.1f} ms, again {env_again * 1000:.1f} ms"
          f" (git: {'yes' if spec['git'] else 'no'}, gpus: {spec['cuda_devices']}, errors: {spec['errors']})")

    summary = synthetic_summary(args.cases)
    summary.env = spec
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        paths = write_reports(Path(tmp) / "reports", summary, "20260302_101500")
        reports_s = time.perf_counter() - start
        sizes = ", ".join(f"{p.name} {p.stat().st_size / 1e6:.2f} MB" for p in paths)
    print(f"write_reports, {args.cases} cases, {len(summary.gaps)} gap rows: {reports_s:.3f} s ({sizes})")

    missed = []
    if env_first > ENV_TARGET_S:
        missed.append(f"collect_env_spec {env_first:.3f} s > {ENV_TARGET_S} s")
    if reports_s > REPORTS_TARGET_S:
        missed.append(f"write_reports {reports_s:.3f} s > {REPORTS_TARGET_S} s")
    for line in missed:
        print(f"MISSED: {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
