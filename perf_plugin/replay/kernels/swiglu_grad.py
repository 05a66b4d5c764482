"""``SwiGluGrad`` replay: the backward of ``y = silu(a) * b`` with ``a, b = x.chunk(2, dim)``.

The row is ``dy;x -> dx`` (``aclnnSwiGluGrad``; Level2 row: ``dy [4096,3072]``, ``x [4096,6144]``
-> ``dx [4096,6144]``, all BF16).  ``dim`` is an attribute the row does not record: it is the one
dimension that ``x`` has twice as long as ``dy`` (as ``SwiGlu``'s replay derives it).  With
``s = sigmoid(a)``::

    dx = cat(dy * b * s * (1 + a * (1 - s)),  dy * a * s)      (along dim)

On an NPU the call is ``torch.ops.npu.npu_swiglu_backward(dy, x, dim)`` (op-plugin schema
``npu_swiglu_backward(Tensor grad_output, Tensor input, int dim=-1) -> Tensor``), the derivative
torch_npu registers for ``npu_swiglu``.  The portable path writes both halves straight into ``dx``:
``aten::silu_backward`` on ``dy * b`` for the first, ``silu(a) * dy`` for the second (four kernels,
no concatenation).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.activation import SwiGluDimReplay, swiglu_dim
from perf_plugin.replay.tensors import FLOATING, KernelRow, TensorSpec, shape_text

if TYPE_CHECKING:
    import torch


def _slots(row: KernelRow) -> tuple[TensorSpec, TensorSpec, TensorSpec]:
    inputs = row.inputs
    if len(inputs) < 2 or not (inputs[0].present and inputs[1].present) or any(s.present for s in inputs[2:]):
        raise CaseBuildError(f"{row.kernel_type} needs input slots dy;x, got " + ";".join(shape_text(s) for s in inputs))
    outputs = row.present_outputs
    if len(outputs) != 1:
        raise CaseBuildError(f"{row.kernel_type} needs exactly one output dx, got {len(outputs)}")
    return inputs[0], inputs[1], outputs[0]


class SwiGluGradReplay(SwiGluDimReplay):
    kernel_types = ("SwiGluGrad",)
    npu_api = "torch.ops.npu.npu_swiglu_backward"

    def dim(self, row: KernelRow) -> int:
        dy, x, dx = _slots(row)
        assert dy.shape is not None and x.shape is not None
        kind = row.kernel_type
        dim = swiglu_dim(x.shape, dy.shape)
        if dim is None:
            raise CaseBuildError(f"{kind} dy {shape_text(dy)} is not x {shape_text(x)} halved along one dimension")
        if x.dtype not in FLOATING or dy.dtype != x.dtype:
            raise CaseBuildError(f"{kind} needs dy and x of one floating dtype, got {dy.dtype};{x.dtype}")
        if dx.shape != x.shape or dx.dtype != x.dtype:
            raise CaseBuildError(f"{kind} output dx {shape_text(dx)} {dx.dtype} should match x {shape_text(x)} {x.dtype}")
        return dim

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        dim = self.dim(row)
        return self.random(row.inputs[0], device, generator), self.random(row.inputs[1], device, generator), dim

    def run(self, dy: "torch.Tensor", x: "torch.Tensor", dim: int) -> "torch.Tensor":
        import torch

        a, b = x.chunk(2, dim)
        dx = torch.empty_like(x)
        da, db = dx.chunk(2, dim)
        # silu'(a) = s * (1 + a * (1 - s)); silu_backward multiplies it by its first argument
        torch.ops.aten.silu_backward.grad_input(dy * b, a, grad_input=da)
        torch.mul(torch.nn.functional.silu(a), dy, out=db)
        return dx

    def reference(self, dy: "torch.Tensor", x: "torch.Tensor", dim: int) -> "torch.Tensor":
        import torch

        g, xx = dy.detach().to("cpu").double(), x.detach().to("cpu").double()
        a, b = xx.chunk(2, dim)
        s = torch.sigmoid(a)
        return torch.cat((g * b * (s + a * s * (1 - s)), g * a * s), dim)
