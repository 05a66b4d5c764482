"""MatMul family replays: ``MatMulV2``/``MatMulV3``/``MatMulCommon`` and ``BatchMatMulV2``.

Profilers record each operand in its stored layout: ``A`` as ``[M,K]`` or ``[K,M]``, ``B`` as
``[K,N]`` or ``[N,K]`` (an ``nn.Linear`` weight is ``[N,K]``), with the output ``[M,N]`` and an
optional bias ``[N]`` in the third slot.  The layout is deduced from the shapes and the operand
is built contiguous in that layout, then handed to ``mm`` as a ``.t()`` view, so the kernel reads
memory the way the recorded one did.  When several layouts fit (square operands), the first of
NT, NN, TT, TN wins: ``A`` as ``[M,K]`` and ``B`` as ``[N,K]``, the layout of a linear layer
(``x @ W.t()`` with the weight ``[out, in]``), which is the signature's canonical ``M,K;N,K``
form too.  (On an H100 a 4096x4096 projection replayed as NN ran another kernel, 14% faster
than the model's NT one.)  A row that records strides (a PyTorch trace's view) holds its
operands as the kernel read them: they are built with those strides and multiplied as they are.

The reference is the same call on float64 copies of the operands: on a CUDA device where the
inputs live (``OpReplay.reference_on_device``; the runner counts the copies against the free
memory and falls back to the host when they would not fit), else on the CPU.

Formats are not reproduced (plain torch tensors are ND); a private-format slot that records a
storage shape (``FRACTAL_NZ`` tiles) fails the shape consistency check with its reason.

Trace ingest: ``mm``, ``addmm``, ``linear`` and ``matmul`` of 2-D operands (or an N-D input
times a 2-D weight, one 2-D GEMM over ``prod(leading dims)`` rows) become ``MatMulV2`` rows
``x1;x2[;bias]``; ``bmm`` and ``matmul`` of two 3-D operands with one batch size become
``BatchMatMulV2`` rows.  GEMMs are the primary rows of wrapper operators (``einsum``).
"""

from __future__ import annotations

import math
from abc import abstractmethod
import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from perf_plugin.database.shapes import Shape
from perf_plugin.database.signature import SignatureRule
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.tensors import FLOATING, KernelRow, TensorSpec, shape_text
from perf_plugin.replay.value_draws import recorded_zero_shares, with_zero_share
from perf_plugin.trace.args import tensor_arg
from perf_plugin.trace.events import TraceOp
from perf_plugin.trace.mapped import MappedOp, Slot

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class MatmulLayout:
    """How the two operands of ``out[M,N] = A @ B`` are stored."""

    m: int
    k: int
    n: int
    a_transposed: bool  # A stored as [K,M]
    b_transposed: bool  # B stored as [N,K]

    @property
    def name(self) -> str:
        return ("T" if self.a_transposed else "N") + ("T" if self.b_transposed else "N")


def matmul_layout(a: Shape, b: Shape, out: Shape) -> MatmulLayout | None:
    """The first layout (NT, NN, TT, TN) under which ``a``, ``b`` multiply into ``out``."""
    m, n = out
    for a_t in (False, True):
        for b_t in (True, False):
            a_m, a_k = (a[1], a[0]) if a_t else (a[0], a[1])
            b_k, b_n = (b[1], b[0]) if b_t else (b[0], b[1])
            if a_m == m and b_n == n and a_k == b_k:
                return MatmulLayout(m, a_k, n, a_t, b_t)
    return None


def broadcast_shapes(*shapes: Shape) -> Shape | None:
    """Numpy broadcasting of ``shapes`` (None if they do not broadcast)."""
    width = max((len(s) for s in shapes), default=0)
    result: list[int] = []
    for position in range(width):
        size = 1
        for shape in shapes:
            offset = position - (width - len(shape))
            dim = shape[offset] if offset >= 0 else 1
            if dim != 1:
                if size not in (1, dim):
                    return None
                size = dim
        result.append(size)
    return tuple(result)


