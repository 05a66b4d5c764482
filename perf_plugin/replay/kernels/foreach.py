"""The multi-tensor kernels of optimizers: ``ForeachAddList``, ``ForeachMulScalar`` and their kin.

One launch updates a whole list of tensors (every parameter of a model: SGD's ``p += -lr * g``
is ``_foreach_add_(params, grads, alpha=-lr)``, weight decay a ``_foreach_mul_``).  Row layout
(the real Level1 training profile, ``tests/fixtures/ascend/kernel_details_level1.csv``: one row
each, 25 % of its time): the lists' tensors one slot each, list after list, then a dtype-only
slot for the scalar where the kernel takes one (``alpha`` of AddList, the factor of MulScalar);
the outputs are the result list, e.g. 17 FLOAT weights and biases of a CNN:
``"64,3,11,11;64;...;1000;64,3,11,11;...;1000;"`` -> ``"23232;64;...;1000"``.  The outputs are
recorded flattened, so only their element counts are compared with the inputs'.

API on every device: the ``torch._foreach_*`` call (op-plugin sends it to the Foreach kernel on
the NPU), out of place, on the row's tensor lists, with ``alpha`` / the scalar drawn as a host
value.  Verified against the same call on float64 CPU copies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.tensors import FLOATING, KernelRow, TensorSpec

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ForeachKind:
    function: str  # torch._foreach_<function>
    lists: int  # tensor lists the kernel reads
    scalar: bool  # a scalar follows the lists (alpha, or the operand)


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def plan(row: KernelRow, kind: ForeachKind) -> int:
    """The list length; CaseBuildError where the row is not ``kind.lists`` matching lists."""
    outputs = row.present_outputs
    count = len(outputs)
    tensors = [s for s in row.inputs if s.present]
    if not count or len(tensors) != kind.lists * count or any(not s.present for s in row.inputs[: len(tensors)]):
        raise CaseBuildError(f"{row.kernel_type} needs {kind.lists} list(s) of as many tensors as its {count} outputs, "
                             f"slot after slot; the row has {len(tensors)} input tensors")
    for index, out in enumerate(outputs):
        assert out.shape is not None
        for k in range(kind.lists):
            spec = row.inputs[k * count + index]
            assert spec.shape is not None
            if _numel(spec.shape) != _numel(out.shape) or spec.dtype != out.dtype or spec.dtype not in FLOATING:
                raise CaseBuildError(f"{row.kernel_type} list {k} tensor {index} ({spec.dtype} {list(spec.shape)}) does "
                                     f"not match output {index} ({out.dtype} {list(out.shape)}); floating lists only")
    return count


class _ForeachReplay(OpReplay):
    kind: ClassVar[ForeachKind]

    def check(self, row: KernelRow) -> None:
        plan(row, self.kind)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        count = plan(row, self.kind)
        lists = tuple(
            [self.random(row.inputs[k * count + i], device, generator) for i in range(count)]
            for k in range(self.kind.lists)
        )
        # the scalar's value (a learning rate, a decay factor) does not change the kernel
        return lists, 0.5 if self.kind.scalar else None, tuple(row.present_outputs)

    def _arguments(self, lists: tuple[list[Any], ...], scalar: float | None) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if scalar is None:
            return lists, {}
        if len(lists) == 2:
            return lists, {"alpha": scalar}
        return (*lists, scalar), {}

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        lists, scalar, _ = args
        positional, kwargs = self._arguments(lists, scalar)
        return self.api_call(*positional, **kwargs)

    def run(self, lists: tuple[list["torch.Tensor"], ...], scalar: float | None,
            outputs: tuple[TensorSpec, ...]) -> tuple["torch.Tensor", ...]:
        import torch

        positional, kwargs = self._arguments(lists, scalar)
        results = getattr(torch, f"_foreach_{self.kind.function}")(*positional, **kwargs)
        # the profile records the results flattened (the kernel's view of them)
        return tuple(r.reshape(out.shape) for r, out in zip(results, outputs))


class ForeachAddListReplay(_ForeachReplay):
    kernel_types = ("ForeachAddList",)
    npu_api = "torch._foreach_add"
    kind = ForeachKind("add", 2, True)  # add(list, list, alpha=)


class ForeachSubListReplay(_ForeachReplay):
    kernel_types = ("ForeachSubList",)
    npu_api = "torch._foreach_sub"
    kind = ForeachKind("sub", 2, True)


class ForeachMulListReplay(_ForeachReplay):
    kernel_types = ("ForeachMulList",)
    npu_api = "torch._foreach_mul"
    kind = ForeachKind("mul", 2, False)


class ForeachAddScalarReplay(_ForeachReplay):
    kernel_types = ("ForeachAddScalar",)
    npu_api = "torch._foreach_add"
    kind = ForeachKind("add", 1, True)


class ForeachMulScalarReplay(_ForeachReplay):
    kernel_types = ("ForeachMulScalar",)
    npu_api = "torch._foreach_mul"
    kind = ForeachKind("mul", 1, True)
