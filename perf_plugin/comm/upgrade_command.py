"""``perfdb upgrade-comm``: bring collective databases written before the reader-facing contract up to it.

    perfdb upgrade-comm ROOT [--dry-run]

ROOT is a database root (``database/data``) or any directory under it; every directory below
that holds ``hcom_*.csv`` files is upgraded in place (see ``perf_plugin.comm.upgrade``):
``hccl/{cann}`` becomes ``hccl/v{cann}``, rows get the Ascend reader's ``message_bytes``, a
``nccl_tests_bytes`` cell and the Ascend dtype spelling.  ``--dry-run`` lists what would change
and changes nothing.  A second run finds nothing to do.
"""

from __future__ import annotations

import argparse

from perf_plugin.comm.upgrade import UpgradePlan, apply_upgrade, plan_upgrade

PREFIX = "upgrade-comm:"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "upgrade-comm",
        help="upgrade collective CSVs and hccl/ directories to the Ascend reader's layout, in place",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("root", help="database root (database/data) or a directory under it")
    parser.add_argument("--dry-run", action="store_true", help="list what would change, change nothing")
    parser.set_defaults(func=run)
    return parser


def describe(plan: UpgradePlan) -> list[str]:
    """One line per action, in the order they are taken."""
    lines = []
    for directory in plan.directories:
        for change in directory.changes:
            lines.append(f"{PREFIX} rewrite {change.path}: {change.summary()}")
        for path in directory.foreign:
            lines.append(f"{PREFIX} leave {path} (not a file this project writes)")
        if directory.moves:
            lines.append(f"{PREFIX} move {directory.directory} -> {directory.target}")
    return lines


def _counts(plan: UpgradePlan, done: bool) -> str:
    files = sum(len(d.changes) for d in plan.directories)
    moves = sum(d.moves for d in plan.directories)
    rewrite, move = ("rewritten", "moved") if done else ("to rewrite", "to move")
    return (
        f"{files} file{'s' if files != 1 else ''} {rewrite}, "
        f"{moves} director{'ies' if moves != 1 else 'y'} {move}"
    )


def run(args: argparse.Namespace) -> int:
    plan = plan_upgrade(args.root)
    for line in describe(plan):
        print(line)
    if not plan.needed:
        print(f"{PREFIX} nothing to upgrade under {plan.root}")
        return 0
    if args.dry_run:
        print(f"{PREFIX} {_counts(plan, done=False)} (dry run: nothing changed)")
        return 0
    apply_upgrade(plan)
    print(f"{PREFIX} {_counts(plan, done=True)}")
    return 0
