"""Data-movement replays: ``Transpose``, ``Slice``, ``GatherV2``, ``TensorMove``, ``ConcatD``.

Their outputs are copies of input elements, so they are verified bit-exact (tolerance 0) against
the same movement done on CPU copies in the native dtype (no float64 upcast: a ``[151936,1024]``
embedding table would otherwise cost 1.2 GB for nothing).

The host values these kernels take as inputs (Transpose ``perm``, Slice ``offsets``/``size``,
GatherV2 ``axis``) are recorded as shapes only, never as values; they are derived from the
shapes:

* ``Transpose``: the permutation that maps input slot 0 onto the output shape; when dims repeat,
  the lexicographically first one (``[1,6,6,8192] -> [8192,1,6,6]`` is ``(3,0,1,2)``, not
  ``(3,0,2,1)``: both move the same bytes).
* ``Slice``: offsets 0 and sizes = the output shape.
* ``GatherV2``: the first axis ``a`` with ``out == x[:a] + indices + x[a+1:]``; indices are
  random in range.
* ``ConcatD``: the one axis along which the inputs add up to the output.

Strided views (the permuted or sliced input) are built once in ``make_inputs``; ``run`` is the
copy alone, written into a preallocated output so a real copy kernel always runs (``contiguous()``
would launch nothing for a slice along the leading dim or a permutation of unit dims).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from perf_plugin.database.signature import SignatureRule
from perf_plugin.replay.api_call import ApiCall, NpuFormat
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.kernels._layout import concat_axis, derive_perm, gather_axis
from perf_plugin.replay.kernels.elementwise import scalar_aware_inputs
from perf_plugin.replay.tensors import KernelRow, TensorSpec, shape_text
from perf_plugin.trace.args import Tensor, concrete_arg, tensor_arg, tensor_list_arg
from perf_plugin.trace.events import TraceOp
from perf_plugin.trace.mapped import MappedOp, Slot

if TYPE_CHECKING:
    import torch

Shape = tuple[int, ...]
INDEX_DTYPES = frozenset({"INT32", "INT64"})


def _cpu_copy(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    return value


# ----------------------------------------------------------------------------- trace ingest
def _trace_cat(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    """``cat``: the output adds up the inputs along ``dim``.  The profiler records no dtypes for
    tensors passed in a list; those dtype slots are left empty rather than guessed, unless an
    execution trace gave them (``TraceOp.list_dtypes``): the output then has the inputs' dtype
    where they share one."""
    tensors = tensor_list_arg(op, 0)
    if not tensors:
        return None
    # Legacy behaviour: 1-D empty tensors are skipped by cat.
    shaped = [t for t in tensors if t.shape != (0,)] or tensors
    rank = shaped[0].rank
    dim = concrete_arg(op, 1)
    dim = 0 if dim is None else dim
    outputs: tuple[Slot, ...] = ()
    if isinstance(dim, int) and rank > 0 and all(t.rank == rank for t in shaped):
        dim = dim % rank
        out = list(shaped[0].shape)
        out[dim] = sum(t.shape[dim] for t in shaped)
        dtypes = {t.dtype for t in shaped}
        outputs = (Slot(tuple(out), dtypes.pop() if len(dtypes) == 1 else ""),)
    # the strides of the listed inputs choose the kernel: cat of views (a rotate-half of q/k
    # slices) takes the generic copy, of contiguous tensors the vectorized batched copy
    strides = tuple(t.strides for t in tensors)
    return MappedOp("ConcatD", tuple(Slot(t.shape, t.dtype) for t in tensors), outputs, strides=strides)


def _gather(weight: Tensor, indices: Tensor) -> MappedOp:
    """``GatherV2`` is ``x;indices;axis`` with ``axis`` a 1-element INT64 tensor."""
    out = indices.shape + weight.shape[1:]
    return MappedOp(
        "GatherV2",
        (Slot(weight.shape, weight.dtype), Slot(indices.shape, indices.dtype), Slot((1,), "INT64")),
        (Slot(out, weight.dtype),),
    )


def _trace_embedding(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    weight, indices = tensor_arg(op, 0), tensor_arg(op, 1)
    if weight is None or indices is None or weight.rank != 2:
        return None
    return _gather(weight, indices)


def _trace_index_select(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    x, dim, index = tensor_arg(op, 0), concrete_arg(op, 1), tensor_arg(op, 2)
    if x is None or index is None or not isinstance(dim, int) or x.rank == 0:
        return None
    if dim % x.rank != 0:
        return None
    return _gather(x, index)


def _trace_tensor_move(op: TraceOp, descendants: list[TraceOp]) -> MappedOp | None:
    """``clone``, and ``contiguous`` when it copies."""
    x = tensor_arg(op, 0)
    if x is None:
        return None
    if op.name == "aten::contiguous" and not any(d.name in ("aten::clone", "aten::copy_") for d in descendants):
        return None
    return MappedOp("TensorMove", (Slot(x.shape, x.dtype),), (Slot(x.shape, x.dtype),))


# ----------------------------------------------------------------------------- replays
class _DataMovementReplay(OpReplay):
    """Exact verification against the same movement on CPU copies."""

    def tolerance(self, output: TensorSpec) -> float:
        return 0.0

    def reference(self, *args: Any) -> "torch.Tensor | tuple[torch.Tensor, ...]":
        return self.run(*[_cpu_copy(a) for a in args])

    @staticmethod
    def single_output(row: KernelRow, source: TensorSpec) -> TensorSpec:
        outputs = row.present_outputs
        if len(outputs) != 1:
            raise CaseBuildError(f"{row.kernel_type} needs exactly one output, got {len(outputs)}")
        if outputs[0].dtype != source.dtype:
            raise CaseBuildError(
                f"{row.kernel_type} output dtype {outputs[0].dtype} differs from the input dtype "
                f"{source.dtype}"
            )
        return outputs[0]

    def run(self, source: "torch.Tensor", out: "torch.Tensor") -> "torch.Tensor":
        return out.copy_(source)


def _host_vector(row: KernelRow, index: int, name: str, rank: int) -> None:
    """Validate an optional host-vector slot (perm, offsets, size): ``[rank]`` integers."""
    if index >= len(row.inputs) or not row.inputs[index].present:
        return
    spec = row.inputs[index]
    if spec.shape != (rank,):
        raise CaseBuildError(
            f"{row.kernel_type} {name} (input slot {index}) has shape {shape_text(spec.shape)}, "
            f"expected [{rank}] for a {rank}-d input"
        )
    if spec.dtype not in INDEX_DTYPES:
        raise CaseBuildError(
            f"{row.kernel_type} {name} (input slot {index}) has dtype {spec.dtype}, expected INT32/INT64"
        )


def _source(row: KernelRow, slots: int) -> TensorSpec:
    if not row.inputs or not row.inputs[0].present:
        raise CaseBuildError(f"{row.kernel_type} input slot 0 is empty")
    extra = [i for i, s in enumerate(row.inputs[slots:], start=slots) if s.present]
    if extra:
        raise CaseBuildError(f"{row.kernel_type} has an unexpected input in slot {extra[0]}")
    return row.inputs[0]


class TransposeReplay(_DataMovementReplay):
    """``Transpose(x, perm)``: ``out.copy_(x.permute(perm))``."""

    kernel_types = ("Transpose",)
    signature_rule = SignatureRule(input_slots=1)  # the permutation is a host value
    # op-plugin runs the ``Transpose`` op on ``x;perm``; a view copy picks its kernel itself
    npu_api = "torch_npu.npu_transpose"

    def perm(self, row: KernelRow) -> tuple[int, ...]:
        x = _source(row, 2)
        out = self.single_output(row, x)
        assert x.shape is not None
        _host_vector(row, 1, "perm", len(x.shape))
        perm = derive_perm(x.shape, out.shape or ())
        if perm is None:
            raise CaseBuildError(
                f"{row.kernel_type} output {shape_text(out.shape)} is not a permutation of the input "
                f"{shape_text(x.shape)}"
            )
        return perm

    def check(self, row: KernelRow) -> None:
        self.perm(row)

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        perm = self.perm(row)
        x = self.random(row.inputs[0], device, generator)
        return x.permute(perm), self.random(row.present_outputs[0], device, generator)

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        perm = self.perm(row)
        inverse = sorted(range(len(perm)), key=perm.__getitem__)
        x = args[0].permute(inverse)  # the contiguous input behind the permuted view
        return self.api_call(x, list(perm), require_contiguous=True)


class SliceReplay(_DataMovementReplay):
    """``Slice(x, offsets, size)``: ``out.copy_(x[0:size0, 0:size1, ...])``."""

    kernel_types = ("Slice",)
    signature_rule = SignatureRule(input_slots=1)  # offsets and sizes are host values
    # op-plugin ``npu_slice`` runs the ``Slice`` op on ``x;offsets;size`` (the row's layout)
    npu_api = "torch_npu.npu_slice"

    def check(self, row: KernelRow) -> None:
        x = _source(row, 3)
        out = self.single_output(row, x)
        assert x.shape is not None and out.shape is not None
        _host_vector(row, 1, "offsets", len(x.shape))
        _host_vector(row, 2, "size", len(x.shape))
        if len(out.shape) != len(x.shape) or any(o > i for o, i in zip(out.shape, x.shape)):
            raise CaseBuildError(
                f"{row.kernel_type} output {shape_text(out.shape)} does not fit inside the input {shape_text(x.shape)}"
            )

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        self.check(row)
        out = row.present_outputs[0]
        assert out.shape is not None
        x = self.random(row.inputs[0], device, generator)
        return x[tuple(slice(0, size) for size in out.shape)], self.random(out, device, generator)

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        source = args[0]
        full = row.inputs[0].shape
        out = row.present_outputs[0].shape
        assert full is not None and out is not None
        # the whole input behind the slice (same storage and strides: the slices start at 0)
        x = source.as_strided(full, source.stride(), source.storage_offset())
        # the Level2 rows record 3-d inputs as NCHW: a base-format label torch_npu sets without
        # moving data, which the kernel then records too (the signature compares formats)
        fmt = row.inputs[0].format
        return self.api_call(NpuFormat(x, fmt) if fmt in ("NCHW", "NHWC") else x, [0] * len(full), list(out))


class TensorMoveReplay(_DataMovementReplay):
    """``TensorMove``: a same-dtype copy, ``out.copy_(x)``."""

    kernel_types = ("TensorMove",)
    npu_api = "torch.Tensor.copy_"
    trace_ops = MappingProxyType({"aten::clone": _trace_tensor_move, "aten::contiguous": _trace_tensor_move})

    def check(self, row: KernelRow) -> None:
        x = _source(row, 1)
        out = self.single_output(row, x)
        if out.shape != x.shape:
            raise CaseBuildError(
                f"{row.kernel_type} output {shape_text(out.shape)} differs from the input {shape_text(x.shape)}"
            )

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        self.check(row)
        source = self.random(row.inputs[0], device, generator)
        return source, self.random(row.present_outputs[0], device, generator)


class GatherV2Replay(_DataMovementReplay):
    """``GatherV2(x, indices, axis)`` (``aclnnEmbedding``): ``x.index_select(axis, indices)``."""

    kernel_types = ("GatherV2",)
    npu_api = "torch.nn.functional.embedding"
    trace_ops = MappingProxyType({"aten::embedding": _trace_embedding, "aten::index_select": _trace_index_select})

    def _slots(self, row: KernelRow) -> tuple[TensorSpec, TensorSpec, TensorSpec, int]:
        if len(row.inputs) < 2:
            raise CaseBuildError(
                f"{row.kernel_type} needs input slots x;indices[;axis], got {len(row.inputs)}"
            )
        _source(row, 3)
        x, indices = scalar_aware_inputs(row)[:2]  # a 0-d index is an empty slot with a dtype
        out = self.single_output(row, x)
        assert x.shape is not None and indices.shape is not None and out.shape is not None
        if indices.dtype not in INDEX_DTYPES:
            raise CaseBuildError(f"{row.kernel_type} indices dtype {indices.dtype} is not INT32/INT64")
        if len(row.inputs) > 2 and row.inputs[2].present and row.inputs[2].numel != 1:
            raise CaseBuildError(
                f"{row.kernel_type} axis (input slot 2) has shape {shape_text(row.inputs[2].shape)}, "
                "expected one value"
            )
        axis = gather_axis(x.shape, indices.shape, out.shape)
        if axis is None:
            raise CaseBuildError(
                f"{row.kernel_type} shapes are inconsistent: no axis of x {shape_text(x.shape)} gathered with "
                f"indices {shape_text(indices.shape)} gives the output {shape_text(out.shape)}"
            )
        if x.shape[axis] == 0:
            raise CaseBuildError(
                f"{row.kernel_type} x {shape_text(x.shape)} is empty along axis {axis}: no valid index"
            )
        return x, indices, out, axis

    def check(self, row: KernelRow) -> None:
        self._slots(row)

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        x_spec, index_spec, out_spec, axis = self._slots(row)
        assert x_spec.shape is not None and out_spec.shape is not None
        x = self.random(x_spec, device, generator)
        indices = self.random(index_spec, device, generator, low=0, high=x_spec.shape[axis])
        return x, indices.reshape(-1), axis, out_spec.shape

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        """``F.embedding`` (aclnnEmbedding -> GatherV2) gathers rows of a 2-D table; the other
        torch gathers launch other kernels (``index_select``: aclnnIndexSelect -> GatherV3)."""
        x, indices, axis, shape = args
        if axis != 0 or x.dim() != 2:
            raise CaseBuildError(
                f"{row.kernel_type} gathers axis {axis} of a {x.dim()}-d table: no NPU API launches GatherV2 for "
                "it (F.embedding takes a 2-D table gathered on axis 0; index_select launches GatherV3)"
            )
        return self.api_call(indices.view(shape[:-1]), x)  # indices in their own shape: out [*idx, D]

    def run(  # type: ignore[override]
        self, x: "torch.Tensor", indices: "torch.Tensor", axis: int, shape: Shape
    ) -> "torch.Tensor":
        return x.index_select(axis, indices).view(shape)


class ConcatDReplay(_DataMovementReplay):
    """``ConcatD(x0, x1, ...)``: ``torch.cat`` along the axis the shapes imply."""

    kernel_types = ("ConcatD",)
    npu_api = "torch.cat"
    trace_ops = MappingProxyType({"aten::cat": _trace_cat})

    def axis(self, row: KernelRow) -> int:
        if not row.inputs or not all(s.present for s in row.inputs):
            raise CaseBuildError(
                f"{row.kernel_type} needs one or more non-empty inputs, got "
                + ";".join(shape_text(s.shape) for s in row.inputs)
            )
        out = self.single_output(row, row.inputs[0])
        mixed = sorted({s.dtype for s in row.inputs})
        if len(mixed) != 1:
            raise CaseBuildError(f"{row.kernel_type} inputs have mixed dtypes {';'.join(mixed)}")
        assert out.shape is not None
        # torch.cat skips 1-D empty inputs (a KV cache's first update concatenates onto one)
        shaped = [s.shape for s in row.inputs if s.shape is not None and s.shape != (0,)]
        axis = concat_axis(shaped, out.shape) if shaped else None
        if axis is None:
            raise CaseBuildError(
                f"{row.kernel_type} shapes are inconsistent: inputs "
                + ";".join(shape_text(s.shape) for s in row.inputs)
                + f" do not concatenate along one axis into {shape_text(out.shape)}"
            )
        return axis

    def check(self, row: KernelRow) -> None:
        self.axis(row)

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        axis = self.axis(row)
        return (axis,) + tuple(self.random(s, device, generator) for s in row.inputs)

    def run(self, axis: int, *tensors: "torch.Tensor") -> "torch.Tensor":  # type: ignore[override]
        import torch

        return torch.cat(tensors, axis)
