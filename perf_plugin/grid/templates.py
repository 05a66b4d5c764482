"""Structural metadata a generated row inherits from a source row of the same kernel type.

A generated row takes its shapes from a pattern and everything else that describes the kernel
from a row already in the CSV: ``OP State``, ``Accelerator Core``, the data type and format of
every slot (so a float16 database yields float16 rows, and ``FRACTAL_NZ`` weights stay
``FRACTAL_NZ``), and the slot counts (so the 31 slots of ``FusedInferAttentionScore`` stay 31).

A source row fits a pattern when its non-empty shape slots are exactly the pattern's, every one
of them has a known dtype, and every scalar slot of the pattern has a dtype in the source row.
Among the rows that fit, the one whose dtypes, then ranks, agree most with the pattern wins,
then the most frequent structure, then the earliest row.  Formats that name a rank (``NCL``,
``NCHW``, ``NCDHW``...) are kept only where the generated tensor has that rank; elsewhere the
slot gets ``ND`` (in the file's spelling, ``FORMAT_ND`` where the file uses that).

A kernel type with no fitting row uses the documented default: ``OP State`` dynamic,
``Accelerator Core`` AI_CORE (or the route's ``accelerator_core``), format ND, dtypes from the
pattern in the profiler's spelling (``DT_BF16``, ``FLOAT``, ``INT64``...), and ``DT_UNDEFINED``
/ ``NULL`` for undefined optional slots, as the profiler writes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.shapes import QuoteStyle, Shape, format_shape_cell, parse_shape_cell, split_slots
from perf_plugin.database.signature import normalise_dtype, normalise_format
from perf_plugin.database.table import CsvTable
from perf_plugin.grid.config import KernelRoute, Pattern, SlotSpec
from perf_plugin.replay.tensors import DTYPES
from perf_plugin.trace.args import is_contiguous

# Format names that imply a rank; a generated tensor of another rank gets ND instead.
RANKED_FORMATS: dict[str, int] = {"NC": 2, "NCL": 3, "NCHW": 4, "NHWC": 4, "HWCN": 4, "CHWN": 4, "NCDHW": 5, "NDHWC": 5}
# How Ascend profilers spell dtypes (normalised name -> written token).
PROFILER_DTYPE: dict[str, str] = {
    "BF16": "DT_BF16",
    "BFLOAT16": "DT_BF16",
    "FLOAT32": "FLOAT",
    "FP32": "FLOAT",
    "FP16": "FLOAT16",
    "HALF": "FLOAT16",
    "FLOAT64": "DOUBLE",
}
UNDEFINED_DTYPE = "DT_UNDEFINED"
UNDEFINED_FORMAT = "NULL"


def profiler_dtype(normalised: str) -> str:
    return PROFILER_DTYPE.get(normalised, normalised)


def _same_dtype(a: str, b: str) -> bool:
    return a in DTYPES and b in DTYPES and DTYPES[a][0] == DTYPES[b][0]


def _pad(values: list[str], width: int) -> tuple[str, ...]:
    return tuple(values + [""] * (width - len(values)))


@dataclass(frozen=True)
class SlotMetadata:
    """A row's identity cells besides its shapes: ``OP State``, ``Accelerator Core`` and the
    data type and format tokens of every input and output slot."""

    op_state: str
    core: str
    in_dtypes: tuple[str, ...]
    in_formats: tuple[str, ...]
    out_dtypes: tuple[str, ...]
    out_formats: tuple[str, ...]


@dataclass(frozen=True)
class Structure(SlotMetadata):
    """The stable structural metadata of a source row (shapes reduced to ranks)."""

    in_ranks: tuple[int | None, ...]
    out_ranks: tuple[int | None, ...]

    @property
    def in_present(self) -> frozenset[int]:
        return frozenset(i for i, r in enumerate(self.in_ranks) if r is not None)

    @property
    def out_present(self) -> frozenset[int]:
        return frozenset(i for i, r in enumerate(self.out_ranks) if r is not None)


@dataclass(frozen=True)
class SourceStructure:
    structure: Structure
    count: int
    first_row: int


def _side(row: dict[str, str], side: str) -> tuple[tuple[int | None, ...], tuple[str, ...], tuple[str, ...]] | None:
    shapes_cell = row.get(f"{side} Shapes", "")
    try:
        shapes = parse_shape_cell(shapes_cell)
    except DatabaseError:
        return None  # N/A rows (MemSet...) and malformed rows are no template
    dtypes = [t.strip() for t in split_slots(row.get(f"{side} Data Types", ""))]
    formats = [t.strip() for t in split_slots(row.get(f"{side} Formats", ""))]
    width = max(len(shapes), len(dtypes), len(formats))
    ranks = tuple(None if s is None else len(s) for s in shapes) + (None,) * (width - len(shapes))
    return ranks, _pad(dtypes, width), _pad(formats, width)


def source_structures(table: CsvTable) -> list[SourceStructure]:
    """Distinct structures of the table's rows, with how often and where each first occurs."""
    found: dict[Structure, list[int]] = {}
    for index in range(len(table)):
        row = table.row_dict(index)
        inputs, outputs = _side(row, "Input"), _side(row, "Output")
        if inputs is None or outputs is None or not any(r is not None for r in outputs[0]):
            continue
        structure = Structure(
            op_state=row.get("OP State", "").strip(),
            core=row.get("Accelerator Core", "").strip(),
            in_dtypes=inputs[1],
            in_formats=inputs[2],
            out_dtypes=outputs[1],
            out_formats=outputs[2],
            in_ranks=inputs[0],
            out_ranks=outputs[0],
        )
        entry = found.setdefault(structure, [0, index])
        entry[0] += 1
    return [SourceStructure(s, count, first) for s, (count, first) in found.items()]


