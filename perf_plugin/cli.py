"""The ``perfdb`` console script: one entry point, a subcommand per offline step.

Subcommands live in their own modules and expose ``register(subparsers)``; each registers a
``func(args) -> int``.  User mistakes (DatabaseError, UsageError, a replay package that cannot
load: CatalogError) print one line and exit 2, with no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from perf_plugin.database.errors import DatabaseError
from perf_plugin.replay.registry import CatalogError
from perf_plugin.usage import UsageError

SUBCOMMAND_MODULES: tuple[str, ...] = (
    "perf_plugin.ingest.command",
    "perf_plugin.ingest.fia_runtime_command",
    "perf_plugin.grid.command",
    "perf_plugin.comm.command",
    "perf_plugin.comm.upgrade_command",
    "perf_plugin.database.command",
    "perf_plugin.run.resume_command",
    "perf_plugin.run.merge_command",
    "perf_plugin.lookup.command",
    "perf_plugin.lookup.peaks_command",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="perfdb", description="Operator performance database tools.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for module_name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # subcommand not built yet
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (DatabaseError, UsageError, CatalogError) as exc:
        print(f"perfdb {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader of the output went away (``perfdb ... | head``): stop quietly, as Unix
        # tools do; what was written to files stays written.  Later flushes go nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
