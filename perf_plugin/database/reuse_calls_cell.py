"""The ``Profiling Input Reuse Calls(B)`` cell: per input slot, how the distances of a row's calls
differ (``Profiling Input Reuse Distance(B)`` holds their median).

One row aggregates calls that share shapes, not what the device did before each: rotary
embedding's first ``mul`` of a decode layer reads its ``cos`` table a layer's weights after its
last use, the next three a kernel or two after.  A slot holds ``EIGHTHS`` distances, each that of
an eighth of the calls (the sorted distances at the middle of each eighth: with four calls, two
tokens each), ``-`` for calls whose input no earlier kernel wrote, separated by ``,``; a slot whose
eighths agree is one token.  Slots are separated by ``;`` as in ``Input Shapes``.  A row whose
calls agree on every slot has no cell: its median says it all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.reuse_cell import NO_PRODUCER

EIGHTHS = 8


def reuse_calls_cell(samples: Sequence[tuple[float, ...]]) -> str:
    """A row's cell from its calls' distances (a missing slot of a call is no producer); "" where
    every slot's eighths agree."""
    slots = max((len(sample) for sample in samples), default=0)
    per_slot = [_eighths(sorted(sample[j] if j < len(sample) else math.inf for sample in samples))
                 for j in range(slots)]
    if all(len(set(eighths)) == 1 for eighths in per_slot):
        return ""
    return ";".join(_slot_text(eighths) for eighths in per_slot)


def _slot_text(eighths: Sequence[float]) -> str:
    if len(set(eighths)) == 1:
        return _token(eighths[0])
    return ",".join(_token(value) for value in eighths)


def _eighths(ordered: Sequence[float]) -> tuple[float, ...]:
    """The value at the middle of each eighth of ``ordered`` (the inverse of its distribution)."""
    count = len(ordered)
    return tuple(ordered[max(0, math.ceil((k + 0.5) * count / EIGHTHS) - 1)] for k in range(EIGHTHS))


def _token(value: float) -> str:
    return NO_PRODUCER if math.isinf(value) else str(int(round(value)))


def parse_reuse_calls_cell(cell: str) -> tuple[tuple[float, ...], ...]:
    """Per slot its ``EIGHTHS`` distances (``math.inf`` for ``-``; one token stands for all
    eighths); () for an empty cell.

    Raises DatabaseError naming the slot for a slot of neither one nor ``EIGHTHS`` distances."""
    if not cell.strip():
        return ()
    slots = []
    for slot, text in enumerate(cell.split(";")):
        parsed = [_distance(token.strip()) for token in text.split(",")]
        values = tuple(value for value in parsed if value is not None)
        if len(values) != len(parsed):
            raise DatabaseError(f"slot {slot}: {text.strip()!r} holds a token that is neither a byte count "
                                f"nor {NO_PRODUCER!r}")
        if len(values) == 1:
            values = values * EIGHTHS
        if len(values) != EIGHTHS:
            raise DatabaseError(f"slot {slot}: {text.strip()!r} is neither one distance nor {EIGHTHS}")
        slots.append(values)
    return tuple(slots)


def _distance(token: str) -> float | None:
    if token == NO_PRODUCER:
        return math.inf
    try:
        value = float(token)
    except ValueError:
        return None
    return value if value >= 0 else None