def _operands(row: KernelRow) -> tuple[TensorSpec, TensorSpec, TensorSpec | None, TensorSpec]:
    """Split a row into (a, b, bias or None, out), rejecting unexpected slots."""
    inputs = row.inputs
    if len(inputs) < 2 or inputs[0].shape is None or inputs[1].shape is None:
        raise CaseBuildError(
            f"{row.kernel_type} needs two operand slots, got input shapes "
            + ";".join(shape_text(s.shape) for s in inputs)
        )
    bias = inputs[2] if len(inputs) > 2 and inputs[2].present else None
    extra = [i for i, s in enumerate(inputs[3:], start=3) if s.present]
    if extra:
        raise CaseBuildError(
            f"{row.kernel_type} input slot {extra[0]} is present; only operands and an optional bias "
            "(slots 0-2) are replayed (quantisation scales/offsets are not)"
        )
    outputs = row.present_outputs
    if len(outputs) != 1:
        raise CaseBuildError(f"{row.kernel_type} needs exactly one output, got {len(outputs)}")
    return inputs[0], inputs[1], bias, outputs[0]


def _check_dtypes(
    row: KernelRow, a: TensorSpec, b: TensorSpec, bias: TensorSpec | None, out: TensorSpec
) -> None:
    if a.dtype not in FLOATING or b.dtype not in FLOATING:
        raise CaseBuildError(
            f"{row.kernel_type} operands are {a.dtype}/{b.dtype}; only floating-point matmuls are "
            "replayed (integer matmuls need quantisation parameters the row does not record)"
        )
    if a.dtype != b.dtype:
        raise CaseBuildError(f"{row.kernel_type} operand dtypes differ ({a.dtype} vs {b.dtype})")
    if out.dtype != a.dtype:
        raise CaseBuildError(
            f"{row.kernel_type} output dtype {out.dtype} differs from operand dtype {a.dtype}; "
            "torch matmuls write the operand dtype"
        )
    if bias is not None and bias.dtype != a.dtype:
        raise CaseBuildError(
            f"{row.kernel_type} bias dtype {bias.dtype} differs from operand dtype {a.dtype}"
        )


def _matrix_layout(row: KernelRow, a: Shape, b: Shape, out: Shape, which: str = "") -> MatmulLayout:
    """The layout of the last two dims of ``a`` and ``b`` that gives those of ``out``, else
    CaseBuildError (``which`` names those dims in the message where the shapes have more)."""
    layout = matmul_layout(a[-2:], b[-2:], out[-2:])
    if layout is None:
        raise CaseBuildError(
            f"{row.kernel_type} shapes are inconsistent: no layout of A {shape_text(a)} and "
            f"B {shape_text(b)} ({which}[M,K] or [K,M], [K,N] or [N,K]) gives the output {shape_text(out)}"
        )
    return layout


def _stored(
    spec: TensorSpec, transposed: bool, replay: OpReplay, device: "torch.device", generator: "torch.Generator"
) -> "torch.Tensor":
    """A contiguous tensor in the recorded layout, viewed as the logical operand."""
    tensor = replay.random(spec, device, generator)
    return tensor.transpose(-1, -2) if transposed else tensor


# ----------------------------------------------------------------------------- trace ingest
def _gemm_out(a: Shape, b: Shape) -> Shape | None:
    if len(a) == 2 and len(b) == 2 and a[1] == b[0]:
        return (a[0], b[1])
    return None


