"""``perfdb resume``: write back what runs that never finished measured.

    perfdb resume DATABASE_DIR [--dry-run] [--lock-timeout S]

Every journal in DATABASE_DIR/.perf-journal whose run is no longer going (a controller killed,
a power cut, a write-back that failed) has its results written into the kernel CSVs as its run
would have written them (its update mode, its start time in the timestamp column), then is
removed.  A journal whose run is still going is left alone.  Running it again after an
interruption writes the same cells again; ``pytest bench --update-mode missing-only`` then
measures the rows the interrupted run did not reach.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from perf_plugin.database.command_args import add_write_arguments
from perf_plugin.run.journal import journal_dir
from perf_plugin.run.recovery import recover_journals
from perf_plugin.usage import UsageError


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "resume",
        help="write back the results of runs that did not finish",
        description=(__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument("directory", type=Path, help="database directory (the one holding .perf-journal)")
    add_write_arguments(parser, "say what each journal holds, write nothing")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    directory: Path = args.directory
    if not directory.is_dir():
        raise UsageError(f"{directory}: no such database directory")
    recovered = recover_journals(directory, lock_timeout=args.lock_timeout, dry_run=args.dry_run)
    for item in recovered:
        for note in item.notes:
            print(f"note: {note}")
        line = item.describe()
        print(f"{line} (dry run: nothing written)" if args.dry_run and item.written else line)
    if not recovered:
        print(f"{directory}: no unfinished runs ({journal_dir(directory)} holds no journal)")
    return 0
