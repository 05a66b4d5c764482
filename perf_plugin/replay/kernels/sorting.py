"""Order statistics: ``ArgMaxV2``, ``Sort`` and ``TopKV2``.

Both kernels write INT32 indices, which the aclnn entry points cast to the INT64 torch returns
in a separate ``Cast`` kernel (hicann ``aclnn_argmax.cpp``: ``l0op::ArgMaxV2`` then
``l0op::Cast``; ``aclnn_sort.cpp``: ``l0op::Sort`` then a cast of the indices to INT64).  A row
records the kernel, so its index output is INT32 while the API hands back INT64; the replays
produce the API's INT64 indices (``expected_outputs``) rather than add a cast of their own, as
Ascend/msmodeling's standalone microbenchmark does for these two kernel types.

``ArgMaxV2`` rows are ``x;dimension -> y``: the dimension is a host scalar (an empty shape slot
with a dtype, INT64), ``y`` is ``x`` without that dim (or with it set to 1: keepdim).  The value
is not recorded; it is the dim the output shapes imply, the last one when several fit (argmax
over the vocabulary in greedy sampling; msmodeling's ``ArgMaxV2_run.py`` uses ``dim=-1``).
Each reduced slice gets one planted maximum, so the index is unique whatever the tie rule of
the device.  NPU API: ``torch.argmax`` (aclnnArgMax), which is also the portable path.

``Sort`` rows are ``x -> values;indices``.  The kernel always sorts its last dim (aclnnSort
transposes any other dim there first), so the replay sorts ``dim=-1``; the order is an attribute
the row does not record: ascending, as both known callers sort (the real row comes from
``aclnnEmbeddingDenseBackward``, which sorts the token ids; vLLM's top-k/top-p sampler calls
``logits.sort(dim=-1, descending=False)``).  The values along each sorted row are distinct
where the dtype has enough values, so the indices do not depend on how the device breaks
ties; where it has not (a half-precision row longer than 16384), the sort is stable, whose
result is unique too.  NPU API: ``torch.sort`` (aclnnSort), also the portable path.

Both are verified exactly (tolerance 0) against the same call on CPU copies in the native dtype.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.kernels.aten_selection import selection_comparable
from perf_plugin.replay.kernels.elementwise import scalar_aware_inputs
from perf_plugin.replay.tensors import FLOATING, KernelRow, TensorSpec, shape_text
from perf_plugin.replay.value_draws import (
    draw_from_quantiles,
    recorded_depths,
    recorded_quantiles,
    with_recorded_depths,
)
from perf_plugin.trace.args import concrete_arg, tensor_arg
from perf_plugin.trace.events import TraceOp
from perf_plugin.trace.mapped import MappedOp, Slot

if TYPE_CHECKING:
    import torch

INDEX_DTYPES = frozenset({"INT32", "INT64"})
# Bit patterns of 1.0, 2.0 and the largest finite value, per floating dtype: codes counted up
# from 1.0 are distinct, increasing values (the integer type of the same width holds them).
_FLOAT_CODES: dict[str, tuple[str, int, int, int]] = {
    "float32": ("int32", 0x3F800000, 0x40000000, 0x7F7FFFFF),
    "float64": ("int64", 0x3FF0000000000000, 0x4000000000000000, 0x7FEFFFFFFFFFFFFF),
    "float16": ("int16", 0x3C00, 0x4000, 0x7BFF),
    "bfloat16": ("int16", 0x3F80, 0x4000, 0x7F7F),
}


def _cpu_copy(value: Any) -> Any:
    import torch

    return value.detach().to("cpu", copy=True) if isinstance(value, torch.Tensor) else value


class _ExactReplay(OpReplay):
    """Integer outputs and moved values: exact, against the same call on native-dtype CPU copies."""

    def tolerance(self, output: TensorSpec) -> float:
        return 0.0

    def reference(self, *args: Any) -> "torch.Tensor | tuple[torch.Tensor, ...]":
        return self.run(*[_cpu_copy(a) for a in args])


# ----------------------------------------------------------------------------- ArgMaxV2
def argmax_dim(x: tuple[int, ...], out: tuple[int, ...]) -> tuple[int, bool] | None:
    """``(dim, keepdim)`` reducing ``x`` to ``out``, the last dim first."""
    for dim in reversed(range(len(x))):
        if x[:dim] + x[dim + 1 :] == out:
            return dim, False
        if x[:dim] + (1,) + x[dim + 1 :] == out:
            return dim, True
    return None


def _trace_argmax(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    x, dim, keepdim = tensor_arg(op, 0), concrete_arg(op, 1), concrete_arg(op, 2)
    if x is None or x.rank == 0 or not isinstance(dim, int) or isinstance(dim, bool):
        return None  # argmax over the flattened input: aclnnArgMax reshapes it first
    dim %= x.rank
    out = x.shape[:dim] + ((1,) if keepdim is True else ()) + x.shape[dim + 1 :]
    return MappedOp("ArgMaxV2", (Slot(x.shape, x.dtype), Slot(None, "INT64")), (Slot(out, "INT32"),))


class ArgMaxV2Replay(_ExactReplay):
    kernel_types = ("ArgMaxV2",)
    npu_api = "torch.argmax"
    trace_ops = MappingProxyType({"aten::argmax": _trace_argmax})

    def _plan(self, row: KernelRow) -> tuple[TensorSpec, TensorSpec, int, bool]:
        inputs = scalar_aware_inputs(row)  # the dimension: an empty shape slot with a dtype
        if not inputs or not inputs[0].shape:
            raise CaseBuildError(
                f"{row.kernel_type} needs an input x of rank >= 1, got " + ";".join(shape_text(s) for s in row.inputs)
            )
        x = inputs[0]
        for index, spec in enumerate(inputs[1:], start=1):
            if index > 1 or spec.dtype not in INDEX_DTYPES or spec.shape not in ((), (1,)):
                raise CaseBuildError(
                    f"{row.kernel_type} input slot {index} ({shape_text(spec)} {spec.dtype}) is not the "
                    "dimension (one INT32/INT64 value)"
                )
        outputs = row.present_outputs
        if len(outputs) != 1 or outputs[0].dtype not in INDEX_DTYPES:
            raise CaseBuildError(f"{row.kernel_type} needs one INT32/INT64 output, got {len(outputs)} output(s)")
        assert x.shape is not None and outputs[0].shape is not None
        plan = argmax_dim(x.shape, outputs[0].shape)
        if plan is None:
            raise CaseBuildError(
                f"{row.kernel_type} output {shape_text(outputs[0])} is not x {shape_text(x)} reduced over one dim"
            )
        if x.shape[plan[0]] == 0:
            raise CaseBuildError(f"{row.kernel_type} x {shape_text(x)} is empty along dim {plan[0]}")
        return x, outputs[0], plan[0], plan[1]

    def check(self, row: KernelRow) -> None:
        self._plan(row)

    def expected_outputs(self, row: KernelRow) -> tuple[TensorSpec, ...]:
        _, out, _, _ = self._plan(row)
        return (TensorSpec(out.shape, "INT64", out.format),)  # torch.argmax's dtype (see above)

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        import torch

        x_spec, _, dim, keepdim = self._plan(row)
        assert x_spec.shape is not None
        x = self.random(x_spec, device, generator)
        # one maximum per reduced slice, above every drawn value (+-[0.5, 1.5], ints < 100)
        peak: float | int | bool = True if x_spec.dtype == "BOOL" else (2.0 if x_spec.dtype in FLOATING else 100)
        if x_spec.dtype == "BOOL":
            x.zero_()
        slice_shape = x_spec.shape[:dim] + (1,) + x_spec.shape[dim + 1 :]
        where = torch.randint(0, x_spec.shape[dim], slice_shape, generator=generator, device=device)
        x.scatter_(dim, where, peak)
        return x, dim, keepdim

    def run(self, x: "torch.Tensor", dim: int, keepdim: bool) -> "torch.Tensor":
        import torch

        return torch.argmax(x, dim, keepdim)


# ----------------------------------------------------------------------------- Sort
def _trace_sort(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    """``sort(x, dim, descending)`` or ``sort.stable(x, stable, dim, descending)``: the kernel
    sorts the last dim of ``x`` with ``dim`` moved there, in FLOAT for BF16 input (aclnnSort
    casts BF16 to FLOAT and BOOL to UINT8 on Atlas A2/A3)."""
    x = tensor_arg(op, 0)
    dim = concrete_arg(op, 2 if len(op.types) >= 4 else 1)
    dim = -1 if dim is None else dim
    if x is None or x.rank == 0 or not isinstance(dim, int) or isinstance(dim, bool):
        return None
    dim %= x.rank
    if x.shape[dim] == 1:
        return None  # aclnnSort copies the input and fills zero indices: no Sort kernel
    shape = list(x.shape)
    shape[dim], shape[-1] = shape[-1], shape[dim]
    dtype = {"DT_BF16": "FLOAT", "BOOL": "UINT8"}.get(x.dtype, x.dtype)
    return MappedOp("Sort", (Slot(tuple(shape), dtype),), (Slot(tuple(shape), dtype), Slot(tuple(shape), "INT32")))


def distinct_capacity(spec: TensorSpec) -> int:
    """How many distinct values ``_distinct_values`` can give a row of this dtype."""
    import torch

    dtype = spec.torch_dtype()
    name = str(dtype).removeprefix("torch.")
    if name in _FLOAT_CODES:
        _, one, _, largest = _FLOAT_CODES[name]
        return largest - one + 1
    if dtype == torch.bool:
        return 2
    if dtype.is_floating_point:
        return 0  # float8: no code table; drawn at random and sorted stably
    return int(torch.iinfo(dtype).max)


def _distinct_values(spec: TensorSpec, device: "torch.device", generator: "torch.Generator") -> "torch.Tensor":
    """Each row along the last dim a random permutation of distinct values (random signs for
    floats, so both signs occur as in logits)."""
    import torch

    assert spec.shape is not None
    keys = torch.rand(spec.shape, generator=generator, device=device)
    ranks = keys.argsort(dim=-1)  # a random permutation of 0..n-1 per row
    dtype = spec.torch_dtype()
    name = str(dtype).removeprefix("torch.")
    if name not in _FLOAT_CODES:
        return (ranks + (0 if dtype == torch.bool else 1)).to(dtype)
    code_type, one, two, _ = _FLOAT_CODES[name]
    # spread over [1, 2) where the row fits there (+-[1, 2) like drawn data), else consecutive codes
    step = max(1, (two - one) // spec.shape[-1]) if spec.shape[-1] else 1
    values = (ranks * step + one).to(getattr(torch, code_type)).view(dtype)
    signs = torch.randint(0, 2, spec.shape, generator=generator, device=device, dtype=torch.int8).mul_(2).sub_(1)
    return values.mul_(signs.to(dtype))


class SortReplay(_ExactReplay):
    kernel_types = ("Sort",)
    npu_api = "torch.sort"
    trace_ops = MappingProxyType({"aten::sort": _trace_sort})

    def _slots(self, row: KernelRow) -> tuple[TensorSpec, TensorSpec, TensorSpec]:
        inputs = row.inputs
        if not inputs or not inputs[0].shape or any(s.present for s in inputs[1:]):
            raise CaseBuildError(
                f"{row.kernel_type} needs one input x of rank >= 1, got " + ";".join(shape_text(s) for s in inputs)
            )
        outputs = row.present_outputs
        if len(outputs) != 2:
            raise CaseBuildError(f"{row.kernel_type} needs outputs values;indices, got {len(outputs)} output(s)")
        x, values, indices = inputs[0], outputs[0], outputs[1]
        if (values.shape, values.dtype) != (x.shape, x.dtype):
            raise CaseBuildError(
                f"{row.kernel_type} values {shape_text(values)} {values.dtype} should be x's {shape_text(x)} {x.dtype}"
            )
        if indices.shape != x.shape or indices.dtype not in INDEX_DTYPES:
            raise CaseBuildError(
                f"{row.kernel_type} indices {shape_text(indices)} {indices.dtype} should be {shape_text(x)} INT32/INT64"
            )
        return x, values, indices

    def check(self, row: KernelRow) -> None:
        self._slots(row)

    def expected_outputs(self, row: KernelRow) -> tuple[TensorSpec, ...]:
        _, values, indices = self._slots(row)
        return values, TensorSpec(indices.shape, "INT64", indices.format)  # torch.sort's dtype

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        x, _, _ = self._slots(row)
        assert x.shape is not None
        if x.shape[-1] <= distinct_capacity(x):
            return _distinct_values(x, device, generator), False
        return self.random(x, device, generator), True  # ties possible: the stable sort is unique

    def run(self, x: "torch.Tensor", stable: bool) -> tuple["torch.Tensor", "torch.Tensor"]:
        import torch

        values, indices = torch.sort(x, dim=-1, descending=False, stable=stable)
        return values, indices


class TopKV2Replay(_ExactReplay):
    """``TopKV2`` (real Level1 row ``"32,1000;"`` FLOAT;INT32 -> ``"32,5;32,5"`` FLOAT;INT32: top-5
    accuracy): ``x; k`` (a 0-d slot) -> ``values; indices`` along the last dim, largest first,
    sorted.  ``k`` is the outputs' last dim.  API (op_mapping.yaml: ``aten.topk.default`` ->
    TopKV2): ``torch.topk``, whose indices are INT64 (the kernel's INT32 are cast by aclnn, as
    for ``Sort``).  Values are distinct per row (``_distinct_values``), or drawn from the quantiles a
    capture recorded of the model's input (``Profiling Input Quantiles``, ``value_draws``), rows
    rebuilt to its selection depths where the row records them (``Profiling Selection Depths``);
    such values can tie: the indices are compared as the input's values they pick
    (``selection_comparable``)."""

    kernel_types = ("TopKV2",)
    npu_api = "torch.topk"
    quantile_inputs = (0,)  # x: torch.topk's argument 0

    def _slots(self, row: KernelRow) -> tuple[TensorSpec, TensorSpec, TensorSpec]:
        outputs = row.present_outputs
        if not row.inputs or not row.inputs[0].shape or len(outputs) != 2:
            raise CaseBuildError(f"{row.kernel_type} needs x (and k) and the outputs values;indices")
        x, values, indices = row.inputs[0], outputs[0], outputs[1]
        assert x.shape is not None and values.shape is not None
        if values.shape[:-1] != x.shape[:-1] or values.shape != indices.shape or values.shape[-1] > x.shape[-1]:
            raise CaseBuildError(f"{row.kernel_type} values {shape_text(values)} are not a top-k of x {shape_text(x)} "
                                 "along its last dim")
        if values.dtype != x.dtype or indices.dtype not in INDEX_DTYPES:
            raise CaseBuildError(f"{row.kernel_type} outputs {values.dtype};{indices.dtype}: x's dtype and INT32/INT64")
        return x, values, indices

    def check(self, row: KernelRow) -> None:
        self._slots(row)

    def expected_outputs(self, row: KernelRow) -> tuple[TensorSpec, ...]:
        _, values, indices = self._slots(row)
        return values, TensorSpec(indices.shape, "INT64", indices.format)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        x, values, _ = self._slots(row)
        assert x.shape is not None and values.shape is not None
        quantiles = recorded_quantiles(row)
        if quantiles and quantiles[0] is not None:
            # the model's values: how close they lie sets when the radix selection ends, ties included
            drawn = draw_from_quantiles(quantiles[0], x.numel, x.torch_dtype(), device, generator).view(x.shape)
            depths = recorded_depths(row)
            if depths and depths[0]:  # how deep each row's selection reads, as the model's did
                drawn = with_recorded_depths(drawn, values.shape[-1], -1, True, depths[0], generator)
            return drawn, values.shape[-1]
        if x.shape[-1] > distinct_capacity(x):
            raise CaseBuildError(f"{row.kernel_type}: {x.shape[-1]} values per row cannot all differ in {x.dtype}")
        return _distinct_values(x, device, generator), values.shape[-1]

    def run(self, x: "torch.Tensor", k: int) -> tuple["torch.Tensor", "torch.Tensor"]:
        import torch

        values, indices = torch.topk(x, k, dim=-1, largest=True, sorted=True)
        return values, indices

    def comparable(self, args: tuple[Any, ...], outputs: Any) -> Any:
        """Values as returned (sorted, largest first), indices as the input's values they pick:
        where values tie (drawn from a model's quantiles) any tied index is right."""
        values, indices = outputs
        return selection_comparable(args[0], values, indices, -1, True, False)
