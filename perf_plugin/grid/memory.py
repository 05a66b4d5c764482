"""Device-memory estimate of a kernel row, and the budget filter of the shape grid.

The estimate is what the replay of the row holds on the device at once:

* every input and output tensor: elements x element size of its dtype (empty slots, host
  scalars and 0-d tensors count 0);
* plus the kernel's workspace, as the pattern's ``workspace`` expression in ``config.yaml``
  gives it (0 when the pattern has none).  Only FusedInferAttentionScore declares one: the
  float32 softmax statistics (running max and sum) per query token and head,
  ``2 * 4 * tokens * heads`` bytes.

Not counted: the verification reference (float64: built on the host, or for GEMM replays on
a CUDA device, where the runner counts it against the free memory and builds it on the host
when it does not fit: ``OpReplay.reference_on_device``), the allocator's rounding, and rotating
input buffers (a replay option that multiplies the inputs; keep the budget below the device
memory by that factor when using it).  Float8 operands count one byte per element, so an FP8
GEMM row (``aten._scaled_mm``) fits where its bf16 MatMul row may not.

``--max-hbm-gb`` is in GiB (2**30 bytes).
"""

from __future__ import annotations

from collections.abc import Sequence

from perf_plugin.database.shapes import Shape
from perf_plugin.replay.tensors import KernelRow

GIB = 1 << 30


def budget_bytes(max_hbm_gb: float) -> int:
    """``--max-hbm-gb`` in bytes."""
    return int(max_hbm_gb * GIB)


def estimate_row_bytes(row: KernelRow, workspace: int = 0) -> int:
    """Bytes of all input and output tensors of ``row`` plus ``workspace``."""
    return row.nbytes + workspace


def estimate_bytes(
    inputs: Sequence[Shape | None],
    outputs: Sequence[Shape | None],
    in_itemsizes: Sequence[int],
    out_itemsizes: Sequence[int],
    workspace: int = 0,
) -> int:
    """The same estimate for a row being generated: slot shapes and bytes per element."""
    total = workspace
    for shapes, sizes in ((inputs, in_itemsizes), (outputs, out_itemsizes)):
        for shape, size in zip(shapes, sizes):
            if shape is not None:
                count = size
                for dim in shape:
                    count *= dim
                total += count
    return total
