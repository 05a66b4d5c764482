"""The ``Profiling Input Masked Shares`` cell: per input slot, how much of a softmax's input was
masked in the profiled model and in how many runs per row, where an input-value capture recorded
it (``perf_plugin.capture.masked_rows``).

A softmax's time depends on it: an element far below its row's maximum (a mask's ``-inf`` or
lowest value) takes the device's slower exponential, and a warp is slowed by any of its lanes that
meets one.  On an H200, GPT-OSS's prefill softmax took 40.5 us on random logits, 52.3 us under its
causal mask and 62.5 us with as many masked elements at random places.  A slot's record is
``SHARE:RUNS``: the share of its elements that were masked, in [0, 1], and the mean number of runs
of masked elements per row (a causal mask's rows hold one, a router's scattered masked experts
several); slots are separated by ``;`` as in ``Input Shapes``, an empty slot had none recorded.  A
row's cell holds, per slot, the means over the calls that recorded it; a row none of whose calls
had a masked element has no cell (a replay's default values hold none either).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.slot_records import records_by_slot

DIGITS = 6
SEPARATOR = ":"


def masked_shares_cell(samples: Sequence[Mapping[int, tuple[float, float]]]) -> str:
    """A row's cell from its calls' records (argument position -> (share, runs per row); {} where
    a call recorded none): per slot, the mean share and the mean runs over the calls that recorded it."""
    slots: list[tuple[float, float] | None] = []
    for recorded in records_by_slot(samples):
        if not recorded:
            slots.append(None)
            continue
        slots.append((sum(share for share, _ in recorded) / len(recorded),
                      sum(runs for _, runs in recorded) / len(recorded)))
    if not any(slot and slot[0] for slot in slots):
        return ""
    return ";".join("" if slot is None else f"{slot[0]:.{DIGITS}g}{SEPARATOR}{slot[1]:.{DIGITS}g}" for slot in slots)


def parse_masked_shares_cell(cell: str) -> tuple[tuple[float, float] | None, ...]:
    """Per slot (share, runs per row), None for an empty slot; () for an empty cell.

    Raises DatabaseError naming the slot for text that is not ``SHARE:RUNS`` with a share in
    [0, 1] and runs of 0 or more."""
    if not cell.strip():
        return ()
    slots: list[tuple[float, float] | None] = []
    for slot, text in enumerate(cell.split(";")):
        if not text.strip():
            slots.append(None)
            continue
        share_text, _, runs_text = text.partition(SEPARATOR)
        try:
            share, runs = float(share_text), float(runs_text)
        except ValueError:
            share = runs = math.nan
        if not 0.0 <= share <= 1.0 or not runs >= 0.0:
            raise DatabaseError(f"slot {slot}: {text.strip()!r} is not SHARE:RUNS (a share between 0 and 1,"
                                " then masked runs per row, 0 or more)")
        slots.append((share, runs))
    return tuple(slots)
