"""``perfdb restore-quarantine``: put rows set aside by write-back back into their kernel CSVs.

    perfdb restore-quarantine DATABASE_DIR [--kernel-type TYPE ...] [--dry-run]

Every ``{KernelType}.quarantine.csv`` in DATABASE_DIR (or only those of the kernel types named)
has its rows put back into ``{KernelType}.csv``, each at the line it left, without the
quarantine's own columns (reason, timestamp, line), and is then removed.  Rows of a quarantine
file written before it recorded their lines are appended at the end, and the command says so.  A
row the kernel CSV already holds, cell for cell, is not added twice, so the command can be
repeated or re-run after an interruption.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from perf_plugin.database.command_args import add_write_arguments
from perf_plugin.database.quarantine import restore


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "restore-quarantine",
        help="put quarantined rows back into their kernel CSVs",
        description=(__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument("directory", type=Path, help="database directory holding *.quarantine.csv files")
    parser.add_argument("--kernel-type", action="append", default=[], metavar="TYPE",
                        help="restore only this kernel type's quarantine file (repeatable)")
    add_write_arguments(parser, "say what would be restored, change nothing")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    files = restore(args.directory, args.kernel_type, dry_run=args.dry_run, lock_timeout=args.lock_timeout)
    verb = "would restore" if args.dry_run else "restored"
    for item in files:
        note = f" ({item.already_there} already there)" if item.already_there else ""
        if item.at_the_end:
            note += (
                f"; {item.at_the_end} of them appended at the end: {item.quarantine_file.name} was written"
                " before quarantine files recorded each row's line"
            )
        print(f"{item.quarantine_file.name}: {verb} {item.restored} row(s) into {item.kernel_csv.name}{note}")
    if not files:
        print(f"{args.directory}: no quarantine files")
    return 0
