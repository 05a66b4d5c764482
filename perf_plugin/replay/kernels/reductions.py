"""``LpNormV2`` replay: the p-norm of a whole tensor, ``(sum |x|^p)^(1/p)`` as a 0-d tensor.

Row layout (the real Level2 training profile, CANN 8.3): one input, one 0-d output written as an
empty shape with a dtype: ``"220233216"`` FLOAT -> ``""`` FLOAT, and smaller rows down to
``"128"``, all named ``aclnnLinalgVectorNorm_LpNormV2_LpNormV2``.  They are the gradient norms of
gradient clipping: Megatron's multi-tensor L2 norm without apex's fused kernel (as on an NPU)
calls ``torch.norm(tensor)`` on every gradient buffer and then on the list of those norms, and
``torch.nn.utils.clip_grad_norm_`` calls ``linalg.vector_norm`` per gradient where no foreach
kernel applies; ``torch.norm`` with a number (or the default) ``p`` calls ``linalg.vector_norm``.
The order ``p`` is an attribute the row does not record: the replay uses 2, the gradient-clipping
norm, and only whole-tensor reductions (a 0-d output); a row with a reduced shape is reported
unsupported.

API: ``torch.linalg.vector_norm(x, 2)``: op-plugin maps ``linalg_vector_norm`` to
``aclnnLinalgVectorNorm``, which runs ``LpNormV2``; ``run`` is that call on every device.  A
FLOAT output of a half-precision input is the ``dtype=torch.float32`` form of the same call.

Reference: a float64 sum of squares accumulated over chunks of the flattened input (bounded
memory: a float64 copy of the 220M-element row would be 1.8 GB), then its square root.
Default tolerances (FLOAT 1e-4): a float32 norm of 2e8 elements summed pairwise stays far below.

Trace ingest: ``aten::linalg_vector_norm`` and ``aten::norm`` of order 2 over all dimensions.
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.elementwise import ScalarAwareReplay, one_input_one_output
from perf_plugin.replay.tensors import DTYPES, FLOATING, KernelRow, TensorSpec, shape_text
from perf_plugin.trace.args import SCALAR_TYPE_CODES, concrete_arg, tensor_arg
from perf_plugin.trace.events import TraceOp
from perf_plugin.trace.mapped import MappedOp, Slot

if TYPE_CHECKING:
    import torch

ORDER = 2.0
# Elements per step of the float64 reference: 32 MB of float64 at a time.
REFERENCE_CHUNK = 1 << 22
# The CPU path (see ``run``) splits inputs of at least CPU_SPLIT_FROM elements (below, the
# float32 sum is within 1e-5) into a divisor of the element count of at most CPU_ROWS slices.
CPU_SPLIT_FROM = 1 << 22
CPU_ROWS = 1 << 12
HALF = frozenset({"FLOAT16", "FP16", "HALF", "BF16", "BFLOAT16"})


# ----------------------------------------------------------------------------- trace ingest
def _trace_vector_norm(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    """``linalg_vector_norm(x, ord, dim, keepdim, dtype)`` / ``norm(x, p)``: order 2 over every
    dimension gives a 0-d output in the input's dtype (or the ``dtype`` argument's)."""
    x = tensor_arg(op, 0)
    if x is None or x.dtype not in ("FLOAT", "FLOAT16", "DT_BF16", "DOUBLE"):
        return None
    order = concrete_arg(op, 1) if len(op.types) > 1 else 2
    if order is None:
        order = 2  # ``norm(x, None)`` is the 2-norm
    if isinstance(order, bool) or not isinstance(order, (int, float)) or float(order) != ORDER:
        return None
    dtype = x.dtype
    if op.name == "aten::linalg_vector_norm":
        if len(op.types) != 5 or concrete_arg(op, 2) not in (None, []) or concrete_arg(op, 3) is True:
            return None  # a reduction over some dims, or keepdim: not a 0-d row
        code = concrete_arg(op, 4)
        if isinstance(code, int) and not isinstance(code, bool):
            dtype = SCALAR_TYPE_CODES.get(code, dtype)
    elif len(op.types) > 2:
        return None  # ``norm`` with dims or a dtype
    return MappedOp("LpNormV2", (Slot(x.shape, x.dtype),), (Slot((), dtype),))


# ----------------------------------------------------------------------------- replay
class LpNormV2Replay(ScalarAwareReplay):
    kernel_types = ("LpNormV2",)
    npu_api = "torch.linalg.vector_norm"
    trace_ops = MappingProxyType(
        {"aten::linalg_vector_norm": _trace_vector_norm, "aten::norm": _trace_vector_norm}
    )

    def operands(self, row: KernelRow) -> tuple[TensorSpec, TensorSpec]:
        x, out = one_input_one_output(row)
        if x.dtype not in FLOATING:
            raise CaseBuildError(f"{row.kernel_type} input dtype {x.dtype} is not floating")
        if out.shape != ():
            raise CaseBuildError(
                f"{row.kernel_type} output {shape_text(out)} is not 0-d: only whole-tensor norms are replayed "
                "(the reduced dims of a partial norm are not recorded)"
            )
        same = DTYPES[out.dtype][0] == DTYPES[x.dtype][0] if out.dtype in DTYPES else False
        if not same and not (x.dtype in HALF and DTYPES.get(out.dtype, ("",))[0] == "float32"):
            raise CaseBuildError(
                f"{row.kernel_type} output dtype {out.dtype} is neither the input's {x.dtype} nor FLOAT "
                "of a half-precision input"
            )
        return x, out

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        x, out = self.operands(row)
        widen = DTYPES[out.dtype][0] != DTYPES[x.dtype][0]
        return self.random(x, device, generator), ORDER, out.torch_dtype() if widen else None

    def run(self, x: "torch.Tensor", order: float, dtype: "torch.dtype | None") -> "torch.Tensor":
        import torch

        rows = math.gcd(x.numel(), CPU_ROWS)
        if x.device.type != "cpu" or rows == 1 or x.numel() < CPU_SPLIT_FROM:
            norm: torch.Tensor = torch.linalg.vector_norm(x, order, dtype=dtype)
            return norm
        # torch's CPU norm kernel accumulates sequentially in the input's precision: the float32
        # 2-norm of the 220M-element row comes out 1.8% low.  On the CPU only, the norms of
        # ``rows`` equal slices, then the norm of those, keep every sequential sum short.
        partial = torch.linalg.vector_norm(x.reshape(rows, -1), order, dim=1, dtype=dtype)
        total: torch.Tensor = torch.linalg.vector_norm(partial, order)
        return total

    def reference(self, x: "torch.Tensor", order: float, dtype: "torch.dtype | None") -> "torch.Tensor":
        import torch

        flat = x.detach().reshape(-1)
        total = torch.zeros((), dtype=torch.float64)
        for start in range(0, flat.numel(), REFERENCE_CHUNK):
            chunk = flat[start : start + REFERENCE_CHUNK].to("cpu", torch.float64, copy=True)  # never x itself
            total += chunk.abs_().pow_(order).sum()
        return total.pow(1.0 / order)
