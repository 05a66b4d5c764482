"""Arguments every ``perfdb`` subcommand that writes a database takes the same way."""

from __future__ import annotations

import argparse

from perf_plugin.database.lock import DEFAULT_LOCK_TIMEOUT_S


def add_write_arguments(parser: argparse.ArgumentParser, dry_run_help: str) -> None:
    """``--dry-run`` (say what would change, write nothing) and ``--lock-timeout``."""
    parser.add_argument("--dry-run", action="store_true", help=dry_run_help)
    parser.add_argument("--lock-timeout", type=float, default=DEFAULT_LOCK_TIMEOUT_S, metavar="S",
                        help=f"seconds to wait for the database lock (default {DEFAULT_LOCK_TIMEOUT_S:g})")
