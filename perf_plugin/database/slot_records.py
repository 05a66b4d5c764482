"""The records a row's calls made of their input slots, grouped by slot: what the captured
cells (``Profiling Input Quantiles``, ``Profiling Selection Depths``, ``Profiling Input Zero
Shares``, ``Profiling Input Masked Shares``, ``Profiling Input Distinct Shares``) are each made of."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

Record = TypeVar("Record")


def records_by_slot(samples: Sequence[Mapping[int, Record]]) -> list[list[Record]]:
    """Per slot, up to the highest any call recorded, the records of the calls that recorded it
    (argument position -> record per call; {} where a call recorded none)."""
    slots = max((max(sample) + 1 for sample in samples if sample), default=0)
    return [[sample[slot] for sample in samples if slot in sample] for slot in range(slots)]
