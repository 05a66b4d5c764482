"""Indexing and masking: ``Index``, ``MaskedFill``, ``PadV3`` and ``NonZero``.

``Index`` (aclnnIndex, ``aten::index.Tensor``) rows are ``x;indexed_sizes;indexed_strides;idx_0;
...;idx_k-1 -> y``.  hicann ops-nn ``index/index/op_api/aclnn_index.cpp`` builds the two middle
inputs on the host: ``indexed_sizes`` is the mask of the index list (1 where an index tensor is
given, 0 for ``None``: one entry per position of the list) and ``indexed_strides`` is the output
shape, one entry per output dim; then come the defined index tensors, broadcast to one shape.
Which positions are indexed is not recorded; it is the first placement (all leading positions
first) whose advanced-indexing result has the output shape.  NPU API: ``torch.ops.aten.index.
Tensor`` called directly (Python's ``x[idx]`` casts INT32 indices to INT64 first, which would
change the kernel's signature); the portable path is the same operator.  Ascend/msmodeling's
``Index_run.py`` reads the same layout (``source;1;2;index_len``).

``MaskedFill`` rows are ``x;mask;value -> y``: ``value`` is a 0-d tensor (an empty shape slot
with ``x``'s dtype), ``mask`` BOOL broadcasts to ``x``.  NPU API and portable path:
``Tensor.masked_fill_(mask, 0)`` (aclnnInplaceMaskedFillScalar, per op_mapping.yaml; vLLM masks
logits in place).  A timed call writes ``x``, so the inputs carry an untouched copy of ``x`` for
the reference; 0 is a value no drawn element has, so every masked element is checked.

``PadV3`` rows are ``x;paddings;constant_value -> y`` from ``aten::constant_pad_nd``
(aclnnConstantPadNd): ``paddings`` is ``[2 * rank]`` INT32 (msmodeling's op microbenchmark
README: ``"1,1;4;"`` DT_BF16;INT32;DT_BF16 -> ``"8,1"``), the value a 0-d tensor.  The pad
widths are not recorded: each dim is padded at its end by what the output adds, with the
value 2 (not 0, so a kernel that left the pad region unwritten is caught).  NPU API and
portable path: ``torch.constant_pad_nd``.

``NonZero`` rows are ``x -> indices``; the output size depends on the data.  The real row
(``aclnnNonzeroV2_NonzeroAiCore_NonZero``, ``"4"`` BOOL -> ``"1"`` INT64) comes from
aclnnNonzeroV2, which op-plugin calls for ``torch.where(condition)`` (``WhereKernelNpuOpApi.cpp``:
``[dims, numel]`` allocated, resized to the ``[dims, N]`` the kernel reports, unbound per dim):
a 1-d input gives one ``[N]`` tensor, the row's output.  The input is built with exactly ``N``
nonzero elements at random positions (zeros elsewhere), so the kernel produces the recorded
shape.  Rows of rank above 1 are not replayed: no public row shows how their output is recorded.
NPU API: ``torch.where(x)`` (first result); portable path ``torch.nonzero(x)`` viewed as ``[N]``.

All four are verified exactly (tolerance 0) against the same call on CPU copies in the native
dtype.
"""

from __future__ import annotations

from itertools import combinations
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.kernels.elementwise import scalar_aware_inputs
from perf_plugin.replay.kernels.matmul import broadcast_shapes
from perf_plugin.replay.tensors import KernelRow, TensorSpec, shape_text
from perf_plugin.trace.args import Shape, broadcast, concrete_arg, is_int_list, tensor_arg
from perf_plugin.trace.events import TraceOp
from perf_plugin.trace.mapped import MappedOp, Slot

if TYPE_CHECKING:
    import torch

INDEX_DTYPES = frozenset({"INT32", "INT64"})
MASK_VALUE = 0  # drawn inputs are never 0
PAD_VALUE = 2  # drawn floats are in +-[0.5, 1.5]; unwritten device memory is most often 0


def _cpu_copy(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, list):
        return [_cpu_copy(v) for v in value]
    return value


class _ExactReplay(OpReplay):
    """Moved or selected values: exact, against the same call on native-dtype CPU copies."""

    def tolerance(self, output: TensorSpec) -> float:
        return 0.0

    def reference(self, *args: Any) -> "torch.Tensor | tuple[torch.Tensor, ...]":
        return self.run(*[_cpu_copy(a) for a in args])


