"""The FIA bundle check of ``perfdb ingest``: what a profile's ``operator_details.csv`` and
``trace_view.json`` tell about its ``FusedInferAttentionScore`` kernels.

A ``kernel_details.csv`` row of FusedInferAttentionScore gives the kernel's 31 input slots as the
kernel saw them.  The operator the model called (``npu::npu_fused_infer_attention_score``) can
have other shapes (vllm-ascend's MLA paths hand the operator 4-D BNSD tensors that the kernel
records in another layout), and those are what a replay of the call needs.  torch_npu records
them beside kernel_details, in the same ``ASCEND_PROFILER_OUTPUT`` directory: each operator
call's ``Input Shapes`` in ``operator_details.csv`` (in the API's argument order, which is the
kernel's slot order for the tensors; integer lists such as ``actual_seq_lengths`` have no shape
there), and the same shapes plus the link from every device kernel back to the operator that
launched it in ``trace_view.json`` (``perf_plugin.ingest.ascend_trace_view``).

The origin tool chain (msmodeling ``tools/perf_data_collection/parsers/parse_kernel_details.py``)
discovers both files, pairs each profile's FIA kernel rows with its FIA operator rows by row
order over the shared prefix (with a warning when the counts differ), takes the operator's shapes
where there is one, and writes ``Runtime`` columns: the profile, the shapes of
``actual_seq_lengths``, ``actual_seq_lengths_kv`` and ``block_table`` (slots 5, 6, 14), and
``Runtime metadata_completeness = profile_shapes_only`` (values come later, from a serving run's
dump: ``perfdb fia-runtime``); an older version also kept the operator's shapes as
``Runtime operator_input_shapes_raw``.  It leaves trace_view.json unread.

Here, for every kernel_details file with FusedInferAttentionScore rows:

* each kernel is linked to its operator through trace_view.json when it is there (exact);
  otherwise, by order to the FIA operator calls of operator_details.csv, only when the counts
  agree (an order pairing over a shared prefix gives kernels the shapes of other calls);
* each row gets ``Runtime source_profile``, ``Runtime operator_input_shapes_raw`` (the operator's
  shapes, when a kernel of the row was linked; the most frequent when calls differ), the three
  slot shapes and ``profile_shapes_only``; a row whose completeness says a serving run's values
  are there already (``perfdb fia-runtime``) is not touched by a later ingest;
* the report says, per file, what was found, how kernels were linked, and why a part is missing.
"""

from __future__ import annotations

import csv
import dataclasses
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.shapes import strip_embedded_quotes
from perf_plugin.ingest import discover as disc
from perf_plugin.ingest.aggregate import AggregatedRow
from perf_plugin.ingest.ascend_trace_view import launching_operators, read_events, to_ns
from perf_plugin.ingest.fia_runtime import COMPLETENESS, KV_LENS_SHAPE, Q_LENS_SHAPE
from perf_plugin.ingest.names import normalise_kernel_type

KERNEL_TYPE = "FusedInferAttentionScore"
SOURCE_PROFILE = "Runtime source_profile"
OPERATOR_SHAPES = "Runtime operator_input_shapes_raw"
BLOCK_TABLE_SHAPE = "Runtime block_table_shape"
PROFILE_TAG = "profile_shapes_only"
# Added at the end of the CSV when missing, in this order.
BUNDLE_COLUMNS = (SOURCE_PROFILE, OPERATOR_SHAPES, Q_LENS_SHAPE, KV_LENS_SHAPE, BLOCK_TABLE_SHAPE, COMPLETENESS)
KEY_COLUMNS = ("Input Shapes", "Input Data Types", "Input Formats", "Output Shapes", "Output Data Types")
SLOT_Q_LENS, SLOT_KV_LENS, SLOT_BLOCK_TABLE = 5, 6, 14
TORCH_OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
_NOT_ALNUM = re.compile(r"[^a-z0-9]+")

RowKey = tuple[str, ...]  # the five signature cells as the profiler wrote them


def is_fia_operator(name: str) -> bool:
    """``npu::npu_fused_infer_attention_score`` (and ``_v2``, ``.out``), ``aclnnFusedInferAttentionScoreV3`` ..."""
    return "fusedinferattentionscore" in _NOT_ALNUM.sub("", name.lower())


def operator_slots(text: str) -> str:
    """An operator's recorded shapes in the database's form: ``;`` between slots (the line breaks
    torch_npu puts after each dropped), no spaces, trailing empty slots (scalar arguments) dropped."""
    return ";".join(slot.strip().replace(" ", "") for slot in text.split(";")).rstrip(";")


def profile_name(kernel_details: Path) -> str:
    """``rank0_ascend_pt`` for ``rank0_ascend_pt/ASCEND_PROFILER_OUTPUT/kernel_details.csv``."""
    parent = kernel_details.parent
    return parent.parent.name if parent.name == TORCH_OUTPUT_DIR and parent.parent.name else parent.name


