"""Grouped GEMMs under uneven routing: in-model time, replay with the recorded routing, replay
with even groups, per routing skew.

For each ``--skews`` value, a Mixtral-shaped MoE layer (``examples/moe_trace.py``: hidden 4096,
expert width 14336, 8 experts, top-2; 512 tokens by default, so 128 rows per expert when even)
runs ``--iterations`` times under ``torch.profiler`` and ``perf_plugin.capture``.  The trace is
ingested twice: with its values file (rows carry the routing, ``Input Values``) and without it
(rows replay even groups).  ``pytest bench -k GroupedMatmul`` replays both databases, and the
table gives, per GEMM (gate+up, down): the busiest expert's rows over the mean, the in-model
time, and each replay's time over it.

It also profiles the layer at the first skew with and without the capture and prints how much
the capture moved the in-model kernel times (it should not move them).

Prerequisites: torch with CUDA (BF16 ``torch._grouped_mm`` needs sm90+), this project installed.

    python benchmarks/grouped_gemm_routing.py --out OUTDIR
    python benchmarks/grouped_gemm_routing.py --device cpu --tokens 64 --hidden 128 --intermediate 64 --out /tmp/g

Expected output: one line per skew and GEMM, ``skew  gemm  busiest/mean  in-model us  recorded/in-model
even/in-model``, then the capture's effect, and ``OUTDIR/grouped_gemm_routing.json``.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def moe_script() -> Any:
    spec = importlib.util.spec_from_file_location("moe_trace", ROOT / "examples" / "moe_trace.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def replay(db: Path, device: str, repeats: int) -> None:
    command = [sys.executable, "-m", "pytest", str(ROOT / "bench" / "test_kernels.py"), "--perf-database-path", str(db),
               "--perf-backend", device, "--perf-repeat-count", str(repeats), "--perf-warmup-count", "5",
               "-k", "GroupedMatmul", "-q", "-p", "no:cacheprovider", "--no-header"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    print(f"  pytest bench {db.name}: {done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]}")


def gemm_rows(db: Path) -> list[dict[str, str]]:
    with (db / "GroupedMatmul.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def measure_skew(script: Any, args: argparse.Namespace, skew: float) -> list[dict[str, Any]]:
    import torch

    from perf_plugin.ingest.pipeline import ingest_path

    shape = script.MoeShape(args.hidden, args.intermediate, args.experts, args.top_k)
    layer = script.build_layer(shape, args.device, skew)
    x = torch.randn(args.tokens, args.hidden, generator=torch.Generator().manual_seed(1)).to(args.device, torch.bfloat16)
    sizes = script.rows_per_expert(layer, x)
    out = args.out / f"skew_{skew:g}"
    shutil.rmtree(out, ignore_errors=True)
    (out / "bare").mkdir(parents=True)
    trace = out / "trace.json"
    script.profile_layer(layer, x, trace, args.iterations)
    shutil.copy(trace, out / "bare" / "trace.json")  # the same trace, no values file beside it
    ingest_path(trace, out / "db_recorded")
    ingest_path(out / "bare" / "trace.json", out / "db_even")
    for db in (out / "db_recorded", out / "db_even"):
        replay(db, args.device, args.repeats)
    recorded, even = gemm_rows(out / "db_recorded"), gemm_rows(out / "db_even")
    results = []
    for name, rec, ev in zip(("gate_up", "down"), recorded, even):
        in_model = float(rec["Profiling Average Duration(us)"])
        results.append({
            "skew": skew, "gemm": name, "rows_per_expert": sizes,
            "busiest_over_mean": max(sizes) / (sum(sizes) / len(sizes)),
            "in_model_us": in_model,
            "recorded_ratio": float(rec["Average Duration(us)"]) / in_model if rec.get("Average Duration(us)") else None,
            "even_ratio": float(ev["Average Duration(us)"]) / float(ev["Profiling Average Duration(us)"])
            if ev.get("Average Duration(us)") else None,
        })
    return results


def capture_effect(script: Any, args: argparse.Namespace) -> dict[str, float]:
    """Kernel time per GEMM row in the model, profiled with and without the capture."""
    import torch

    from perf_plugin.ingest.pipeline import ingest_path

    shape = script.MoeShape(args.hidden, args.intermediate, args.experts, args.top_k)
    layer = script.build_layer(shape, args.device, args.skews[0])
    x = torch.randn(args.tokens, args.hidden, generator=torch.Generator().manual_seed(1)).to(args.device, torch.bfloat16)
    totals = {}
    for label, capture in (("without", False), ("with", True), ("without_again", False)):
        folder = args.out / f"capture_{label}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        script.profile_layer(layer, x, folder / "trace.json", args.iterations, capture=capture)
        rows = ingest_path(folder / "trace.json", None).rows
        totals[label] = sum(r.average * r.count for r in rows)
    return {
        "kernel_us_without": totals["without"],
        "kernel_us_with": totals["with"],
        "with_over_without": totals["with"] / totals["without"],
        "without_run_to_run": totals["without_again"] / totals["without"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--intermediate", type=int, default=14336)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--skews", type=lambda s: [float(v) for v in s.split(",")], default=[0.0, 0.5, 1.0, 2.0])
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    script = moe_script()
    results = []
    for skew in args.skews:
        results.extend(measure_skew(script, args, skew))
    print(f"{'skew':>5} {'gemm':>8} {'busiest/mean':>12} {'in-model us':>11} {'recorded/in':>11} {'even/in':>8}  rows per expert")
    for r in results:
        rec = f"{r['recorded_ratio']:.3f}" if r["recorded_ratio"] else "-"
        ev = f"{r['even_ratio']:.3f}" if r["even_ratio"] else "-"
        print(f"{r['skew']:>5g} {r['gemm']:>8} {r['busiest_over_mean']:>12.2f} {r['in_model_us']:>11.1f} {rec:>11} {ev:>8}  "
              f"{r['rows_per_expert']}")
    effect = capture_effect(script, args)
    print(f"capture: kernel time in the model {effect['kernel_us_with']:.1f} us with it, {effect['kernel_us_without']:.1f} "
          f"without (ratio {effect['with_over_without']:.4f}; two runs without: {effect['without_run_to_run']:.4f})")
    (args.out / "grouped_gemm_routing.json").write_text(json.dumps({"results": results, "capture": effect,
                                                                    "settings": {k: str(v) for k, v in vars(args).items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
