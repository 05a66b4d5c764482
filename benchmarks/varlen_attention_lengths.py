"""Variable-length attention under uneven request lengths: in-model time, replay with the recorded
lengths, replay with even lengths, per length distribution.

A packed prefill of ``--requests`` requests (``--tokens`` in all) runs through ``--layers``
Llama-3.1-8B-shaped attention blocks (RMSNorm, QKV projection, causal
``torch.nn.attention.varlen.varlen_attn`` with 32 query and 8 KV heads of 128, output
projection, residual), ``--iterations`` times under ``torch.profiler`` and
``perf_plugin.capture``.  Per ``--distributions`` entry the requests' lengths are:

* ``even``: equal;
* ``spreadR``: rising linearly from the shortest to R times the shortest;
* ``maxmeanR``: one request R times the mean, the others equal;
* ``zipfS``: proportional to 1 / rank^S.

The trace is ingested twice, with its values file (the ``FlashAttentionScore`` row carries the
lengths, ``Input Values``) and without it (the row replays even lengths); ``pytest bench -k
FlashAttentionScore`` replays both databases.  The table gives, per distribution, the longest
request over the mean, the causal work (sum of squared lengths) over the even split's, the
in-model kernel time, and each replay's time over it.  Then the capture's effect on the model's
kernel time and the model's own run-to-run spread (two profiles without the capture).

Prerequisites: torch with CUDA (the flash varlen kernel), this project installed.

    python benchmarks/varlen_attention_lengths.py --out OUTDIR

Expected output: one line per distribution, ``distribution  longest/mean  work/even  in-model us
recorded/in-model  even/in-model``, the capture's effect, and ``OUTDIR/varlen_attention_lengths.json``.
"""

from __future__ import annotations

import argparse
import csv
import inspect
import json
import re
import shutil
import subprocess
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def lengths_of(name: str, tokens: int, requests: int) -> list[int]:
    """The requests' lengths for a distribution name (``even``, ``spread4``, ``maxmean4``, ``zipf1``)."""
    kind, value = re.fullmatch(r"([a-z]+)([0-9.]*)", name).groups()  # type: ignore[union-attr]
    ratio = float(value) if value else 1.0
    if kind == "even":
        weights = [1.0] * requests
    elif kind == "spread":
        weights = [1 + (ratio - 1) * i / max(requests - 1, 1) for i in range(requests)]
    elif kind == "maxmean":
        rest = (requests - ratio) / (requests - 1)
        weights = [ratio] + [rest] * (requests - 1)
    elif kind == "zipf":
        weights = [1 / (i + 1) ** ratio for i in range(requests)]
    else:
        raise SystemExit(f"unknown distribution {name!r}: even, spreadR, maxmeanR, zipfS")
    lengths = [max(1, round(tokens * w / sum(weights))) for w in weights]
    lengths[0] += tokens - sum(lengths)
    return lengths


def build_blocks(args: argparse.Namespace) -> Any:
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d, heads, kv = args.head_dim, args.heads, args.kv_heads
            self.norm = torch.nn.RMSNorm(args.hidden)
            self.qkv = torch.nn.Linear(args.hidden, (heads + 2 * kv) * d, bias=False)
            self.out = torch.nn.Linear(heads * d, args.hidden, bias=False)
            self.split = (heads * d, kv * d, kv * d)

        def forward(self, x: Any, cu: Any, longest: int) -> Any:
            from torch.nn.attention.varlen import varlen_attn

            q, k, v = self.qkv(self.norm(x)).split(self.split, dim=-1)
            shape = (x.shape[0], -1, args.head_dim)
            parameters = inspect.signature(varlen_attn).parameters  # releases spell causal and GQA differently
            options: dict[str, Any] = {"is_causal": True} if "is_causal" in parameters else {"window_size": (-1, 0)}
            if "enable_gqa" in parameters:
                options["enable_gqa"] = True
            attended = varlen_attn(q.reshape(shape), k.reshape(shape), v.reshape(shape), cu, cu, longest, longest,
                                   **options)
            return x + self.out(attended.reshape(x.shape[0], -1))

    torch.manual_seed(0)
    return torch.nn.ModuleList(Block() for _ in range(args.layers)).to(args.device, torch.bfloat16).eval()


def profile_blocks(blocks: Any, lengths: list[int], args: argparse.Namespace, trace: Path, capture: bool) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from perf_plugin.capture import capture_input_values

    x = torch.randn(sum(lengths), args.hidden, device=args.device, dtype=torch.bfloat16)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=args.device)

    def step() -> None:
        h = x
        for block in blocks:
            h = block(h, cu, max(lengths))

    with torch.no_grad():
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            with capture_input_values(trace.with_name(trace.stem + ".values.json")) if capture else nullcontext():
                for _ in range(args.iterations):
                    step()
            torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))


