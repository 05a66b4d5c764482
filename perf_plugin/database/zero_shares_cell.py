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
has no cell (a replay's default values hold no zero either).  The cell's format is
``perf_plugin.database.shares_cell``'s.
"""

from __future__ import annotations

from perf_plugin.database.shares_cell import parse_shares_cell as parse_zero_shares_cell
from perf_plugin.database.shares_cell import shares_cell as zero_shares_cell

__all__ = ["parse_zero_shares_cell", "zero_shares_cell"]
