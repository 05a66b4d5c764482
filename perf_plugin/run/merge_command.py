"""``perfdb merge``: write shards' result files into one database.

    perfdb merge DATABASE_DIR RESULTS_FILE [RESULTS_FILE ...] [--dry-run] [--lock-timeout S]

Each RESULTS_FILE is what a run wrote with ``--perf-results-out`` (one per shard of a
``--perf-shard I/N`` run on hosts that share no file system); its results are written into
DATABASE_DIR's kernel CSVs as its run would have written them.  The files are left as they are.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from perf_plugin.database.command_args import add_write_arguments
from perf_plugin.run.merge import merge_results


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "merge", help="write shards' result files (--perf-results-out) into one database",
        description=(__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument("directory", type=Path, help="database directory to write into")
    parser.add_argument("files", type=Path, nargs="+", metavar="RESULTS_FILE", help="files written by --perf-results-out")
    add_write_arguments(parser, "say what each file holds, write nothing")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    for item in merge_results(args.directory, args.files, lock_timeout=args.lock_timeout, dry_run=args.dry_run):
        for note in item.notes:
            print(f"note: {note}")
        print(item.describe(args.dry_run))
    return 0