def replay(db: Path, args: argparse.Namespace) -> None:
    command = [sys.executable, "-m", "pytest", str(ROOT / "bench" / "test_kernels.py"), "--perf-database-path", str(db),
               "--perf-backend", args.device, "--perf-repeat-count", str(args.repeats), "--perf-warmup-count", "5",
               "-k", "FlashAttentionScore", "-q", "-p", "no:cacheprovider", "--no-header"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    print(f"  pytest bench {db.name}: {done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]}")


def attention_row(db: Path) -> dict[str, str]:
    with (db / "FlashAttentionScore.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    if len(rows) != 1:
        raise SystemExit(f"{db}: expected one FlashAttentionScore row, found {len(rows)}")
    return rows[0]


def ratio(row: dict[str, str], in_model: float) -> float | None:
    measured = row.get("Average Duration(us)", "")
    return float(measured) / in_model if measured else None


def measure(name: str, blocks: Any, args: argparse.Namespace) -> dict[str, Any]:
    from perf_plugin.ingest.pipeline import ingest_path

    lengths = lengths_of(name, args.tokens, args.requests)
    out = args.out / name
    shutil.rmtree(out, ignore_errors=True)
    (out / "bare").mkdir(parents=True)
    trace = out / "trace.json"
    profile_blocks(blocks, lengths, args, trace, capture=True)
    shutil.copy(trace, out / "bare" / "trace.json")  # the same trace, no values file beside it
    ingest_path(trace, out / "db_recorded")
    ingest_path(out / "bare" / "trace.json", out / "db_even")
    for db in (out / "db_recorded", out / "db_even"):
        replay(db, args)
    recorded, even = attention_row(out / "db_recorded"), attention_row(out / "db_even")
    in_model = float(recorded["Profiling Average Duration(us)"])
    even_work = sum(n * n for n in lengths_of("even", args.tokens, args.requests))
    return {
        "distribution": name, "lengths": lengths, "longest_over_mean": max(lengths) * len(lengths) / sum(lengths),
        "work_over_even": sum(n * n for n in lengths) / even_work, "in_model_us": in_model,
        "recorded_ratio": ratio(recorded, in_model), "even_ratio": ratio(even, in_model),
        "values": recorded.get("Input Values", ""),
    }


def capture_effect(blocks: Any, args: argparse.Namespace) -> dict[str, float]:
    """The model's kernel time, profiled with and without the capture (and without it again)."""
    from perf_plugin.ingest.pipeline import ingest_path

    lengths = lengths_of(args.distributions[-1], args.tokens, args.requests)
    totals = {}
    for label, capture in (("without", False), ("with", True), ("without_again", False)):
        folder = args.out / f"capture_{label}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        profile_blocks(blocks, lengths, args, folder / "trace.json", capture)
        totals[label] = sum(r.average * r.count for r in ingest_path(folder / "trace.json", None).rows)
    return {"kernel_us_without": totals["without"], "kernel_us_with": totals["with"],
            "with_over_without": totals["with"] / totals["without"],
            "without_run_to_run": totals["without_again"] / totals["without"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--distributions", type=lambda s: s.split(","), default=["even", "spread4", "maxmean4", "zipf1"])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    blocks = build_blocks(args)
    results = [measure(name, blocks, args) for name in args.distributions]
    print(f"{'distribution':>12} {'longest/mean':>12} {'work/even':>9} {'in-model us':>11} {'recorded/in':>11} "
          f"{'even/in':>8}  lengths")
    for r in results:
        rec = f"{r['recorded_ratio']:.3f}" if r["recorded_ratio"] else "-"
        ev = f"{r['even_ratio']:.3f}" if r["even_ratio"] else "-"
        print(f"{r['distribution']:>12} {r['longest_over_mean']:>12.2f} {r['work_over_even']:>9.2f} "
              f"{r['in_model_us']:>11.1f} {rec:>11} {ev:>8}  {r['lengths']}")
    effect = capture_effect(blocks, args)
    print(f"capture: kernel time in the model {effect['kernel_us_with']:.1f} us with it, {effect['kernel_us_without']:.1f} "
          f"without (ratio {effect['with_over_without']:.4f}; two runs without: {effect['without_run_to_run']:.4f})")
    (args.out / "varlen_attention_lengths.json").write_text(json.dumps(
        {"results": results, "capture": effect, "settings": {k: str(v) for k, v in vars(args).items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
