"""``perfdb grid``: widen a database directory with generated shapes (``generate_shape_grid.py``).

    perfdb grid --data-dir DIR [--target-models dsv3,qwen3-32b] [--rows 1000] [--seed 0]
                [--max-hbm-gb 32] [--kernel-types MatMulV2,Add] [--config grid.yaml] [--dry-run]

The directory is ``--data-dir`` (alias ``--database-path``) or the one derived from
``--device/--vllm-version/--torch-version/--cann-version`` (CUDA: ``--cuda-version``) under
``--database-root``; a derived path is printed.  Generated rows have no durations: they are
filled by a replay run (``pytest bench --update-mode missing-only``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from perf_plugin.database.kernel_types import validate_kernel_type
from perf_plugin.database.location_args import add_location_arguments, resolve_location
from perf_plugin.grid.config import GridConfig, load_config
from perf_plugin.grid.memory import budget_bytes
from perf_plugin.grid.models import MODELS, parse_model_list
from perf_plugin.grid.runner import GridRequest, KernelReport, run_grid
from perf_plugin.usage import UsageError

def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser(
        "grid",
        help="append generated shape rows (theory grid) to a database directory",
        description=(
            "Append rows with shapes real models run (GEMM projections, attention, MoE, norms, "
            "element-wise) to the kernel CSVs of a database directory, within a device-memory "
            "budget.  The rows carry no durations; a replay run measures them."
        ),
    )
    add_location_arguments(parser)

    grid = parser.add_argument_group("grid")
    grid.add_argument("--target-models", metavar="NAMES",
                      help="comma-separated models whose shapes to generate (e.g. dsv3,qwen3-32b); "
                           "GEMMs are restricted to the (N, K) pairs these models need at their TP "
                           "sizes.  Default: every known model plus a generic GEMM grid")
    grid.add_argument("--kernel-types", metavar="TYPES",
                      help="comma-separated kernel types to expand (default: every routed kernel "
                           "type that has a CSV in the directory); a named type without a CSV gets one")
    grid.add_argument("--rows", type=int, default=1000,
                      help="at most this many new rows per CSV, sampled with --seed (0 = all; default: %(default)s)")
    grid.add_argument("--seed", type=int, default=0, help="seed of the row sampling (default: %(default)s)")
    grid.add_argument("--max-hbm-gb", type=float, default=32.0, metavar="GB",
                      help="device-memory budget in GiB; rows whose tensors and workspace exceed it "
                           "are dropped and counted (default: %(default)s)")
    grid.add_argument("--config", metavar="YAML", help="routing config (default: the shipped grid/config.yaml)")
    grid.add_argument("--dry-run", action="store_true", help="print the counts, write nothing")
    grid.add_argument("--list-models", action="store_true", help="list the known models and exit")
    parser.set_defaults(func=run)


def _usage_error(message: str) -> Exception:
    return UsageError(message)


def parse_kernel_types(text: str | None, config: GridConfig) -> tuple[str, ...]:
    if not text:
        return ()
    chosen: list[str] = []
    for part in text.split(","):
        name = part.strip()
        if not name:
            continue
        validate_kernel_type(name)
        if name not in config.kernels:
            raise _usage_error(
                f"kernel type {name!r} has no grid route in {config.path.name}; "
                f"routed: {', '.join(sorted(config.kernels))}"
            )
        if name not in chosen:
            chosen.append(name)
    return tuple(chosen)


def _print_models() -> None:
    for model in MODELS:
        aliases = ", ".join(model.aliases)
        eps = f", ep {','.join(map(str, model.ep_sizes))}" if model.ep_sizes else ""
        print(f"{model.name:18} tp {','.join(map(str, model.tp_sizes))}{eps}  aliases: {aliases}")
        print(f"{'':18} {model.source}")


def _print_reports(reports: Sequence[KernelReport], dry_run: bool) -> None:
    header = ("kernel type", "candidates", "skipped", "over budget", "repeated", "in file", "available",
              "would write" if dry_run else "written")
    print(f"{header[0]:28} " + " ".join(f"{h:>11}" for h in header[1:]))
    for r in reports:
        # each expert load or KV length distribution of a shape is a candidate of its own
        candidates = r.evaluated - r.filtered + r.variants
        values = (candidates, r.skipped, r.over_budget, r.repeated, r.in_file, r.available, r.written)
        note = " (new file)" if r.created and r.written else ""
        print(f"{r.kernel_type:28} " + " ".join(f"{v:>11}" for v in values) + note)
    print("  (candidates = skipped + over budget + repeated [same shape from another model or TP size] "
          "+ in file + available)")
    for r in reports:
        for reason in r.skip_reasons:
            print(f"  {r.kernel_type}: skipped {reason}")
        if r.default_structure_patterns:
            print(f"  {r.kernel_type}: no source row fits pattern(s) {', '.join(r.default_structure_patterns)}; "
                  "default structure used")


def run(args: argparse.Namespace) -> int:
    if args.list_models:
        _print_models()
        return 0
    if args.rows < 0:
        raise _usage_error(f"--rows must be 0 (no limit) or positive, got {args.rows}")
    if not args.max_hbm_gb > 0:
        raise _usage_error(f"--max-hbm-gb must be positive, got {args.max_hbm_gb}")
    config = load_config(args.config)
    models = parse_model_list(args.target_models)
    kernel_types = parse_kernel_types(args.kernel_types, config)
    location = resolve_location(args)
    print(f"perfdb grid: database directory {location.directory}" + (" (derived)" if location.derived else ""))
    request = GridRequest(
        directory=location.directory,
        config=config,
        models=models or MODELS,
        restricted=bool(models),
        rows=args.rows,
        seed=args.seed,
        budget=budget_bytes(args.max_hbm_gb),
        kernel_types=kernel_types,
        dry_run=args.dry_run,
    )
    reports = run_grid(request)
    if not reports:
        print(
            f"perfdb grid: no CSV in {location.directory} has a grid route; name kernel types with "
            f"--kernel-types (routed: {', '.join(sorted(config.kernels))})"
        )
        return 0
    _print_reports(reports, args.dry_run)
    total = sum(r.written for r in reports)
    files = sum(1 for r in reports if r.written)
    verb = "would write" if args.dry_run else "wrote"
    print(f"perfdb grid: {verb} {total} rows to {files} CSV(s) (budget {args.max_hbm_gb:g} GiB, seed {args.seed})")
    return 0