@dataclass(frozen=True)
class FiaKernel:
    line: int
    start_ns: int | None
    key: RowKey


def read_fia_kernels(path: Path) -> list[FiaKernel]:
    """The FusedInferAttentionScore rows of a kernel_details (or op_summary) file, in file order."""
    kernels: list[FiaKernel] = []
    with path.open("r", encoding="utf-8-sig", newline="") as handle:
        reader = csv.DictReader(handle)
        names = {name.strip(): name for name in reader.fieldnames or []}
        type_col, start_col = names.get("Type", names.get("OP Type")), names.get("Start Time(us)", names.get("Task Start Time(us)"))
        for cells in reader:
            if type_col is None or normalise_kernel_type(cells.get(type_col) or "") != KERNEL_TYPE:
                continue
            key = tuple(cells.get(names.get(c, c)) or "" for c in KEY_COLUMNS)
            kernels.append(FiaKernel(reader.line_num, to_ns(cells.get(start_col or "")), key))
    return kernels


def read_fia_operator_calls(path: Path) -> list[str]:
    """The recorded input shapes of every FusedInferAttentionScore operator call of an
    operator_details.csv, in call order (API-level rows such as ``aclnnFusedInferAttentionScoreV3``
    record no shapes and are not calls of the operator)."""
    try:
        with path.open("r", encoding="utf-8-sig", newline="") as handle:
            reader = csv.DictReader(handle)
            if "Name" not in (reader.fieldnames or []) or "Input Shapes" not in (reader.fieldnames or []):
                raise DatabaseError("not an operator_details.csv: it needs the columns 'Name' and 'Input Shapes'", path=path)
            return [operator_slots(row["Input Shapes"] or "") for row in reader
                    if is_fia_operator(row["Name"] or "") and (row["Input Shapes"] or "").strip(" ;\r\n")]  # fmt: skip
    except UnicodeDecodeError as exc:
        raise DatabaseError(f"not UTF-8 text (byte {exc.start})", path=path) from None
    except (OSError, csv.Error) as exc:
        raise DatabaseError(f"cannot read it as CSV: {exc}", path=path) from None


@dataclass
class BundleFile:
    """The check of one kernel_details file's bundle."""

    kernel_details: Path
    kernels: int
    operator_details: Path | None = None
    operator_calls: int | None = None
    trace_view: Path | None = None
    linked: int = 0  # kernels given their operator's shapes
    how: str = ""
    problems: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"{KERNEL_TYPE} bundle check of {self.kernel_details}: {self.kernels} kernel(s)"]
        if self.operator_details is not None:
            out.append(f"  operator_details.csv: {self.operator_calls} {KERNEL_TYPE} operator call(s) with shapes")
        out.append(f"  operator shapes for {self.linked} of {self.kernels} kernel(s)" + (f" ({self.how})" if self.how else ""))
        out.extend(f"  {problem}" for problem in self.problems)
        return out


def _by_trace(check: BundleFile, kernels: Sequence[FiaKernel], trace: Path) -> dict[int, str]:
    starts = [k.start_ns for k in kernels if k.start_ns is not None]
    found = launching_operators(read_events(trace), starts, is_fia_operator)
    shapes = {i: operator_slots(found[k.start_ns].input_dims) for i, k in enumerate(kernels) if k.start_ns in found}
    check.how = "linked to the operator that launched each through trace_view.json"
    if len(shapes) < len(kernels):
        check.problems.append(
            f"{len(kernels) - len(shapes)} kernel(s) have no torch_to_npu link in trace_view.json to a {KERNEL_TYPE} "
            "operator (a profile cut in the middle of a call, or a trace without framework operators): they keep "
            "the kernel's shapes only"
        )
    return shapes


def _by_order(check: BundleFile, kernels: Sequence[FiaKernel], calls: Sequence[str]) -> dict[int, str]:
    if len(calls) != len(kernels):
        check.problems.append(
            f"operator_details.csv has {len(calls)} {KERNEL_TYPE} operator call(s) for {len(kernels)} kernel(s) and "
            "there is no trace_view.json to link them: no operator shapes taken (pairing by order would give "
            "kernels the shapes of other calls)"
        )
        return {}
    order = sorted(range(len(kernels)), key=lambda i: (kernels[i].start_ns is None, kernels[i].start_ns or 0, i))
    check.how = "paired with the operator calls of operator_details.csv in launch order (the counts agree)"
    return {index: calls[position] for position, index in enumerate(order)}