def _one_output(row: KernelRow, dtype: str) -> TensorSpec:
    outputs = row.present_outputs
    if len(outputs) != 1 or outputs[0].dtype != dtype:
        raise CaseBuildError(
            f"{row.kernel_type} needs one {dtype} output, got "
            + (";".join(f"{shape_text(s)} {s.dtype}" for s in outputs) or "none")
        )
    return outputs[0]


# ----------------------------------------------------------------------------- Index
def index_positions(x: Shape, positions: int, index: Shape, count: int, out: Shape) -> tuple[int, ...] | None:
    """The first ``count`` of ``positions`` list slots indexed (the rest ``None``) for which
    ``x[...]`` has shape ``out`` under PyTorch's advanced-indexing rules."""
    for chosen in combinations(range(positions), count):
        rest = tuple(x[d] for d in range(len(x)) if d not in chosen)
        if chosen == tuple(range(chosen[0], chosen[-1] + 1)):  # adjacent: the result dims stay there
            shape = x[: chosen[0]] + index + x[chosen[-1] + 1 :]
        else:  # separated: the result dims come first
            shape = index + rest
        if shape == out:
            return chosen
    return None


class IndexReplay(_ExactReplay):
    kernel_types = ("Index",)
    npu_api = "torch.ops.aten.index.Tensor"

    def _plan(self, row: KernelRow) -> tuple[TensorSpec, list[TensorSpec | None], TensorSpec]:
        inputs = row.inputs
        if len(inputs) < 4 or not all(s.present for s in inputs):
            raise CaseBuildError(
                f"{row.kernel_type} needs input slots x;indexed_sizes;indexed_strides;idx_0[;idx_1...], got "
                + ";".join(shape_text(s) for s in inputs)
            )
        x, sizes, strides, indices = inputs[0], inputs[1], inputs[2], inputs[3:]
        out = _one_output(row, x.dtype)
        assert x.shape is not None and sizes.shape is not None and out.shape is not None
        positions = sizes.shape[0] if len(sizes.shape) == 1 else -1
        if not len(indices) <= positions <= max(len(x.shape), 1):
            raise CaseBuildError(
                f"{row.kernel_type} indexed_sizes {shape_text(sizes)} should be [n] with {len(indices)} <= n <= "
                f"rank of x {shape_text(x)} (one entry per position of the index list)"
            )
        if strides.shape != (len(out.shape),):
            raise CaseBuildError(
                f"{row.kernel_type} indexed_strides {shape_text(strides)} should be [{len(out.shape)}] (the output shape)"
            )
        if {s.shape for s in indices} != {indices[0].shape} or any(s.dtype not in INDEX_DTYPES for s in indices):
            raise CaseBuildError(f"{row.kernel_type} index tensors should share one shape and be INT32/INT64")
        assert indices[0].shape is not None
        chosen = index_positions(x.shape, positions, indices[0].shape, len(indices), out.shape)
        if chosen is None:
            raise CaseBuildError(
                f"{row.kernel_type} no placement of {len(indices)} index tensor(s) {shape_text(indices[0])} among "
                f"{positions} position(s) of x {shape_text(x)} gives the output {shape_text(out)}"
            )
        if any(x.shape[d] == 0 for d in chosen):
            raise CaseBuildError(f"{row.kernel_type} x {shape_text(x)} is empty along an indexed dim: no valid index")
        specs: list[TensorSpec | None] = [None] * positions
        for position, spec in zip(chosen, indices):
            specs[position] = spec
        return x, specs, out

    def check(self, row: KernelRow) -> None:
        self._plan(row)

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        x_spec, specs, _ = self._plan(row)
        assert x_spec.shape is not None
        x = self.random(x_spec, device, generator)
        indices = [
            None if spec is None else self.random(spec, device, generator, low=0, high=x_spec.shape[position])
            for position, spec in enumerate(specs)
        ]
        return x, indices

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        return self.api_call(*args)

    def run(self, x: "torch.Tensor", indices: "list[torch.Tensor | None]") -> "torch.Tensor":
        import torch

        result: torch.Tensor = torch.ops.aten.index.Tensor(x, indices)
        return result


