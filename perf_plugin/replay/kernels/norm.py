"""``RmsNorm`` replay: ``y = x * rstd * gamma`` with ``rstd = 1 / sqrt(mean(x^2) + eps)``.

The row is ``x;gamma -> y;rstd`` (``aclnnRmsNorm``): ``gamma`` has the shape of the trailing
dims of ``x`` that are normalised, ``y`` the shape and dtype of ``x``, and ``rstd`` (FLOAT) the
shape of ``x`` with the normalised dims set to 1 (``x [4096,1,1024]``, ``gamma [1024]`` ->
``rstd [4096,1,1]``).  A row may record ``y`` alone.  The epsilon is an attribute the row does
not record; ``1e-6`` is the default of ``torch_npu.npu_rms_norm`` and ``aclnnRmsNorm`` callers.

The op runs as ``torch._fused_rms_norm`` (one kernel on CUDA, returns ``(y, rstd)`` with rstd in
float32 for half inputs) where torch has it, else as the explicit float32 formula.  On an NPU it
is ``torch_npu.npu_rms_norm(x, gamma, epsilon)`` (aclnnRmsNorm), which returns ``(y, rstd)``.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.trace.args import concrete_arg, tensor_arg
from perf_plugin.trace.events import TraceOp
from perf_plugin.trace.mapped import MappedOp, Slot
from perf_plugin.replay.tensors import (
    DTYPES,
    FLOATING,
    KernelRow,
    TensorSpec,
    shape_text,
)

if TYPE_CHECKING:
    import torch

EPSILON = 1e-6


def _trace_rms_norm(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    """``rms_norm`` / ``_fused_rms_norm`` with a weight: ``x;gamma -> y;rstd`` (rstd FLOAT, the
    input's shape reduced to 1 over the normalised dims)."""
    x, weight = tensor_arg(op, 0), tensor_arg(op, 2)
    if x is None or weight is None or x.rank == 0:
        return None
    normalized = concrete_arg(op, 1)
    dims = len(normalized) if isinstance(normalized, list) and normalized else weight.rank
    dims = max(1, min(dims, x.rank))
    rstd = x.shape[:-dims] + (1,) * dims
    return MappedOp(
        "RmsNorm",
        (Slot(x.shape, x.dtype), Slot(weight.shape, weight.dtype)),
        (Slot(x.shape, x.dtype), Slot(rstd, "FLOAT")),
    )


class RmsNormReplay(OpReplay):
    kernel_types = ("RmsNorm",)
    npu_api = "torch_npu.npu_rms_norm"
    trace_ops = MappingProxyType({"aten::rms_norm": _trace_rms_norm, "aten::_fused_rms_norm": _trace_rms_norm})

    def _slots(self, row: KernelRow) -> tuple[TensorSpec, TensorSpec, TensorSpec, TensorSpec | None]:
        inputs = row.inputs
        well_formed = len(inputs) >= 2 and inputs[0].present and inputs[1].present
        if not well_formed or any(s.present for s in inputs[2:]):
            raise CaseBuildError(
                f"{row.kernel_type} needs input slots x;gamma, got " + ";".join(shape_text(s) for s in inputs)
            )
        outputs = row.present_outputs
        if len(outputs) not in (1, 2):
            raise CaseBuildError(f"{row.kernel_type} needs outputs y or y;rstd, got {len(outputs)} outputs")
        return inputs[0], inputs[1], outputs[0], outputs[1] if len(outputs) == 2 else None

    def check(self, row: KernelRow) -> None:
        x, gamma, y, rstd = self._slots(row)
        assert x.shape is not None and gamma.shape is not None and y.shape is not None
        g = len(gamma.shape)
        if g == 0 or g > len(x.shape) or x.shape[len(x.shape) - g :] != gamma.shape:
            raise CaseBuildError(
                f"{row.kernel_type} gamma {shape_text(gamma)} is not the trailing dims of x {shape_text(x)}"
            )
        if y.shape != x.shape:
            raise CaseBuildError(f"{row.kernel_type} output y {shape_text(y)} differs from x {shape_text(x)}")
        if x.dtype not in FLOATING or gamma.dtype not in FLOATING:
            raise CaseBuildError(f"{row.kernel_type} needs floating x and gamma, got {x.dtype};{gamma.dtype}")
        if y.dtype != x.dtype:
            raise CaseBuildError(f"{row.kernel_type} output y dtype {y.dtype} differs from x dtype {x.dtype}")
        if rstd is not None:
            expected = x.shape[: len(x.shape) - g] + (1,) * g
            if rstd.shape != expected:
                raise CaseBuildError(
                    f"{row.kernel_type} output rstd {shape_text(rstd)} should be "
                    f"[{','.join(map(str, expected))}] (x {shape_text(x)} with the {g} normalised dim(s) set to 1)"
                )
            # rstd is accumulated in float32 (float64 for float64 x), whatever the dtype of x
            wanted = "float64" if DTYPES[x.dtype][0] == "float64" else "float32"
            if DTYPES[rstd.dtype][0] != wanted:
                raise CaseBuildError(
                    f"{row.kernel_type} output rstd dtype {rstd.dtype} should be "
                    f"{'DOUBLE' if wanted == 'float64' else 'FLOAT'} for x of dtype {x.dtype}"
                )

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        self.check(row)
        x, gamma, _, rstd = self._slots(row)
        assert gamma.shape is not None
        return (
            self.random(x, device, generator),
            self.random(gamma, device, generator),
            list(gamma.shape),
            EPSILON,
            rstd is not None,
        )

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        x, gamma, _, eps, with_rstd = args
        return self.api_call(x, gamma, epsilon=eps, select=(0, 1) if with_rstd else (0,))

    def run(
        self, x: "torch.Tensor", gamma: "torch.Tensor", shape: list[int], eps: float, with_rstd: bool
    ) -> "torch.Tensor | tuple[torch.Tensor, torch.Tensor]":
        import torch

        fused = getattr(torch, "_fused_rms_norm", None)
        if fused is not None:
            y, rstd = fused(x, shape, gamma, eps)
        else:  # explicit formula in float32 (older torch)
            dims = tuple(range(x.dim() - len(shape), x.dim()))
            xf = x.float()
            rstd = xf.square().mean(dims, keepdim=True).add_(eps).rsqrt_()
            y = (xf * rstd * gamma).to(x.dtype)
        return (y, rstd) if with_rstd else y

    def reference(
        self, x: "torch.Tensor", gamma: "torch.Tensor", shape: list[int], eps: float, with_rstd: bool
    ) -> "torch.Tensor | tuple[torch.Tensor, torch.Tensor]":
        x64 = x.detach().to("cpu").double()
        g64 = gamma.detach().to("cpu").double()
        dims = tuple(range(x64.dim() - len(shape), x64.dim()))
        rstd = (x64.square().mean(dims, keepdim=True) + eps).rsqrt()
        y = x64 * rstd * g64
        return (y, rstd) if with_rstd else y
