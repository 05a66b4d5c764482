"""Replays of kernels that write constants: ``Range``, ``ZerosLike``, ``OnesLike``; and ``MemSet``.

Row layouts (the real Level2 training profile, CANN 8.3; the kernel names carry the aclnn call):

* ``Range`` ``";;"`` DOUBLE;DOUBLE;DOUBLE -> ``"4096"`` FLOAT (``aclnnArange_ArangeAiCore_Range``):
  start, end and step are host scalars (0-d slots, their values not recorded) and the output is
  the sequence, here the positions of a rotary embedding (``torch.arange(seq_len, dtype=float32)``).
  The replay uses start 0 and step 1, so end is the output length; the scalars are Python floats
  when their slots are floating (as recorded: DOUBLE) and ints otherwise.  API ``torch.arange``
  (op-plugin: ``arange`` -> ``aclnnArange``).
* ``ZerosLike`` ``x -> y`` of one shape and dtype (``aclnnInplaceZero_ZerosLikeAiCore_ZerosLike``):
  ``"375815680"`` FLOAT is 1.5 GB, most likely the contiguous gradient buffer Megatron's
  data-parallel wrapper zeroes before each step accumulates into it; the ``"4096,1,8,128"``
  DT_BF16 rows are activation-sized buffers.  op-plugin runs ``aclnnInplaceZero``
  for ``zero_``, ``zeros`` (and so ``zeros_like``, which is ``empty_like`` + ``zero_``); the
  replay zeroes the input in place: ``torch.Tensor.zero_``.
* ``OnesLike`` ``"1"`` FLOAT -> ``"1"`` FLOAT (``aclnnInplaceOne_OnesLikeAiCore_OnesLike``):
  ``torch.ones_like`` (op-plugin: ``one_``/``ones``/``ones_like`` -> ``aclnnInplaceOne``).
* ``MemSet`` ``N/A -> N/A``: no tensors recorded.  It is the memory clear the runtime launches
  ahead of a kernel that accumulates into its output (``aclnnEmbeddingDenseBackward_
  EmbeddingDenseGradV2_MemSet`` clears the ``[num_weights, dim]`` gradient that
  ``EmbeddingDenseGradV2`` adds rows into; ``aclnnNonzeroV2_NonzeroAiCore_MemSet`` the output of
  ``NonZero``).  Both collapse into one row whose size and owner are unknown, so no replay can
  measure it faithfully: ``check`` says so.  (On an NPU the clear still runs, as a kernel of its
  own, whenever ``EmbeddingDenseGradV2`` is replayed through ``aclnnEmbeddingDenseBackward``.)

Verification is exact: ``ZerosLike``/``OnesLike`` against a broadcast constant (no second copy of
a 1.5 GB tensor), ``Range`` against ``arange`` in float64 rounded to the output dtype.

Trace ingest: ``aten::arange``, ``aten::zeros_like`` / ``zero_`` / ``zeros``, ``aten::ones_like`` /
``ones`` become rows of these layouts.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.kernels.elementwise import (
    ScalarAwareReplay,
    one_input_one_output,
    scalar_aware_inputs,
    scalar_aware_outputs,
)
from perf_plugin.replay.tensors import DTYPES, FLOATING, KernelRow, TensorSpec, shape_text
from perf_plugin.trace.args import DEFAULT_FLOAT, SCALAR_TYPE_CODES, concrete_arg, is_int_list, tensor_arg
from perf_plugin.trace.events import TraceOp
from perf_plugin.trace.mapped import MappedOp, Slot, TraceMapper

if TYPE_CHECKING:
    import torch


# What the buffers hold before ZerosLike / OnesLike overwrite them (a BOOL buffer holds True).
FILL_CONTENT = 3


# ----------------------------------------------------------------------------- trace ingest
def _dtype_code(op: TraceOp, index: int) -> str:
    code = concrete_arg(op, index)
    return SCALAR_TYPE_CODES.get(code, "") if isinstance(code, int) and not isinstance(code, bool) else ""


def _trace_arange(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    """``arange(end, dtype, ...)``, ``arange(start, end, dtype, ...)`` or ``arange(start, end,
    step, dtype, ...)`` (5, 6 or 7 arguments; the ``.out`` forms end in a tensor and are skipped)."""
    count = len(op.types)
    if count not in (5, 6, 7) or any(tensor_arg(op, i) is not None for i in range(count)):
        return None
    scalars = [concrete_arg(op, i) for i in range(count - 4)]
    if not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in scalars):
        return None
    start, end, step = (0, scalars[0], 1) if count == 5 else (scalars[0], scalars[1], scalars[2] if count == 7 else 1)
    if step == 0:
        return None
    length = max(0, -int(-(end - start) // step))  # ceil((end - start) / step)
    integral = all(isinstance(s, int) for s in (start, end, step))
    dtype = _dtype_code(op, count - 4) or ("INT64" if integral else DEFAULT_FLOAT)
    # aclnnArange's scalars: DOUBLE for a floating output, as the real row records them.
    scalar = "DOUBLE" if dtype in ("FLOAT", "FLOAT16", "DT_BF16", "DOUBLE") else "INT64"
    return MappedOp("Range", (Slot(None, scalar),) * 3, (Slot((length,), dtype),))


def _trace_like(kernel_type: str, dtype_index: int | None) -> TraceMapper:
    """``zeros_like(x, dtype...)`` / ``zero_(x)``: the filled tensor is the row's input and output."""

    def mapper(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
        x = tensor_arg(op, 0)
        if x is None or not x.dtype:
            return None
        dtype = (_dtype_code(op, dtype_index) if dtype_index is not None else "") or x.dtype
        return MappedOp(kernel_type, (Slot(x.shape, dtype),), (Slot(x.shape, dtype),))

    return mapper


def _trace_factory(kernel_type: str) -> TraceMapper:
    """``zeros(size, dtype, ...)`` / ``ones(size, dtype, ...)``: the new tensor, filled in place."""

    def mapper(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
        size = concrete_arg(op, 0)
        if not is_int_list(size) or len(op.types) != 5:
            return None
        shape = tuple(size)
        dtype = _dtype_code(op, 1) or DEFAULT_FLOAT
        return MappedOp(kernel_type, (Slot(shape, dtype),), (Slot(shape, dtype),))

    return mapper


# ----------------------------------------------------------------------------- replays
class RangeReplay(ScalarAwareReplay):
    """``Range``: ``torch.arange(start, end, step, dtype=...)`` with start 0 and step 1."""

    kernel_types = ("Range",)
    npu_api = "torch.arange"
    trace_ops = MappingProxyType({"aten::arange": _trace_arange})

    def operands(self, row: KernelRow) -> tuple[tuple[TensorSpec, ...], TensorSpec]:
        scalars = scalar_aware_inputs(row)
        outputs = scalar_aware_outputs(row)
        if len(scalars) != 3 or any(s.shape != () for s in scalars):
            raise CaseBuildError(
                f"{row.kernel_type} needs three scalar input slots start;end;step (empty shapes), got "
                + ";".join(shape_text(s) for s in scalars)
            )
        if any(s.dtype == "BOOL" for s in scalars):
            raise CaseBuildError(f"{row.kernel_type} scalars must be numbers, got dtype BOOL")
        if len(outputs) != 1 or outputs[0].shape is None or len(outputs[0].shape) != 1:
            raise CaseBuildError(
                f"{row.kernel_type} needs one 1-d output, got " + ";".join(shape_text(o) for o in outputs)
            )
        if outputs[0].dtype == "BOOL":
            raise CaseBuildError(f"{row.kernel_type} output dtype BOOL is not a number sequence")
        return scalars, outputs[0]

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        scalars, out = self.operands(row)
        assert out.shape is not None
        length = out.shape[0]
        if scalars[0].dtype in FLOATING:
            return 0.0, float(length), 1.0, out.torch_dtype(), device
        return 0, length, 1, out.torch_dtype(), device

    def run(
        self, start: float, end: float, step: float, dtype: "torch.dtype", device: "torch.device"
    ) -> "torch.Tensor":
        import torch

        return torch.arange(start, end, step, dtype=dtype, device=device)

    def reference(
        self, start: float, end: float, step: float, dtype: "torch.dtype", device: "torch.device"
    ) -> "torch.Tensor":
        import torch

        return torch.arange(start, end, step, dtype=torch.float64).to(dtype)

    def tolerance(self, output: TensorSpec) -> float:
        return 0.0  # start + i * step, rounded once to the output dtype


class _FillReplay(ScalarAwareReplay):
    """``x -> y`` of one shape and dtype, every element ``value``; verified exactly."""

    value: ClassVar[int] = 0

    def operands(self, row: KernelRow) -> TensorSpec:
        x, out = one_input_one_output(row)
        if (out.shape, out.dtype) != (x.shape, x.dtype):
            raise CaseBuildError(
                f"{row.kernel_type} output {shape_text(out)} {out.dtype} differs from the input "
                f"{shape_text(x)} {x.dtype}"
            )
        if x.dtype not in DTYPES:
            raise CaseBuildError(f"{row.kernel_type} input has unknown dtype {x.dtype!r}")
        return x

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        import torch

        # Contents other than the value written, so that a kernel that skips elements fails.
        # The values do not change what the kernel does, and a constant costs one pass where
        # random values cost three (3 s for the 1.5 GB buffer on a 2-core CPU).
        spec = self.operands(row)
        assert spec.shape is not None
        return (torch.full(spec.shape, FILL_CONTENT, dtype=spec.torch_dtype(), device=device),)

    def reference(self, x: "torch.Tensor") -> "torch.Tensor":
        import torch

        # A broadcast 0-d constant: the right values at the output's shape without a second copy
        # of a 1.5 GB buffer (flattening it for the comparison is a view too).
        return torch.full((), self.value, dtype=x.dtype).expand(x.shape)

    def tolerance(self, output: TensorSpec) -> float:
        return 0.0


class ZerosLikeReplay(_FillReplay):
    kernel_types = ("ZerosLike",)
    npu_api = "torch.Tensor.zero_"
    value = 0
    trace_ops = MappingProxyType(
        {
            "aten::zeros_like": _trace_like("ZerosLike", 1),
            "aten::zero_": _trace_like("ZerosLike", None),
            "aten::zeros": _trace_factory("ZerosLike"),
        }
    )

    def run(self, x: "torch.Tensor") -> "torch.Tensor":
        return x.zero_()


class OnesLikeReplay(_FillReplay):
    kernel_types = ("OnesLike",)
    npu_api = "torch.ones_like"
    value = 1
    trace_ops = MappingProxyType(
        {"aten::ones_like": _trace_like("OnesLike", 1), "aten::ones": _trace_factory("OnesLike")}
    )

    def run(self, x: "torch.Tensor") -> "torch.Tensor":
        import torch

        return torch.ones_like(x)


class MemSetReplay(OpReplay):
    """``MemSet``: recorded without tensors, so nothing says what to clear; never replayed."""

    kernel_types = ("MemSet",)
    # The aclnn call that launched the larger of the two real MemSet records (the 622 MB clear
    # of EmbeddingDenseGradV2's output); aclnnNonzeroV2 (``torch.nonzero``) launches the other.
    npu_api = "torch.ops.aten.embedding_dense_backward"
    portable = False

    def check(self, row: KernelRow) -> NoReturn:
        recorded = [s for s in (*row.inputs, *row.outputs) if s.present]
        what = (
            "records no tensors (Input and Output Shapes are N/A)"
            if not recorded
            else "records " + ";".join(shape_text(s) for s in recorded) + " but not which kernel it clears for"
        )
        raise CaseBuildError(
            f"{row.kernel_type} {what}: it is the memory clear the runtime launches before a kernel that "
            "accumulates into its output (EmbeddingDenseGradV2's gradient in aclnnEmbeddingDenseBackward, "
            "NonZero's output in aclnnNonzeroV2), and the row says neither how many bytes it clears nor for "
            "which call, so no replay can measure it faithfully"
        )

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        self.check(row)

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        self.check(row)

    def run(self, *args: Any) -> NoReturn:
        raise CaseBuildError("MemSet has no replay (see check)")