def check_file(kernel_details: Path, sidecars: Mapping[str, Path | None]) -> tuple[BundleFile, list[FiaKernel], dict[int, str]]:
    """One file's check: the FIA kernels, and the operator shapes of those that were linked (by index)."""
    kernels = read_fia_kernels(kernel_details)
    check = BundleFile(kernel_details, len(kernels))
    operator_details, trace = sidecars.get("operator_details.csv"), sidecars.get("trace_view.json")
    calls: list[str] = []
    if operator_details is not None:
        calls = read_fia_operator_calls(operator_details)
        check.operator_details, check.operator_calls = operator_details, len(calls)
        if not calls:
            check.problems.append(
                f"operator_details.csv records no {KERNEL_TYPE} operator call with shapes (profile with "
                "record_shapes=True)"
            )
    else:
        check.problems.append(
            "operator_details.csv not found beside it (torch_npu writes it with record_shapes=True)"
        )
    if trace is not None:
        check.trace_view = trace
        shapes = _by_trace(check, kernels, trace)
    else:
        check.problems.append("trace_view.json not found beside it: kernels cannot be linked to their operator calls")
        shapes = _by_order(check, kernels, calls) if calls else {}
    check.linked = len(shapes)
    if not shapes and not check.how:
        check.problems.append("the rows keep the kernel's shapes only")
    return check, kernels, shapes


def _slot(input_shapes: str, index: int) -> str:
    slots = strip_embedded_quotes(input_shapes).split(";")
    return slots[index].strip() if index < len(slots) else ""


def _tensor_slots_differ(kernel_shapes: str, operator: str) -> bool:
    """Whether a slot both record as a tensor has two different shapes."""
    kernel, op = strip_embedded_quotes(kernel_shapes).split(";"), operator.split(";")
    return any(a.strip() and b and a.strip() != b for a, b in zip(kernel, op))


@dataclass
class FiaBundle:
    """The check of every kernel_details file of an ingest, and the Runtime cells per row."""

    files: list[BundleFile] = field(default_factory=list)
    cells: dict[RowKey, dict[str, str]] = field(default_factory=dict)
    differing: int = 0  # rows whose operator shapes differ from the kernel's
    conflicting: int = 0  # rows whose kernels came from calls of different operator shapes

    def lines(self) -> list[str]:
        out = [line for check in self.files for line in check.lines()]
        with_shapes = sum(1 for cells in self.cells.values() if cells.get(OPERATOR_SHAPES))
        out.append(
            f"{KERNEL_TYPE} rows: {len(self.cells)} given Runtime columns ({PROFILE_TAG}), {with_shapes} with the "
            f"operator's shapes in {OPERATOR_SHAPES!r}"
            + (f"; {self.differing} whose operator shapes differ from the kernel's" if self.differing else "")
            + (f"; {self.conflicting} launched by calls of different shapes (the most frequent kept)" if self.conflicting else "")
        )
        return out


def _row_cells(key: RowKey, profile: str, operator_shapes: Counter[str]) -> dict[str, str]:
    input_shapes = key[0]
    return {
        SOURCE_PROFILE: profile,
        OPERATOR_SHAPES: operator_shapes.most_common(1)[0][0] if operator_shapes else "",
        Q_LENS_SHAPE: _slot(input_shapes, SLOT_Q_LENS),
        KV_LENS_SHAPE: _slot(input_shapes, SLOT_KV_LENS),
        BLOCK_TABLE_SHAPE: _slot(input_shapes, SLOT_BLOCK_TABLE),
        COMPLETENESS: PROFILE_TAG,
    }


def check_bundle(discovery: disc.Discovery) -> FiaBundle | None:
    """The bundle check of every kernel_details file with FusedInferAttentionScore rows (None: none has any)."""
    if discovery.kind != disc.KERNEL_DETAILS:
        return None
    bundle = FiaBundle()
    profiles: dict[RowKey, str] = {}
    shapes: dict[RowKey, Counter[str]] = {}
    for path in discovery.files:
        check, kernels, linked = check_file(path, discovery.sidecars.get(path, {}))
        if not kernels:
            continue
        bundle.files.append(check)
        for index, kernel in enumerate(kernels):
            profiles.setdefault(kernel.key, profile_name(path))
            counter = shapes.setdefault(kernel.key, Counter())
            if index in linked:
                counter[linked[index]] += 1
    if not bundle.files:
        return None
    for key, profile in profiles.items():
        cells = bundle.cells[key] = _row_cells(key, profile, shapes[key])
        bundle.differing += bool(cells[OPERATOR_SHAPES]) and _tensor_slots_differ(key[0], cells[OPERATOR_SHAPES])
        bundle.conflicting += len(shapes[key]) > 1
    return bundle


def with_bundle_cells(rows: Iterable[AggregatedRow], bundle: FiaBundle | None) -> list[AggregatedRow]:
    """The rows, FusedInferAttentionScore ones carrying their Runtime cells for the merge."""
    if bundle is None:
        return list(rows)
    out = []
    for row in rows:
        cells = bundle.cells.get(tuple(row.cells.get(c, "") for c in KEY_COLUMNS)) if row.kernel_type == KERNEL_TYPE else None
        out.append(dataclasses.replace(row, runtime=cells) if cells else row)
    return out