def _trace_mm(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    a, b = tensor_arg(op, 0), tensor_arg(op, 1)
    if a is None or b is None:
        return None
    out = _gemm_out(a.shape, b.shape)
    if out is None:
        return None
    return MappedOp("MatMulV2", (Slot(a.shape, a.dtype), Slot(b.shape, b.dtype)), (Slot(out, a.dtype),))


def _trace_addmm(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    bias, a, b = tensor_arg(op, 0), tensor_arg(op, 1), tensor_arg(op, 2)
    if a is None or b is None or bias is None:
        return None
    out = _gemm_out(a.shape, b.shape)
    if out is None:
        return None
    slots = (Slot(a.shape, a.dtype), Slot(b.shape, b.dtype), Slot(bias.shape, bias.dtype))
    return MappedOp("MatMulV2", slots, (Slot(out, a.dtype),))


def _trace_linear(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    x, weight, bias = tensor_arg(op, 0), tensor_arg(op, 1), tensor_arg(op, 2)
    if x is None or weight is None or x.rank < 2 or weight.rank != 2 or x.shape[-1] != weight.shape[1]:
        return None
    rows = math.prod(x.shape[:-1])
    slots = [Slot((rows, x.shape[-1]), x.dtype), Slot(weight.shape, weight.dtype)]
    if bias is not None:
        slots.append(Slot(bias.shape, bias.dtype))
    return MappedOp("MatMulV2", tuple(slots), (Slot((rows, weight.shape[0]), x.dtype),))


def _trace_matmul(op: TraceOp, descendants: list[TraceOp]) -> MappedOp | None:
    a, b = tensor_arg(op, 0), tensor_arg(op, 1)
    if a is None or b is None:
        return None
    if a.rank == 2 and b.rank == 2:
        return _trace_mm(op, descendants)
    if a.rank > 2 and b.rank == 2 and a.shape[-1] == b.shape[0]:
        rows = math.prod(a.shape[:-1])
        return MappedOp(
            "MatMulV2",
            (Slot((rows, a.shape[-1]), a.dtype), Slot(b.shape, b.dtype)),
            (Slot((rows, b.shape[1]), a.dtype),),
        )
    if a.rank == 3 and b.rank == 3:
        return _trace_bmm(op, descendants)
    return None


def _trace_bmm(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    a, b = tensor_arg(op, 0), tensor_arg(op, 1)
    if a is None or b is None or a.rank != 3 or b.rank != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        return None
    out = (a.shape[0], a.shape[1], b.shape[2])
    return MappedOp("BatchMatMulV2", (Slot(a.shape, a.dtype), Slot(b.shape, b.dtype)), (Slot(out, a.dtype),))


# ----------------------------------------------------------------------------- replays
class _MatmulFamily(OpReplay):
    """What the 2-D and batched matmul replays share: bias check, dtype check, inputs (stored
    operands, then the bias and what goes with it), and the float64 reference on the inputs'
    device where it has float64 GEMMs (CUDA): the same product as on the host, in milliseconds
    instead of seconds for a prefill-sized row; NPUs and the CPU keep the host reference."""

    reference_on_device = True

    @abstractmethod
    def core_layout(self, row: KernelRow, a: Shape, b: Shape, out: Shape) -> MatmulLayout:
        """The operand layout from the shapes; raises CaseBuildError when none fits."""

    def layout(self, row: KernelRow) -> MatmulLayout:
        a, b, bias, out = _operands(row)
        assert a.shape is not None and b.shape is not None and out.shape is not None
        layout = self.core_layout(row, a.shape, b.shape, out.shape)
        if (a.strides is not None or b.strides is not None) and (layout.a_transposed or layout.b_transposed):
            # recorded strides: the shapes are the logical operands, read in place as they are
            nn = dataclasses.replace(layout, a_transposed=False, b_transposed=False)
            if a.shape[-1] != b.shape[-2]:
                raise CaseBuildError(
                    f"{row.kernel_type} operands with recorded strides must be the logical [M,K] and [K,N], "
                    f"got {shape_text(a.shape)} and {shape_text(b.shape)}"
                )
            layout = nn
        if bias is not None:
            assert bias.shape is not None
            if broadcast_shapes(bias.shape, out.shape) != out.shape:
                raise CaseBuildError(
                    f"{row.kernel_type} bias {shape_text(bias.shape)} does not broadcast to the output "
                    f"{shape_text(out.shape)}"
                )
        return layout

    def check(self, row: KernelRow) -> None:
        self.layout(row)
        _check_dtypes(row, *_operands(row))

    def stored_operands(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple["torch.Tensor", "torch.Tensor"]:
        self.check(row)
        layout = self.layout(row)
        a, b, _, _ = _operands(row)
        return (
            _stored(a, layout.a_transposed, self, device, generator),
            _stored(b, layout.b_transposed, self, device, generator),
        )

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        first, second = self.stored_operands(row, device, generator)
        if self.zero_share_inputs:  # zero operands, where a capture recorded them (Llama 4's experts)
            shares = recorded_zero_shares(row)
            first = with_zero_share(first, shares[0] if shares else None, generator)
            second = with_zero_share(second, shares[1] if len(shares) > 1 else None, generator)
        operands = (first, second)
        a, b, bias, _ = _operands(row)
        if bias is None:
            return operands
        return operands + (self.random(bias, device, generator),) + self.bias_options(a, b)

    def bias_options(self, a: TensorSpec, b: TensorSpec) -> tuple[Any, ...]:
        """What ``run`` takes after a bias, decided from the operands (nothing by default)."""
        return ()


class MatMulReplay(_MatmulFamily):
    """2-D matmul: ``A[M,K] @ B[K,N] (+ bias[N])`` through ``mm`` / ``addmm``."""

    kernel_types = ("MatMulV2", "MatMulV3", "MatMulCommon")
    family = "MatMul"  # which of the three the library runs for a shape is its choice
    signature_rule = SignatureRule(canonical_matmul=True)
    npu_api = "torch.mm"
    trace_primary = True
    trace_ops = MappingProxyType(
        {"aten::mm": _trace_mm, "aten::addmm": _trace_addmm, "aten::linear": _trace_linear, "aten::matmul": _trace_matmul}
    )

    def core_layout(self, row: KernelRow, a: Shape, b: Shape, out: Shape) -> MatmulLayout:
        if len(a) != 2 or len(b) != 2 or len(out) != 2:
            raise CaseBuildError(
                f"{row.kernel_type} operands and output must be 2-D, got {shape_text(a)} @ {shape_text(b)} -> {shape_text(out)}"
            )
        return _matrix_layout(row, a, b, out)

    def parameters(self, row: KernelRow, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """A 2-D GEMM in a model is a linear layer (trace ingest maps ``linear``, ``addmm`` and
        ``mm`` here): ``B`` is its weight, and a bias too."""
        return (args[1], *args[2:3])

    def run(self, a: "torch.Tensor", b: "torch.Tensor", bias: "torch.Tensor | None" = None) -> "torch.Tensor":
        if bias is None:
            return a.mm(b)
        return bias.addmm(a, b)


class BatchMatMulReplay(_MatmulFamily):
    """Batched matmul ``A[...,M,K] @ B[...,K,N] (+ bias)`` with broadcast batch dims."""

    kernel_types = ("BatchMatMulV2",)
    npu_api = "torch.bmm"
    zero_share_inputs = (0, 1)  # zero operands run faster (``make_inputs`` zeroes the recorded share)
    trace_primary = True
    trace_ops = MappingProxyType({"aten::bmm": _trace_bmm})

    def core_layout(self, row: KernelRow, a: Shape, b: Shape, out: Shape) -> MatmulLayout:
        if len(a) < 2 or len(b) < 2 or len(out) < 2:
            raise CaseBuildError(
                f"{row.kernel_type} operands and output need at least 2 dims, got {shape_text(a)} @ "
                f"{shape_text(b)} -> {shape_text(out)}"
            )
        batch = broadcast_shapes(a[:-2], b[:-2])
        if batch is None or batch != out[:-2]:
            raise CaseBuildError(
                f"{row.kernel_type} batch dims are inconsistent: {shape_text(a[:-2])} and "
                f"{shape_text(b[:-2])} do not broadcast to the output batch {shape_text(out[:-2])}"
            )
        return _matrix_layout(row, a, b, out, "last two dims ")

    def bias_options(self, a: TensorSpec, b: TensorSpec) -> tuple[Any, ...]:
        assert a.shape is not None and b.shape is not None
        # baddbmm fuses the bias when both operands are 3-D with one batch size; other
        # broadcast patterns go through matmul + an in-place add (two kernels).
        fused = len(a.shape) == 3 and len(b.shape) == 3 and a.shape[0] == b.shape[0]
        return (fused,)

    def run(
        self, a: "torch.Tensor", b: "torch.Tensor", bias: "torch.Tensor | None" = None, fused: bool = False
    ) -> "torch.Tensor":
        if bias is None:
            return a.matmul(b)
        if fused:
            return bias.baddbmm(a, b)
        return a.matmul(b).add_(bias)