@dataclass(frozen=True)
class RowLayout(SlotMetadata):
    """Everything but the shapes of the rows one pattern generates into one table."""

    in_itemsizes: tuple[int, ...]  # bytes per element of each slot (0 where there is no tensor)
    out_itemsizes: tuple[int, ...]
    inherited_from: int | None  # 0-based row index of the source row, None for the default

    def cells(
        self, inputs: Sequence[Shape | None], outputs: Sequence[Shape | None], style: QuoteStyle
    ) -> dict[str, str]:
        """The identity cells of one row; shapes are padded (or trimmed of undefined trailing
        slots) to the layout's slot counts."""
        width_in, width_out = len(self.in_dtypes), len(self.out_dtypes)
        in_shapes = (list(inputs) + [None] * width_in)[:width_in]
        out_shapes = (list(outputs) + [None] * width_out)[:width_out]
        return {
            "OP State": self.op_state,
            "Accelerator Core": self.core,
            "Input Shapes": format_shape_cell(in_shapes, style),
            "Input Data Types": self.joined[0],
            "Input Formats": self.joined[1],
            "Output Shapes": format_shape_cell(out_shapes, style),
            "Output Data Types": self.joined[2],
            "Output Formats": self.joined[3],
        }

    def strides_cell(
        self, inputs: Sequence[Shape | None], strides: Sequence[Shape | None], style: QuoteStyle
    ) -> str:
        """The ``Input Strides`` cell as trace ingest writes it (``MappedOp.strides_cell``): every
        slot's strides, aligned like the shapes, where one input is not row-major; else empty, as
        a row of contiguous inputs has no strides to record (and so the same signature)."""
        width = len(self.in_dtypes)
        shapes = (list(inputs) + [None] * width)[:width]
        padded = (list(strides) + [None] * width)[:width]
        if not any(s is not None and t is not None and not is_contiguous(s, t) for s, t in zip(shapes, padded)):
            return ""
        return format_shape_cell(padded, style)

    @cached_property
    def joined(self) -> tuple[str, str, str, str]:
        """The dtype and format cells, the same for every row of the layout."""
        return (
            ";".join(self.in_dtypes),
            ";".join(self.in_formats),
            ";".join(self.out_dtypes),
            ";".join(self.out_formats),
        )


