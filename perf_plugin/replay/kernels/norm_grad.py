"""``RmsNormGrad`` replay: the backward of ``y = x * rstd * gamma``.

The row is ``dy;x;rstd;gamma -> dx;dgamma`` (``aclnnRmsNormGrad``; Level2 rows: ``dy``/``x``
``[4096,1,1024]`` BF16, ``rstd [4096,1,1]`` FLOAT, ``gamma [1024]`` BF16 -> ``dx [4096,1,1024]``
BF16, ``dgamma [1024]`` FLOAT).  ``gamma`` is the trailing dims of ``x`` that are normalised, ``rstd``
the forward's ``1 / sqrt(mean(x^2) + eps)`` (``x``'s shape with those dims set to 1).  With
``xhat = x * rstd`` and ``g = dy * gamma``::

    dx     = rstd * (g - xhat * mean(g * xhat))      (mean over the normalised dims)
    dgamma = sum(dy * xhat)                          (sum over the other dims)

``rstd`` is an input the kernel trusts; the replay builds it from ``x`` as the forward does
(``EPSILON`` of the RmsNorm replay), so the inputs are a real forward/backward pair.

On an NPU the call is ``torch.ops.npu.npu_rms_norm_backward(dy, x, gamma, rstd)`` -> ``(dx, dgamma)``
(op-plugin's derivative of ``npu_rms_norm``; torchair lowers it to ``RmsNormGrad(dy, x, rstd, gamma)``).
The portable path is the closed form above in float32, autograd-free: torch's fused
``aten::_fused_rms_norm_backward`` has no CPU kernel and returns ``dgamma`` in ``gamma``'s dtype,
where the kernel writes float32.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.kernels.norm import EPSILON
from perf_plugin.replay.tensors import DTYPES, FLOATING, KernelRow, TensorSpec, shape_text

if TYPE_CHECKING:
    import torch


def _slots(row: KernelRow) -> tuple[TensorSpec, TensorSpec, TensorSpec, TensorSpec, TensorSpec, TensorSpec]:
    inputs = row.inputs
    if len(inputs) < 4 or not all(s.present for s in inputs[:4]) or any(s.present for s in inputs[4:]):
        raise CaseBuildError(
            f"{row.kernel_type} needs input slots dy;x;rstd;gamma, got " + ";".join(shape_text(s) for s in inputs)
        )
    outputs = row.present_outputs
    if len(outputs) != 2:
        raise CaseBuildError(f"{row.kernel_type} needs outputs dx;dgamma, got {len(outputs)} outputs")
    return inputs[0], inputs[1], inputs[2], inputs[3], outputs[0], outputs[1]


def _check_float32(row: KernelRow, spec: TensorSpec, name: str) -> None:
    if DTYPES[spec.dtype][0] != "float32":
        raise CaseBuildError(f"{row.kernel_type} {name} dtype {spec.dtype} should be FLOAT (float32)")


class RmsNormGradReplay(OpReplay):
    kernel_types = ("RmsNormGrad",)
    npu_api = "torch.ops.npu.npu_rms_norm_backward"

    def check(self, row: KernelRow) -> None:
        dy, x, rstd, gamma, dx, dgamma = _slots(row)
        assert x.shape is not None and gamma.shape is not None
        kind = row.kernel_type
        g = len(gamma.shape)
        if g == 0 or g > len(x.shape) or x.shape[len(x.shape) - g :] != gamma.shape:
            raise CaseBuildError(f"{kind} gamma {shape_text(gamma)} is not the trailing dims of x {shape_text(x)}")
        if any(s.dtype not in FLOATING for s in (dy, x, rstd, gamma, dx, dgamma)):
            raise CaseBuildError(f"{kind} needs floating tensors in every slot")
        if dy.shape != x.shape or dy.dtype != x.dtype:
            raise CaseBuildError(f"{kind} dy {shape_text(dy)} {dy.dtype} should match x {shape_text(x)} {x.dtype}")
        expected = x.shape[: len(x.shape) - g] + (1,) * g
        if rstd.shape != expected:
            raise CaseBuildError(
                f"{kind} rstd {shape_text(rstd)} should be [{','.join(map(str, expected))}] "
                f"(x {shape_text(x)} with the {g} normalised dim(s) set to 1)"
            )
        _check_float32(row, rstd, "rstd")
        if dx.shape != x.shape or dx.dtype != x.dtype:
            raise CaseBuildError(f"{kind} output dx {shape_text(dx)} {dx.dtype} should match x {shape_text(x)} {x.dtype}")
        if dgamma.shape != gamma.shape:
            raise CaseBuildError(f"{kind} output dgamma {shape_text(dgamma)} should match gamma {shape_text(gamma)}")
        _check_float32(row, dgamma, "output dgamma")

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        self.check(row)
        dy_spec, x_spec, rstd_spec, gamma_spec, _, _ = _slots(row)
        assert gamma_spec.shape is not None
        dy = self.random(dy_spec, device, generator)
        x = self.random(x_spec, device, generator)
        gamma = self.random(gamma_spec, device, generator)
        dims = tuple(range(x.dim() - len(gamma_spec.shape), x.dim()))
        # the forward's rstd of this very x: a consistent forward/backward pair
        rstd = x.float().square().mean(dims, keepdim=True).add_(EPSILON).rsqrt_().to(rstd_spec.torch_dtype())
        return dy, x, rstd, gamma, len(gamma_spec.shape)

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        dy, x, rstd, gamma, _ = args
        return self.api_call(dy, x, gamma, rstd, select=(0, 1))  # the API takes gamma before rstd

    def run(
        self, dy: "torch.Tensor", x: "torch.Tensor", rstd: "torch.Tensor", gamma: "torch.Tensor", g: int
    ) -> tuple["torch.Tensor", "torch.Tensor"]:
        dims = tuple(range(x.dim() - g, x.dim()))
        lead = tuple(range(x.dim() - g))
        dy32 = dy.float()
        xhat = x.float().mul_(rstd)
        gdy = dy32 * gamma
        projection = (gdy * xhat).mean(dims, keepdim=True)
        dx = gdy.sub_(xhat * projection).mul_(rstd).to(x.dtype)
        dgamma = dy32.mul_(xhat).sum(lead) if lead else dy32.mul_(xhat)
        return dx, dgamma

    def reference(
        self, dy: "torch.Tensor", x: "torch.Tensor", rstd: "torch.Tensor", gamma: "torch.Tensor", g: int
    ) -> tuple["torch.Tensor", "torch.Tensor"]:
        d, xx, r, w = (t.detach().to("cpu").double() for t in (dy, x, rstd, gamma))
        dims = tuple(range(xx.dim() - g, xx.dim()))
        # d/dx of x * r(x) * w with r = (mean(x^2) + eps)^-1/2, dr/dx = -r^3 x / n
        dx = r * w * d - xx * r.pow(3) * (d * w * xx).mean(dims, keepdim=True)
        dgamma = (d * xx * r).sum(tuple(range(xx.dim() - g))) if xx.dim() > g else d * xx * r
        return dx, dgamma
