"""Readable ids of database rows: the pytest parameter id of a row's replay case.

``MatMulV3-4096x1024,1024x3584-BF16-to-4096x3584-BF16``: the kernel type, the input shapes (``x``
within a shape, ``,`` between slots, ``_`` for an empty slot), the distinct input dtypes, then
the same for the outputs.  Ids longer than ``MAX_ID_LENGTH`` keep their start and end in a hash.
"""

from __future__ import annotations

import hashlib

from perf_plugin.database.shapes import split_slots
from perf_plugin.database.signature import normalise_dtype

MAX_ID_LENGTH = 120


def _slot_text(cell: str) -> str:
    slots = [s.strip().replace(",", "x") or "_" for s in split_slots(cell)]
    while slots and slots[-1] == "_":
        slots.pop()
    return ",".join(slots) or "scalar"


def _dtype_text(cell: str) -> str:
    tokens = [normalise_dtype(t) for t in split_slots(cell)]
    tokens = [t for t in tokens if t]
    distinct: list[str] = []
    for token in tokens:
        if token not in distinct:
            distinct.append(token)
    return ",".join(distinct) or "none"


def make_case_id(kernel_type: str, cells: dict[str, str]) -> str:
    inputs = _slot_text(cells.get("Input Shapes", ""))
    outputs = _slot_text(cells.get("Output Shapes", ""))
    case_id = (
        f"{kernel_type}-{inputs}-{_dtype_text(cells.get('Input Data Types', ''))}"
        f"-to-{outputs}-{_dtype_text(cells.get('Output Data Types', ''))}"
    )
    if len(case_id) > MAX_ID_LENGTH:
        digest = hashlib.sha1(case_id.encode()).hexdigest()[:8]
        case_id = f"{case_id[: MAX_ID_LENGTH - 9]}~{digest}"
    return case_id
