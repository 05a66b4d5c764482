"""Shape, dtype and format cells: ``;`` separates tensor slots, ``,`` separates dimensions.

Real profiler files write shape cells with quotes inside the value (the CSV text
``\"\"\"4096,1024\"\"\"`` reads as the value ``"4096,1024"``); hand-written databases use the plain
value ``4096,1024``.  Both read the same; ``QuoteStyle`` remembers which one a file uses so that
cells we write match their neighbours.  Empty slots (optional inputs, scalars) are kept: the
number of slots means something to the kernel.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from perf_plugin.database.errors import DatabaseError

Shape = tuple[int, ...]
SlotShape = Shape | None  # None: an empty slot


class QuoteStyle(enum.Enum):
    PLAIN = "plain"  # 4096,1024
    EMBEDDED = "embedded"  # "4096,1024" inside the value, as profilers write it


def strip_embedded_quotes(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == '"' and value[-1] == '"':
        return value[1:-1]
    return value


def detect_quote_style(values: Sequence[str]) -> QuoteStyle:
    for value in values:
        stripped = value.strip()
        if stripped.startswith('"') and stripped.endswith('"') and len(stripped) >= 2:
            return QuoteStyle.EMBEDDED
    return QuoteStyle.PLAIN


NOT_RECORDED = "N/A"


def split_slots(value: str) -> list[str]:
    """Split a shape/dtype/format cell into its slots (``""`` -> no slots)."""
    inner = strip_embedded_quotes(value)
    if inner == "":
        return []
    return inner.split(";")


def parse_shape_cell(value: str) -> list[SlotShape]:
    """Parse ``"136,7168;7168,3584"`` into ``[(136, 7168), (7168, 3584)]``.

    ``N/A`` is what profilers write for a kernel that records no tensors on that side (the
    outputs of an in-place kernel such as ``ApplyAdamWV2`` or ``MemSet``): no slots.
    Raises DatabaseError (without location; callers add it) on a malformed cell.
    """
    if strip_embedded_quotes(value).strip() == NOT_RECORDED:
        return []
    slots: list[SlotShape] = []
    for slot in split_slots(value):
        slot = slot.strip()
        if slot == "":
            slots.append(None)
            continue
        dims: list[int] = []
        for dim in slot.split(","):
            dim = dim.strip()
            if not dim or not (dim.isdigit() or (dim.startswith("-") and dim[1:].isdigit())):
                raise DatabaseError(f"malformed shape {value!r}: dimension {dim!r} is not an integer")
            number = int(dim)
            if number < 0:
                raise DatabaseError(f"malformed shape {value!r}: negative dimension {number}")
            dims.append(number)
        slots.append(tuple(dims))
    return slots


def format_shape_cell(slots: Sequence[SlotShape], style: QuoteStyle = QuoteStyle.PLAIN) -> str:
    inner = ";".join("" if s is None else ",".join(str(d) for d in s) for s in slots)
    if style is QuoteStyle.EMBEDDED and inner:
        return f'"{inner}"'
    return inner


def format_slots(values: Sequence[str], style: QuoteStyle = QuoteStyle.PLAIN) -> str:
    """Join dtype/format slots; dtype and format cells carry no embedded quotes in real files."""
    return ";".join(values)


def trim_trailing_empty(slots: list[str]) -> list[str]:
    out = list(slots)
    while out and out[-1].strip() == "":
        out.pop()
    return out


def numel(shape: Shape) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count
