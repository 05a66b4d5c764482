"""``perfdb fia-runtime``: fill FusedInferAttentionScore rows with a serving run's runtime metadata.

    perfdb fia-runtime CSV_OR_DATABASE_DIR --jsonl fia_runtime_metadata.jsonl
                       [--output PATH] [--mode median|expand] [--metadata-tag TAG]

The successor of the seed's ``fill_fia_runtime_metadata.py`` (``--csv-path``, ``--jsonl-path``,
``--output-path``, ``--metadata-tag`` are accepted under those names too).  Given a database
directory, its ``FusedInferAttentionScore.csv`` is filled, under the database lock.  The record
format and the matching are described in ``perf_plugin.ingest.fia_runtime``.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from perf_plugin.database.lock import database_lock
from perf_plugin.ingest.fia_runtime import (
    DEFAULT_TAG,
    JSONL_NAME,
    KERNEL_TYPE,
    MODES,
    describe_key,
    fill_csv,
)
from perf_plugin.usage import UsageError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "fia-runtime",
        help=f"fill {KERNEL_TYPE} rows' Runtime columns from a serving run's {JSONL_NAME}",
        description=(__doc__ or "").split("\n\n")[0],
    )
    parser.add_argument("target", nargs="?", type=Path, metavar="CSV_OR_DATABASE_DIR",
                        help=f"{KERNEL_TYPE}.csv, or the database directory holding it")
    parser.add_argument("--csv-path", type=Path, help=argparse.SUPPRESS)  # the seed's name for the target
    parser.add_argument("--jsonl", "--jsonl-path", dest="jsonl", type=Path, required=True,
                        help=f"the JSONL the instrumented serving run wrote ({JSONL_NAME})")
    parser.add_argument("--output", "--output-path", dest="output", type=Path,
                        help="write the filled CSV here instead of over the input")
    parser.add_argument("--mode", choices=MODES, default="median",
                        help="median: fill each row with its median-KV-length call (default); expand: one row "
                             "per distinct length set, as the seed's tool does")  # fmt: skip
    parser.add_argument("--metadata-tag", default=DEFAULT_TAG,
                        help=f"value of 'Runtime metadata_completeness' on filled rows (default {DEFAULT_TAG})")
    parser.add_argument("--lock-timeout", type=float, default=60.0, metavar="S",
                        help="seconds to wait for the database lock (default 60)")
    parser.set_defaults(func=run)
    return parser


def _csv_path(args: argparse.Namespace) -> Path:
    if args.target is not None and args.csv_path is not None:
        raise UsageError("give the CSV either as the argument or as --csv-path, not both")
    target = args.target if args.target is not None else args.csv_path
    if target is None:
        raise UsageError(f"name the {KERNEL_TYPE}.csv (or its database directory) to fill")
    path = Path(target)
    if path.is_dir():
        path = path / f"{KERNEL_TYPE}.csv"
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    return path


def run(args: argparse.Namespace) -> int:
    csv_path = _csv_path(args)
    # Writing over a database file: hold its directory's lock as write-back does.
    lock: contextlib.AbstractContextManager[object] = (
        database_lock(csv_path.parent, args.lock_timeout) if args.output is None else contextlib.nullcontext()
    )
    with lock:
        result = fill_csv(csv_path, args.jsonl, args.output, args.mode, args.metadata_tag)
    target = args.output if args.output is not None else csv_path
    print(f"{csv_path}: filled {result.matched} of {result.rows} row(s) from {result.calls} call(s) in {args.jsonl}"
          + (f", appended {result.appended} row(s) (expand)" if result.appended else "")
          + (f"; wrote {target}" if result.matched else "; nothing written"))  # fmt: skip
    if result.unused_example is not None:
        print(f"{result.unused_calls} call(s) matched no row, e.g. line {result.unused_example.line}: "
              f"{describe_key(result.unused_example.join_key)}")  # fmt: skip
    return 0
