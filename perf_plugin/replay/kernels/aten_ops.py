"""Rows named after a traced ``aten`` operator (``aten.silu``, ``aten.mean``), replayed through ``torch.ops.aten``.

Trace ingest names a row after its operator when no kernel type declares that operator
(``perf_plugin.ingest.aten_mapping``), and for an ``aten::`` operator it records the call's
arguments in the ``Op Arguments`` cell (``perf_plugin.replay.aten_call``): which tensor slot each
tensor argument is, the values of the others, and the overload they select.  This replay calls
that overload again on fresh tensors of the row's shapes, dtypes and strides, so any operator a
model ran (``aten.rsqrt``, ``aten.argmax``, ``aten.neg`` ...) is measurable with the kernel the
model ran, and the rows the named kernel families replay keep their dedicated replays.

Inputs have the recorded strides (a view read in place stays a view).  Floating tensors are
drawn uniformly in [0.25, 0.95]: positive and below one, so that operators with a restricted
domain (``rsqrt``, ``log``, ``acos``, ``pow`` with a fractional exponent) compute finite values
whatever they are; a slot whose ``Profiling Input Quantiles`` a capture recorded (top-k's input)
is drawn from those instead (``perf_plugin.replay.value_draws``).  Integer tensors are drawn in
[1, d), d the smallest dimension of the floating and boolean inputs, so that index tensors
(gather, scatter, index_add) address any dimension; an operator whose integer arguments must be something else
fails the case with its own error.  The indices of ``x[index]`` span the whole indexed dimension,
as many distinct ones as the row's ``Profiling Input Distinct Shares`` says where a capture
recorded it (``_index_values``).

The reference is the same overload on float64 CPU copies (exact for integer and boolean
results); operators that draw random values (tagged ``nondeterministic_seeded``: ``randn``,
``dropout``) are checked for shapes, dtypes and finite values only.  On an NPU the same
``torch.ops.aten`` call runs: it reaches the operator's own NPU kernel, whose name msprof reports
(these rows come from CUDA and CPU traces).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from perf_plugin.database.schema import OP_ARGUMENTS, PROFILING_INPUT_DISTINCT_SHARES
from perf_plugin.replay.aten_call import (
    AtenCallError,
    call,
    overload_of,
    parse_arguments,
    recorded_operator,
    slots_used,
    tensor_outputs,
)
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.host_scalars import as_passed, host_scalar_slot, number_where_promotion_says, placed
from perf_plugin.replay.kernels.elementwise import scalar_aware_dtype_slots, scalar_aware_outputs
from perf_plugin.replay.tensors import FLOATING, KernelRow, TensorSpec
from perf_plugin.replay.value_draws import draw_from_quantiles, recorded_quantiles, recorded_shares

if TYPE_CHECKING:
    import torch

PREFIX = "aten."
FLOAT_RANGE = (0.25, 0.95)


# In-place writes replayed in place, as the model ran them: applying one twice leaves what applying
# it once does, so the first call's output still matches a reference computed after that call
# (from the inputs it wrote).  Other in-place operators run out of place (a copy first).
IDEMPOTENT_IN_PLACE = frozenset({"index_put_", "masked_fill_", "fill_", "zero_", "copy_", "index_fill_"})


def _operator_name(row: KernelRow) -> str:
    """The operator to call: the kernel type's, or the in-place one the row recorded where
    replaying it in place is safe."""
    recorded = recorded_operator(row.attrs.get(OP_ARGUMENTS, ""))
    if recorded in IDEMPOTENT_IN_PLACE and not _accumulates(recorded, row):
        return recorded
    return row.kernel_type[len(PREFIX) :]


def _accumulates(operator: str, row: KernelRow) -> bool:
    """``index_put_(..., accumulate=True)`` adds instead of writing: not idempotent."""
    if operator != "index_put_":
        return False
    try:
        _, template = parse_arguments(row.attrs.get(OP_ARGUMENTS, ""))
    except AtenCallError:
        return False
    return _accumulating(template)


def _accumulating(template: Sequence[Any]) -> bool:
    """The ``accumulate`` argument of an ``index_put`` call (argument 3)."""
    return len(template) > 3 and template[3] is True


def _index_bound(row: KernelRow) -> int:
    """Integer inputs stay below every dimension of the floating and boolean inputs, so that a
    tensor of indices (gather, index_select, index_add, scatter: DeepSeek-V3.2's indexer scatters
    into a boolean mask) addresses any of their dimensions."""
    dims = [d for spec in row.inputs if spec.shape and (spec.dtype in FLOATING or spec.dtype == "BOOL")
            for d in spec.shape if d > 0]
    return min(dims, default=100)


# Operators whose argument 1 is a list of index tensors into argument 0 (``x[idx]``, ``x[idx] = v``).
INDEXING = frozenset({"index", "index_put", "index_put_", "_index_put_impl"})


def _indexed_dims(row: KernelRow, template: Sequence[Any]) -> dict[int, tuple[int, bool]]:
    """Index slots of an indexing call -> (size of the dimension they index, whether values
    must be distinct); for a boolean mask, (how many elements it selects, False): the length of
    the result's dimension that replaces the masked ones.  Writes through repeated indices
    without accumulation leave whichever write lands last (on CUDA, any of them), so those
    indices are drawn without repetition."""
    operator = _operator_name(row)
    if operator not in INDEXING or len(template) < 2:
        return {}
    source, indices = template[0], template[1]
    if not (isinstance(source, dict) and isinstance(indices, dict) and isinstance(indices.get("tensors"), list)):
        return {}
    shape = row.inputs[int(source["tensor"])].shape or ()
    distinct = operator != "index" and not _accumulating(template)
    result = row.outputs[0].shape if row.outputs and row.outputs[0].shape else ()
    found: dict[int, tuple[int, bool]] = {}
    for position, slot in enumerate(indices["tensors"]):
        if slot is None or position >= len(shape):
            continue
        if row.inputs[int(slot)].dtype == "BOOL":
            if position < len(result):
                found[int(slot)] = (result[position], False)
            continue
        found[int(slot)] = (shape[position], distinct and not found)  # the first index tensor decides
    return found


def _index_values(
    spec: TensorSpec, indexed: tuple[int, bool], device: "torch.device", generator: "torch.Generator",
    distinct_share: float | None = None,
) -> "torch.Tensor":
    """Indices over the whole indexed dimension, as a model's gather or scatter addresses it;
    a boolean mask with exactly the recorded count of true elements, at random places.  Where a
    capture recorded the share of the model's index values that were distinct (``Profiling Input
    Distinct Shares``: an MoE layer's permutation 1.0, its dispatch of top-k copies 1/k), that
    many distinct rows, each as often as the others (to one), in random order."""
    import torch

    size, distinct = indexed
    shape = spec.shape or ()
    count = math.prod(shape)
    if spec.dtype == "BOOL":
        mask = torch.zeros(count, dtype=torch.bool, device=device)
        mask[torch.randperm(count, generator=generator, device=device)[: min(size, count)]] = True
        return mask.reshape(shape)
    if distinct_share is not None and not distinct and count > 0 and size > 0:
        rows = min(size, count, max(1, round(distinct_share * count)))
        chosen = torch.randperm(size, generator=generator, device=device)[:rows]
        repeated = chosen.repeat(-(-count // rows))[:count]
        drawn = repeated[torch.randperm(count, generator=generator, device=device)]
        return drawn.to(spec.torch_dtype()).reshape(shape)
    if distinct and count <= size:
        drawn = torch.randperm(size, generator=generator, device=device)[:count]
    else:
        drawn = torch.randint(0, max(size, 1), (count,), generator=generator, device=device)
    return drawn.to(spec.torch_dtype()).reshape(shape)


class AtenOpReplay(OpReplay):
    """Any ``aten.<operator>`` row with its recorded arguments."""

    kernel_type_prefixes: ClassVar[tuple[str, ...]] = (PREFIX,)
    npu_api = "torch.ops.aten"

    def _call(self, row: KernelRow) -> tuple[str, tuple[Any, ...]]:
        cell = row.attrs.get(OP_ARGUMENTS, "").strip()
        if not cell:
            raise CaseBuildError(
                f"{row.kernel_type} has no '{OP_ARGUMENTS}' cell: the trace did not record the call's "
                "arguments fully enough to call the operator again (the profiler records nothing of a "
                "list of optional tensors: aten::index's indices are recovered from its callees, but not "
                "non-adjacent ones or a mask mixed with other indices; record_shapes=True records the rest)"
            )
        try:
            overload, template = parse_arguments(cell)
            overload_of(_operator_name(row), overload)
        except AtenCallError as exc:
            raise CaseBuildError(f"{row.kernel_type}: {exc}") from None
        slots = _slots(row)
        missing = [k for k in slots_used(template) if k >= len(slots) or not slots[k].dtype]
        if missing:
            raise CaseBuildError(f"{row.kernel_type}: the arguments name input slot {missing[0]}, which the row lacks")
        return overload, template

    def check(self, row: KernelRow) -> None:
        self._call(row)
        if not self.expected_outputs(row):
            raise CaseBuildError(f"{row.kernel_type} records no output to verify")

    def expected_outputs(self, row: KernelRow) -> Sequence[TensorSpec]:
        return scalar_aware_outputs(row)  # a 0-d result (a full reduction) is an empty shape with a dtype

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        overload, template = self._call(row)
        bound = _index_bound(row)
        indexing = _indexed_dims(row, template)
        slots = _slots(row)
        host = host_scalar_slot(row, [TensorSpec((), s.dtype) if s.shape is None and s.dtype else s for s in slots])
        quantiles = recorded_quantiles(row)
        distinct = recorded_shares(row, PROFILING_INPUT_DISTINCT_SHARES)  # a gather's index, where captured
        tensors = tuple(
            _index_values(spec, indexing[k], device, generator, distinct[k] if k < len(distinct) else None)
            if k in indexing
            else self._tensor(spec, *placed(k == host, device, generator), bound,
                              quantiles[k] if k < len(quantiles) else None)
            for k, spec in enumerate(slots)
        )
        expected = self.expected_outputs(row)
        if host is not None and host > 0 and expected:
            passed = as_passed(tensors[host], tensors[0], expected[0].torch_dtype())
            tensors = (*tensors[:host], passed, *tensors[host + 1 :])
        elif host is None and expected and expected[0].dtype:
            tensors = number_where_promotion_says(tensors, expected[0].torch_dtype())
        return _operator_name(row), overload, template, tensors, device

    def _tensor(
        self, spec: TensorSpec, device: "torch.device", generator: "torch.Generator", bound: int,
        quantiles: tuple[float, ...] | None = None,
    ) -> Any:
        if spec.shape is None:
            if not spec.dtype:
                return None
            # an empty shape with a dtype is a 0-d tensor in the profiler's notation
            spec = TensorSpec((), spec.dtype, spec.format)
        if spec.dtype not in FLOATING:
            return self.random(spec, device, generator, low=1 if bound > 1 else 0, high=max(bound, 1))
        import torch

        dtype = spec.torch_dtype()
        drawn = torch.float32 if dtype.itemsize == 1 else dtype  # float8: no uniform_ of its own
        if quantiles is not None:  # the model's values (Profiling Input Quantiles)
            storage = draw_from_quantiles(quantiles, spec.storage_numel, dtype, device, generator)
        else:
            storage = torch.empty(spec.storage_numel, dtype=drawn, device=device)
            storage = storage.uniform_(*FLOAT_RANGE, generator=generator).to(dtype)
        assert spec.shape is not None  # an empty slot has no tensor to draw
        return storage.as_strided(spec.shape, spec.strides) if spec.strides is not None else storage.view(spec.shape)

    def values_verifiable(self, row: KernelRow) -> bool:
        """Operators PyTorch tags as drawing from the generator (``randn``, ``dropout``) give values
        no reference reproduces."""
        import torch

        try:
            overload, _ = parse_arguments(row.attrs.get(OP_ARGUMENTS, ""))
            tags = overload_of(_operator_name(row), overload).tags
        except AtenCallError:
            return True
        return torch.Tag.nondeterministic_seeded not in tags

    def run(self, name: str, overload: str, template: Sequence[Any], tensors: Sequence[Any], device: Any) -> Any:
        outputs = tensor_outputs(call(name, overload, template, tensors, device))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def reference(self, name: str, overload: str, template: Sequence[Any], tensors: Sequence[Any], device: Any) -> Any:
        """The operator on float64 CPU copies; where it takes no float64 (``_scaled_mm`` reads
        float8), its CPU implementation on copies in their own dtypes (a code path independent of
        the CUDA kernel's); where the CPU has no kernel for an integer dtype (``histc``), on every
        tensor as float64 (exact for the integers drawn here)."""
        attempts = (_float64_copy, _cpu_copy, _all_float64)
        for index, copy in enumerate(attempts):
            try:
                outputs = tensor_outputs(call(name, overload, template, [copy(t) for t in tensors], "cpu"))
                break
            except (RuntimeError, ValueError, TypeError, NotImplementedError):
                if index == len(attempts) - 1:
                    raise
        return outputs[0] if len(outputs) == 1 else tuple(outputs)



def _slots(row: KernelRow) -> tuple[TensorSpec, ...]:
    """The input slots, with dtype-only slots past the last shape (a 0-d tensor argument when the
    shape cell is empty: ``clamp`` of a 0-d scale) kept as slots of their own."""
    extra = [TensorSpec(None, spec.dtype) for spec in scalar_aware_dtype_slots(row)[len(row.inputs) :]]
    return tuple(row.inputs) + tuple(extra)


def _all_float64(value: Any) -> Any:
    return value.detach().to("cpu").double() if _is_tensor(value) else value


def _cpu_copy(value: Any) -> Any:
    return value.detach().to("cpu", copy=True) if _is_tensor(value) else value


def _is_tensor(value: Any) -> bool:
    """Not None and not a Python number (a host scalar passed as the model passed it)."""
    return hasattr(value, "detach")


def _float64_copy(value: Any) -> Any:
    if not _is_tensor(value):
        return value
    copy = value.detach().to("cpu")
    return copy.double() if copy.is_floating_point() else copy.clone()


class ScaledMmReplay(AtenOpReplay):
    """``aten._scaled_mm`` (FP8 GEMMs): the generic replay, with a float64 reference.

    The CPU has no fast FP8 GEMM (its implementation takes minutes on a prefill-sized product),
    and float8 values convert to float64 exactly, so the reference is the product of the float64
    operands times both scales (plus the bias), which is what the kernel computes before rounding
    to its output dtype.  On CUDA it is computed there (``reference_on_device``: a float64 GEMM
    takes milliseconds there, seconds on the host); the scales and the bias are applied in place,
    so that it holds the float64 operands and one float64 product at once (``reference_bytes``).
    """

    kernel_types = ("aten._scaled_mm",)
    kernel_type_prefixes = ()
    reference_on_device = True

    def reference(self, name: str, overload: str, template: Sequence[Any], tensors: Sequence[Any], device: Any) -> Any:
        where = self.reference_device(tensors)

        def operand(position: int) -> Any:
            value = template[position] if position < len(template) else None
            if not isinstance(value, dict):
                return None
            tensor = tensors[int(value["tensor"])]
            return tensor.detach().to(where).double() if _is_tensor(tensor) else tensor

        a, b, scale_a, scale_b, bias = (operand(i) for i in range(5))
        product = (a @ b).mul_(scale_a).mul_(scale_b)
        return product if bias is None else product.add_(bias)

    def parameters(self, row: KernelRow, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """An FP8 linear layer: the second operand is its weight (with its scale)."""
        _, _, template, tensors, _ = args
        return tuple(
            tensors[int(template[position]["tensor"])]
            for position in (1, 3)
            if position < len(template) and isinstance(template[position], dict)
        )
