"""The ``Profiling Input Zero Shares`` cell: per input slot, the share of a floating input's
elements that were zero in the profiled model, where an input-value capture recorded it
(``perf_plugin.capture``: a division's operands, a batched GEMM's).

A division's time depends on it: the device divides a zero numerator on a slower path.  An H200
divided PhiMoE's router operands (``max - scores`` over ``|scores|`` clamped at the max: one zero
numerator a row) in 2.05 us, random operands of the same shapes in 1.12
(``reproduce/wip/division_operand_values.py``).  A batched GEMM's too: Llama 4's experts multiply
every token, those routed elsewhere zeroed, and an H200 ran their [16,512,8192] x [16,8192,5120]
``bmm`` in 795 us with 15 of 16 rows zero, 835 on uniform values
(``reproduce/wip/gemm_operand_zeros.py``).  A slot's share is a number in [0, 1]; slots are
separated by ``;`` as in ``Input Shapes``, an empty slot had none recorded.  A row's cell holds,
per slot, the mean over the calls that recorded it; a row none of whose calls had a zero element
has no cell (a replay's default values hold no zero either).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.slot_records import records_by_slot

SHARE_DIGITS = 6


def zero_shares_cell(samples: Sequence[Mapping[int, float]]) -> str:
    """A row's cell from its calls' zero shares (argument position -> share; {} where a call
    recorded none): per slot, the mean over the calls that recorded the slot."""
    shares = [sum(recorded) / len(recorded) if recorded else None for recorded in records_by_slot(samples)]
    if not any(share for share in shares):
        return ""
    return ";".join("" if share is None else f"{share:.{SHARE_DIGITS}g}" for share in shares)


def parse_zero_shares_cell(cell: str) -> tuple[float | None, ...]:
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
