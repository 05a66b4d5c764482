"""A model run profiled, ingested and replayed: rows, kernel types and replays per phase (CUDA).

Reproduces docs/measured.md, "Measured" (H100), "A model run ingested and replayed": 4 decoder layers
of Llama-3.1-8B (random weights), bf16, 3 forward passes each of a 512-token prefill and a
16-token decode, profiled with torch.profiler and ingested: 23 rows per phase in 14 kernel types;
``pytest bench --perf-backend cuda`` on that database replays and verifies 19 of the 23, the
other 4 are skipped as having no replay.

For each phase (``--tokens``, default 512 and 16) it runs ``examples/transformer_trace.py``
(profile and ingest into ``OUT/<tokens>/db``), replays the database with ``pytest bench
--perf-database-path OUT/<tokens>/db --perf-backend BACKEND``, and reads the outcome from the
run's JSON report.

Verification missing: the figure did not reproduce on this version.  One run on an H100 80GB
HBM3 (torch 2.11, CUDA 13, the defaults) gave, in each phase, 24 rows in 14 kernel types (Add 3,
BatchMatMulV2 2, ConcatD 2, GatherV2 1, MaskedFill 1, MatMulV2 4, Mul 3, Muls 1, RmsNorm 1,
SoftmaxV2 1, Sub 2, TensorMove 1, aten.repeat_interleave 1, aten.silu 1), of which 23 replayed
and passed and one ConcatD row was skipped as unsupported; README's "23 rows, 19 of 23" (with
aten.cat and aten.masked_fill rows, 4 without a replay) comes from an earlier version and needs
updating.  It needs an NVIDIA GPU, so it was not run on the CPU machine the scripts in
``reproduce/`` were verified on.

Prerequisites: an NVIDIA GPU with about 4 GiB free, torch built for CUDA, this project installed
(``pip install -e .``), run from a checkout of the repository (``bench/``, ``examples/``).

    python reproduce/wip/model_trace_replay_cuda.py [--out DIR]
    python reproduce/wip/model_trace_replay_cuda.py --device cpu --scale 16 --tokens 32 --out DIR   # quick check

Expected output: per phase, the CSVs ``examples/transformer_trace.py`` wrote (kernel type and
rows), then a line such as ``tokens 512: 24 rows in 14 kernel types; 23 passed, 1 skipped
(ConcatD row 3: unsupported), 0 failed`` (this version on an H100); then ``DIR/model_trace_replay_cuda.json`` (by default in a new temporary
directory) with the figures per phase under ``stats.phases``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from perf_plugin.report.environment import collect_env_spec
from perf_plugin.report.run_json import LLM_CONCURRENCY, finite_values, report_json

ROOT = Path(__file__).resolve().parents[2]
NAME = "model_trace_replay_cuda"


def phase(tokens: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    database = out / str(tokens) / "db"
    subprocess.run(
        [sys.executable, str(ROOT / "examples" / "transformer_trace.py"), "--model", args.model, "--device", args.device,
         "--dtype", args.dtype, "--tokens", str(tokens), "--layers", str(args.layers), "--iterations",
         str(args.iterations), "--scale", str(args.scale), "--out", str(database)],
        check=True, cwd=ROOT,
    )
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "bench", "--perf-database-path", str(database), "--perf-backend", args.device,
         "--perf-repeat-count", str(args.repeats), "-q", "-rs", "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    (database.parent / "pytest.log").write_text(completed.stdout + completed.stderr, encoding="utf-8")
    reports = sorted((database / "reports").glob("run_report_*.json"))
    if not reports:
        print(completed.stdout[-3000:], completed.stderr[-3000:], sep="\n")
        raise SystemExit(f"no run report under {database / 'reports'}: the replay did not finish")
    report = json.loads(reports[-1].read_text(encoding="utf-8"))
    kernel_types = Counter(result["kernel_type"] for result in report["results"])
    outcomes = report["outcome_counts"]
    not_passed = [{"kernel_type": r["kernel_type"], "csv_file": r["csv_file"], "row_line": r["row_line"],
                   "outcome": r["outcome"], "reason": r["reason"]} for r in report["results"] if r["outcome"] != "passed"]
    named = ", ".join(f"{r['kernel_type']} row {r['row_line']}: {r['outcome']}" for r in not_passed) or "none"
    print(f"tokens {tokens}: {report['ops_count']} rows in {len(kernel_types)} kernel types; {outcomes['passed']} passed, "
          f"{report['ops_count'] - outcomes['passed'] - outcomes['failed']} skipped ({named}), {outcomes['failed']} failed",
          flush=True)
    return {
        "tokens": tokens,
        "rows": report["ops_count"],
        "kernel_types": dict(sorted(kernel_types.items())),
        "outcome_counts": outcomes,
        "not_passed": not_passed,
        "pytest_exit_code": completed.returncode,
        "replay_stats": report["stats"],
        "database": str(database),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="512,16", help="comma-separated token counts, one phase each (default 512,16)")
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--scale", type=int, default=1, help="divide the model's widths (quick CPU checks)")
    parser.add_argument("--repeats", type=int, default=30, help="--perf-repeat-count (default 30)")
    parser.add_argument("--out", type=Path, help="output directory (default: a new temporary directory, kept)")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    out = args.out or Path(tempfile.mkdtemp(prefix=f"{NAME}_"))
    out.mkdir(parents=True, exist_ok=True)
    phases = [phase(int(tokens), args, out) for tokens in args.tokens.split(",") if tokens]
    rows = sum(p["rows"] for p in phases)
    passed = sum(p["outcome_counts"]["passed"] for p in phases)
    report = {
        "benchmark": f"perf_plugin.reproduce:{NAME}",
        "script": f"reproduce/wip/{NAME}.py",
        "workflow": "examples/transformer_trace.py + pytest bench",
        "pass_n": 1,
        "ops_count": rows,
        "elapsed_s": time.perf_counter() - started,
        "device_ids": [0] if args.device == "cuda" else [],
        "max_concurrency": 1,
        "llm_concurrency": LLM_CONCURRENCY,
        "env_spec": collect_env_spec(args.device, cwd=ROOT),
        "task_log_dir": str(out),
        "stats": {
            "total_ops": rows,
            "passed_ops": passed,
            "failed_ops": rows - passed,
            "pass_rate": round(passed / rows, 3) if rows else 0.0,
            "settings": {"model": args.model, "dtype": args.dtype, "layers": args.layers,
                         "iterations": args.iterations, "scale": args.scale, "repeats": args.repeats},
            "phases": phases,
        },
    }
    path = out / f"{NAME}.json"
    path.write_text(report_json(finite_values(report), indent=2) + "\n", encoding="utf-8")
    print(f"report: {path}")
    return 0 if all(p["pytest_exit_code"] == 0 for p in phases) else 1


if __name__ == "__main__":
    sys.exit(main())
