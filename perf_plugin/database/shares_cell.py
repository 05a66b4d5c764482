"""A cell of one share per input slot, each in [0, 1]: what ``Profiling Input Zero Shares`` (the
share of a floating input's elements that were zero) and ``Profiling Input Distinct Shares`` (the
share of an index input's values that were distinct) hold.

Slots are separated by ``;`` as in ``Input Shapes``; an empty slot had none recorded.  A row's cell
holds, per slot, the mean over the calls that recorded it; a row whose shares are all zero has no
cell (a replay's default draws hold no zero element).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.slot_records import records_by_slot

SHARE_DIGITS = 6


def shares_cell(samples: Sequence[Mapping[int, float]]) -> str:
    """A row's cell from its calls' shares (argument position -> share; {} where a call recorded
    none): per slot, the mean over the calls that recorded the slot."""
    shares = [sum(recorded) / len(recorded) if recorded else None for recorded in records_by_slot(samples)]
    if not any(share for share in shares):
        return ""
    return ";".join("" if share is None else f"{share:.{SHARE_DIGITS}g}" for share in shares)


def parse_shares_cell(cell: str) -> tuple[float | None, ...]:
    """Per slot the share (None for an empty slot); () for an empty cell.

    Raises DatabaseError naming the slot for text that is not a number in [0, 1]."""
    if not cell.strip():
        return ()
    shares: list[float | None] = []
    for slot, text in enumerate(cell.split(";")):
        if not text.strip():
            shares.append(None)
            continue
        try:
            share = float(text)
        except ValueError:
            share = math.nan
        if not 0.0 <= share <= 1.0:
            raise DatabaseError(f"slot {slot}: {text.strip()!r} is not a share between 0 and 1")
        shares.append(share)
    return tuple(shares)