def _fits(pattern: Pattern, s: Structure) -> bool:
    for slots, present, dtypes in (
        (pattern.inputs, s.in_present, s.in_dtypes),
        (pattern.outputs, s.out_present, s.out_dtypes),
    ):
        wanted = frozenset(i for i, slot in enumerate(slots) if slot.present)
        if wanted != present:
            return False
        if any(normalise_dtype(dtypes[i]) not in DTYPES for i in present):
            return False
        for i, slot in enumerate(slots):
            if not slot.present and slot.dtype and (i >= len(dtypes) or normalise_dtype(dtypes[i]) not in DTYPES):
                return False
    return True


def _score(pattern: Pattern, source: SourceStructure) -> tuple[int, int, int, int]:
    s = source.structure
    dtype_hits = rank_hits = 0
    sides = ((pattern.inputs, s.in_dtypes, s.in_ranks), (pattern.outputs, s.out_dtypes, s.out_ranks))
    for slots, dtypes, ranks in sides:
        for i, slot in enumerate(slots):
            if slot.dtype and i < len(dtypes) and _same_dtype(slot.dtype, normalise_dtype(dtypes[i])):
                dtype_hits += 1
            if slot.present and ranks[i] == slot.rank:
                rank_hits += 1
    return dtype_hits, rank_hits, source.count, -source.first_row


def _formats(tokens: tuple[str, ...], slots: tuple[SlotSpec, ...], all_tokens: tuple[str, ...]) -> tuple[str, ...]:
    nd = "FORMAT_ND" if any(t.upper().startswith("FORMAT_") for t in all_tokens) else "ND"
    out = []
    for i, token in enumerate(tokens):
        slot = slots[i] if i < len(slots) else None
        rank = RANKED_FORMATS.get(normalise_format(token))
        if slot is not None and slot.present and rank is not None and rank != slot.rank:
            token = nd
        out.append(token)
    return tuple(out)


def _itemsizes(dtypes: tuple[str, ...], slots: tuple[SlotSpec, ...]) -> tuple[int, ...]:
    sizes = []
    for i, token in enumerate(dtypes):
        present = i < len(slots) and slots[i].present
        sizes.append(DTYPES[normalise_dtype(token)][1] if present else 0)
    return tuple(sizes)


def default_layout(route: KernelRoute, pattern: Pattern) -> RowLayout:
    """The documented default structure for a kernel type with no fitting source row."""

    def side(slots: tuple[SlotSpec, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        dtypes = tuple(profiler_dtype(s.dtype) if s.dtype else UNDEFINED_DTYPE for s in slots)
        formats = tuple("ND" if (s.present or s.dtype) else UNDEFINED_FORMAT for s in slots)
        return dtypes, formats

    in_dtypes, in_formats = side(pattern.inputs)
    out_dtypes, out_formats = side(pattern.outputs)
    return RowLayout(
        op_state=route.op_state,
        core=route.accelerator_core,
        in_dtypes=in_dtypes,
        in_formats=in_formats,
        out_dtypes=out_dtypes,
        out_formats=out_formats,
        in_itemsizes=_itemsizes(in_dtypes, pattern.inputs),
        out_itemsizes=_itemsizes(out_dtypes, pattern.outputs),
        inherited_from=None,
    )


def resolve_layout(route: KernelRoute, pattern: Pattern, sources: Sequence[SourceStructure]) -> RowLayout:
    """The layout of ``pattern``'s rows: inherited from the best fitting source row, else default."""
    fitting = [s for s in sources if _fits(pattern, s.structure)]
    if not fitting:
        return default_layout(route, pattern)
    best = max(fitting, key=lambda s: _score(pattern, s))
    s = best.structure
    all_formats = s.in_formats + s.out_formats
    return RowLayout(
        op_state=s.op_state or route.op_state,
        core=s.core or route.accelerator_core,
        in_dtypes=s.in_dtypes,
        in_formats=_formats(s.in_formats, pattern.inputs, all_formats),
        out_dtypes=s.out_dtypes,
        out_formats=_formats(s.out_formats, pattern.outputs, all_formats),
        in_itemsizes=_itemsizes(s.in_dtypes, pattern.inputs),
        out_itemsizes=_itemsizes(s.out_dtypes, pattern.outputs),
        inherited_from=best.first_row,
    )
