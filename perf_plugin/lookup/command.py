"""``perfdb lookup``: durations for shapes, one query on the command line or a CSV of them.

    perfdb lookup --database-path DIR --kernel-type MatMulV2 --input-shapes "4096,1024;1024,2048" --input-dtypes "DT_BF16;DT_BF16"
    perfdb lookup --database-path DIR --queries queries.csv --out answers.csv
    perfdb lookup --database-path DIR --queries queries.csv --out answers.csv --policy
    perfdb lookup --database-path DIR --collective all_reduce --message-bytes 2097152 --devices 8 [--tier 1]

``--policy`` adds the answer ``op_mapping.yaml``'s ``interpolation_policy`` gives from the same
files (the Ascend performance model's reading; ``--op-mapping FILE`` when the directory has none).

A queries CSV has the columns ``Kernel Type``, ``Input Shapes``, ``Input Data Types`` and, where
wanted, ``Input Formats`` and ``Output Shapes`` (cells as a database row writes them); the
answers CSV repeats them and adds ``Duration(us)``, ``Provenance``, ``Rows``, ``Method`` and
``Reason``.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from perf_plugin.database.atomic import atomic_write_text
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.location_args import add_location_arguments, resolve_location
from perf_plugin.database.shapes import parse_shape_cell, split_slots
from perf_plugin.database.signature import normalise_dtype, normalise_format
from perf_plugin.lookup.answer import Answer, Query
from perf_plugin.lookup.api import lookup
from perf_plugin.usage import UsageError

QUERY_COLUMNS = ("Kernel Type", "Input Shapes", "Input Data Types", "Input Formats", "Output Shapes",
                 "Output Data Types", "Input Values")
ATTRIBUTE_COLUMNS = frozenset({"avg_seq_len", "Avg Seq Len", "Input Strides", "Op Arguments"})
ANSWER_COLUMNS = ("Duration(us)", "Provenance", "Rows", "Method", "Reason")
POLICY_COLUMNS = ("Policy Duration(us)", "Policy Provenance", "Policy Method", "Policy Reason")


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = subparsers.add_parser("lookup", help="the duration of a kernel at given shapes, exact or interpolated",
                                   description=__doc__.split("\n\n")[0])
    add_location_arguments(parser)  # the directory as given (--database-path), or derived as a run derives it
    parser.add_argument("--kernel-type", help="the kernel type (its CSV's name)")
    parser.add_argument("--input-shapes", help='as a row writes them, e.g. "4096,1024;1024,2048"')
    parser.add_argument("--input-dtypes", help='e.g. "DT_BF16;DT_BF16"')
    parser.add_argument("--input-formats", default="", help="optional, e.g. ND;FRACTAL_NZ")
    parser.add_argument("--output-shapes", default="", help="optional")
    parser.add_argument("--input-values", default="",
                        help='optional, as a row writes them, e.g. a grouped GEMM\'s cumulative rows per expert ";;;;;;;96,256,384,512"')
    parser.add_argument("--queries", type=Path, help="a CSV of queries (instead of one on the command line)")
    collective = parser.add_argument_group("a collective (instead of a kernel)")
    collective.add_argument("--collective", help="all_reduce, all_gather, reduce_scatter, alltoall (or hcom_<op>_)")
    collective.add_argument("--message-bytes", type=int, help="the message size as the Ascend reader counts it")
    collective.add_argument("--devices", type=int, help="the ranks it spans (num_devices)")
    collective.add_argument("--tier", default="", help="topology tier (default: any)")
    collective.add_argument("--dtype", default="", help="e.g. DT_BF16 (default: any)")
    parser.add_argument("--out", type=Path, help="where the answers CSV goes (with --queries)")
    parser.add_argument("--policy", action="store_true",
                        help="also answer as op_mapping.yaml's interpolation_policy does (the Ascend performance model)")
    parser.add_argument("--op-mapping", type=Path, help="the policy's op_mapping.yaml (default: the directory's)")
    parser.set_defaults(func=run)


def make_query(cells: dict[str, str]) -> Query:
    """A query from row-style cells; DatabaseError naming the column that does not parse."""
    for column in QUERY_COLUMNS[:3]:
        if not cells.get(column, "").strip():
            raise DatabaseError("is empty", column=column)
    shapes = {}
    for column in ("Input Shapes", "Output Shapes"):
        try:
            shapes[column] = tuple(parse_shape_cell(cells.get(column, "")))
        except DatabaseError as exc:
            raise exc.located(column=column) from None
    return Query(
        cells["Kernel Type"].strip(), shapes["Input Shapes"],
        tuple(normalise_dtype(t) for t in split_slots(cells["Input Data Types"])),
        tuple(normalise_format(t) for t in split_slots(cells.get("Input Formats", ""))),
        shapes["Output Shapes"],
        tuple(normalise_dtype(t) for t in split_slots(cells.get("Output Data Types", "")) if t.strip()),
        cells.get("Input Values", "").strip().strip('"'),
        tuple((column, cell) for column, cell in cells.items() if is_attribute(column) and cell and cell.strip()),
    )


def is_attribute(column: str) -> bool:
    """Columns a query passes on to the kernel family: the runtime metadata of attention rows."""
    return column.startswith("Runtime ") or column in ATTRIBUTE_COLUMNS


def answer_cells(answer: Answer) -> dict[str, str]:
    return {
        "Duration(us)": "" if answer.duration_us is None else f"{answer.duration_us:.6g}",
        "Provenance": answer.provenance,
        "Rows": ";".join(map(str, answer.rows)),
        "Method": answer.column,
        "Reason": answer.reason,
    }


def _policy(database: Path, query: Query, mapping: Path | None) -> Answer:
    from perf_plugin.lookup.policy import lookup_by_policy

    return lookup_by_policy(database, query, mapping)


def policy_cells(answer: Answer) -> dict[str, str]:
    cells = answer_cells(answer)
    return {"Policy Duration(us)": cells["Duration(us)"], "Policy Provenance": cells["Provenance"],
            "Policy Method": cells["Method"], "Policy Reason": cells["Reason"]}


def _batch(database: Path, queries: Path, out: Path, policy: bool, mapping: Path | None) -> int:
    try:
        with queries.open(newline="") as handle:
            records = list(csv.DictReader(handle))
    except OSError as exc:
        raise DatabaseError(f"cannot read: {exc.strerror}", path=queries) from None
    answered = []
    for line, cells in enumerate(records, start=2):
        try:
            query = make_query(cells)
        except DatabaseError as exc:
            raise exc.located(path=queries, row=line) from None
        record = {**{c: cells.get(c, "") for c in QUERY_COLUMNS}, **answer_cells(lookup(database, query))}
        if policy:
            record.update(policy_cells(_policy(database, query, mapping)))
        answered.append(record)
    atomic_write_text(out, _csv_text(answered, policy))
    print(f"{len(answered)} answer(s): {sum(1 for a in answered if a['Duration(us)'])} with a duration -> {out}")
    return 0


def _csv_text(records: list[dict[str, str]], policy: bool) -> str:
    import io

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(QUERY_COLUMNS + ANSWER_COLUMNS + (POLICY_COLUMNS if policy else ())), lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return buffer.getvalue()


def _collective(args: argparse.Namespace) -> int:
    from perf_plugin.lookup.answer import CollectiveQuery
    from perf_plugin.lookup.collectives import lookup_collective

    if args.message_bytes is None or args.devices is None or args.message_bytes < 0 or args.devices < 1:
        raise UsageError("--collective needs --message-bytes (>= 0) and --devices (>= 1)")
    answer = lookup_collective(args.database_path, CollectiveQuery(args.collective, args.message_bytes, args.devices,
                                                                   args.tier, args.dtype))
    print(answer.line())
    return 0 if answer.duration_us is not None else 1


def run(args: argparse.Namespace) -> int:
    args.database_path = resolve_location(args).directory
    if args.collective:
        return _collective(args)
    if args.queries is not None:
        if args.out is None:
            raise UsageError("--queries needs --out, the answers CSV")
        return _batch(args.database_path, args.queries, args.out, args.policy, args.op_mapping)
    if not (args.kernel_type and args.input_shapes and args.input_dtypes):
        raise UsageError("give --kernel-type, --input-shapes and --input-dtypes (or --queries FILE --out FILE)")
    query = make_query({"Kernel Type": args.kernel_type, "Input Shapes": args.input_shapes,
                        "Input Data Types": args.input_dtypes, "Input Formats": args.input_formats,
                        "Output Shapes": args.output_shapes, "Input Values": args.input_values})
    answer = lookup(args.database_path, query)
    print(answer.line())
    if args.policy:
        print("policy: " + _policy(args.database_path, query, args.op_mapping).line())
    return 0 if answer.duration_us is not None else 1
