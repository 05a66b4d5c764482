"""The ``perfdb`` console script: one entry point, a subcommand per offline step.

Subcommands live in their own modules and expose ``register(subparsers)``; each registers a
``func(args) -> int``.  User mistakes (DatabaseError, UsageError, a replay package that cannot
load: CatalogError) print one line and exit 2, with no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from perf_plugin.database.errors import DatabaseError
from perf_plugin.replay.registry import CatalogError

SUBCOMMAND_MODULES: tuple[str, ...] = (
    "perf_plugin.ingest.command",
    "perf_plugin.grid.command",
    "perf_plugin.comm.command",
)


class UsageError(Exception):
    """A mistake in how a command was called (conflicting or missing arguments)."""


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


if __name__ == "__main__":
    # Run as ``python -m perf_plugin.cli`` this module is ``__main__``; the subcommands raise the
    # UsageError of ``perf_plugin.cli``, so call that module's main to catch the same class.
    from perf_plugin.cli import main as package_main

    sys.exit(package_main())