# ----------------------------------------------------------------------------- MaskedFill
def _trace_masked_fill(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    """``masked_fill_(x, mask, value)``: the kernel fills ``x`` where the mask is set.  The
    out-of-place ``masked_fill`` is not this row: it clones ``x`` (broadcast with the mask) and
    then fills, two kernels, and a row replayed as the in-place fill alone measured 0.56-0.66 of
    its in-model time on an H100; it stays an ``aten.masked_fill`` row, replayed as recorded."""
    x, mask = tensor_arg(op, 0), tensor_arg(op, 1)
    if x is None or mask is None:
        return None
    shape = broadcast(x.shape, mask.shape)
    if shape is None or (op.name.endswith("_") and shape != x.shape):
        return None
    return MappedOp(
        "MaskedFill",
        (Slot(shape, x.dtype), Slot(mask.shape, mask.dtype), Slot(None, x.dtype)),
        (Slot(shape, x.dtype),),
    )


class MaskedFillReplay(_ExactReplay):
    kernel_types = ("MaskedFill",)
    npu_api = "torch.Tensor.masked_fill_"
    trace_ops = MappingProxyType({"aten::masked_fill_": _trace_masked_fill})

    def _slots(self, row: KernelRow) -> tuple[TensorSpec, TensorSpec]:
        inputs = scalar_aware_inputs(row)  # the value: an empty shape slot with a dtype
        if len(inputs) not in (2, 3) or not inputs[0].shape or inputs[1].shape is None:
            raise CaseBuildError(
                f"{row.kernel_type} needs input slots x;mask[;value], got " + ";".join(shape_text(s) for s in row.inputs)
            )
        x, mask = inputs[0], inputs[1]
        assert x.shape is not None and mask.shape is not None
        if mask.dtype != "BOOL" or broadcast_shapes(x.shape, mask.shape) != x.shape:
            raise CaseBuildError(
                f"{row.kernel_type} mask {shape_text(mask)} {mask.dtype} should be BOOL and broadcast to x {shape_text(x)}"
            )
        if len(inputs) == 3 and (inputs[2].shape != () or inputs[2].dtype != x.dtype):
            raise CaseBuildError(
                f"{row.kernel_type} value (input slot 2) should be a 0-d {x.dtype} tensor, got "
                f"{shape_text(inputs[2])} {inputs[2].dtype}"
            )
        out = _one_output(row, x.dtype)
        if out.shape != x.shape:
            raise CaseBuildError(f"{row.kernel_type} output {shape_text(out)} differs from x {shape_text(x)}")
        return x, mask

    def check(self, row: KernelRow) -> None:
        self._slots(row)

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        x_spec, mask_spec = self._slots(row)
        x = self.random(x_spec, device, generator)
        value: int | bool = False if x_spec.dtype == "BOOL" else MASK_VALUE
        # the last argument: x as it was, for the reference (each run overwrites x)
        return x, self.random(mask_spec, device, generator), value, x.clone()

    def run(self, x: "torch.Tensor", mask: "torch.Tensor", value: float, original: "torch.Tensor") -> "torch.Tensor":
        return x.masked_fill_(mask, value)

    def reference(self, *args: Any) -> "torch.Tensor":
        _, mask, value, original = args
        return self.run(_cpu_copy(original), _cpu_copy(mask), value, original)


# ----------------------------------------------------------------------------- PadV3
def pad_widths(x: Shape, out: Shape) -> list[int] | None:
    """``constant_pad_nd``'s pad list (last dim first, ``before, after`` pairs) padding each
    dim of ``x`` at its end up to ``out``; None if ``out`` is smaller anywhere."""
    if len(x) != len(out) or any(o < i for i, o in zip(x, out)):
        return None
    widths: list[int] = []
    for i, o in zip(reversed(x), reversed(out)):
        widths += [0, o - i]
    return widths


def _trace_constant_pad(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    x, pad = tensor_arg(op, 0), concrete_arg(op, 1)
    if x is None or x.rank == 0 or not is_int_list(pad) or len(pad) % 2 or len(pad) > 2 * x.rank:
        return None
    if any(p < 0 for p in pad):
        return None  # negative widths crop: aclnnConstantPadNd slices before PadV3
    out = list(x.shape)
    for k in range(len(pad) // 2):
        out[x.rank - 1 - k] += pad[2 * k] + pad[2 * k + 1]
    return MappedOp(
        "PadV3",
        (Slot(x.shape, x.dtype), Slot((2 * x.rank,), "INT32"), Slot(None, x.dtype)),
        (Slot(tuple(out), x.dtype),),
    )


def _trace_pad(op: TraceOp, descendants: list[TraceOp]) -> MappedOp | None:
    """``F.pad``: the trace does not record its mode; constant mode is the one that calls
    ``constant_pad_nd``."""
    inner = next((d for d in descendants if d.name == "aten::constant_pad_nd"), None)
    return None if inner is None else _trace_constant_pad(inner, [])


class PadV3Replay(_ExactReplay):
    kernel_types = ("PadV3",)
    npu_api = "torch.constant_pad_nd"
    trace_ops = MappingProxyType({"aten::constant_pad_nd": _trace_constant_pad, "aten::pad": _trace_pad})

    def _plan(self, row: KernelRow) -> tuple[TensorSpec, list[int]]:
        inputs = scalar_aware_inputs(row)
        if len(inputs) not in (2, 3) or not inputs[0].shape:
            raise CaseBuildError(
                f"{row.kernel_type} needs input slots x;paddings[;constant_value], got "
                + ";".join(shape_text(s) for s in row.inputs)
            )
        x, paddings = inputs[0], inputs[1]
        assert x.shape is not None
        rank = len(x.shape)
        if paddings.shape not in ((2 * rank,), (rank, 2)) or paddings.dtype not in INDEX_DTYPES:
            raise CaseBuildError(
                f"{row.kernel_type} paddings {shape_text(paddings)} {paddings.dtype} should be [{2 * rank}] INT32/INT64 "
                f"for a {rank}-d x"
            )
        if len(inputs) == 3 and (inputs[2].shape != () or inputs[2].dtype != x.dtype):
            raise CaseBuildError(
                f"{row.kernel_type} constant_value should be a 0-d {x.dtype} tensor, got {shape_text(inputs[2])}"
            )
        out = _one_output(row, x.dtype)
        assert out.shape is not None
        widths = pad_widths(x.shape, out.shape)
        if widths is None:
            raise CaseBuildError(f"{row.kernel_type} output {shape_text(out)} does not contain x {shape_text(x)}")
        return x, widths

    def check(self, row: KernelRow) -> None:
        self._plan(row)

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        x, widths = self._plan(row)
        return self.random(x, device, generator), widths, True if x.dtype == "BOOL" else PAD_VALUE

    def run(self, x: "torch.Tensor", widths: list[int], value: float) -> "torch.Tensor":
        import torch

        return torch.constant_pad_nd(x, widths, value)


# ----------------------------------------------------------------------------- NonZero
class NonZeroReplay(_ExactReplay):
    kernel_types = ("NonZero",)
    npu_api = "torch.where"

    def _slots(self, row: KernelRow) -> tuple[TensorSpec, int]:
        inputs = row.inputs
        if len(inputs) != 1 or inputs[0].shape is None:
            raise CaseBuildError(f"{row.kernel_type} needs one input x, got " + ";".join(shape_text(s) for s in inputs))
        x, out = inputs[0], _one_output(row, "INT64")
        if x.shape is None or len(x.shape) != 1:
            raise CaseBuildError(
                f"{row.kernel_type} x {shape_text(x)}: only 1-d inputs are replayed (their output is the [N] "
                "indices torch.where gives; no public row shows how a higher-rank output is recorded)"
            )
        if out.shape is None or len(out.shape) != 1 or out.shape[0] > x.shape[0]:
            raise CaseBuildError(
                f"{row.kernel_type} output {shape_text(out)} should be [N] with N <= {x.shape[0]} nonzero elements"
            )
        return x, out.shape[0]

    def check(self, row: KernelRow) -> None:
        self._slots(row)

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        import torch

        x_spec, count = self._slots(row)
        assert x_spec.shape is not None
        # exactly ``count`` nonzero elements, so the kernel reports the row's output shape
        x = torch.zeros(x_spec.shape, dtype=x_spec.torch_dtype(), device=device)
        where = torch.randperm(x_spec.shape[0], generator=generator, device=device)[:count]
        x[where] = self.random(TensorSpec((count,), x_spec.dtype), device, generator) if x_spec.dtype != "BOOL" else True
        return (x,)

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        return self.api_call(*args, select=(0,))  # one [N] index tensor per dim of x

    def run(self, x: "torch.Tensor") -> "torch.Tensor":
        import torch

        return torch.nonzero(x).view(-1)
