"""``AddRmsNormBias`` replay: ``x = x1 + x2``, ``y = x * rstd * gamma (+ beta)``.

The row is ``x1;x2;gamma;beta -> y;rstd;x`` (``aclnnAddRmsNormBias``: ``x1``, ``x2``, ``gamma``,
``betaOptional``, ``epsilon`` -> ``yOut``, ``rstdOut``, ``xOut``).  ``beta`` is optional: an empty
fourth slot (``DT_UNDEFINED``/``NULL``) is a call without it.  ``gamma`` (and ``beta``) have the
shape of the trailing dims of ``x1`` that are normalised; ``rstd`` (FLOAT) is ``x1``'s shape with
those dims set to 1 (vllm-ascend's adapter allocates it so); ``y`` and ``x`` have ``x1``'s shape and
dtype.  No public profile row of this kernel type exists; the layout is the one Ascend's replay
script ``AddRmsNormBias_run.py`` parses (four input slots, three outputs), whose epsilon, ``1e-6``,
is used here.  That script also replays a "mixed-rank" TensorCast row (``x1 [1,T,H]``,
``x2 [T,H]``) on a storage-equivalent pair; the kernel itself needs equal shapes, and such rows are
refused here.

On an NPU the call is vllm-ascend's custom operator
``torch.ops._C_ascend.npu_add_rms_norm_bias(x1, x2, gamma, beta, epsilon)`` -> ``(y, rstd, x)``
(csrc/add_rms_norm_bias).  The portable path mirrors the kernel's float32 arithmetic: the sum in
float32, ``torch._fused_rms_norm`` on it (one kernel on CUDA), the bias added before the one
rounding of ``y``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.tensors import DTYPES, FLOATING, KernelRow, TensorSpec, shape_text

if TYPE_CHECKING:
    import torch

EPSILON = 1e-6


def _slots(row: KernelRow) -> tuple[TensorSpec, TensorSpec, TensorSpec, TensorSpec | None]:
    inputs = row.inputs
    well_formed = len(inputs) >= 3 and all(s.present for s in inputs[:3])
    if not well_formed or any(s.present for s in inputs[4:]):
        raise CaseBuildError(
            f"{row.kernel_type} needs input slots x1;x2;gamma[;beta], got " + ";".join(shape_text(s) for s in inputs)
        )
    beta = inputs[3] if len(inputs) > 3 and inputs[3].present else None
    return inputs[0], inputs[1], inputs[2], beta


def _check_outputs(row: KernelRow, x1: TensorSpec, g: int) -> None:
    assert x1.shape is not None
    outputs = row.present_outputs
    if len(outputs) != 3:
        raise CaseBuildError(f"{row.kernel_type} needs outputs y;rstd;x, got {len(outputs)} outputs")
    y, rstd, x = outputs
    for name, spec in (("y", y), ("x", x)):
        if spec.shape != x1.shape or spec.dtype != x1.dtype:
            raise CaseBuildError(
                f"{row.kernel_type} output {name} {shape_text(spec)} {spec.dtype} should match x1 "
                f"{shape_text(x1)} {x1.dtype}"
            )
    expected = x1.shape[: len(x1.shape) - g] + (1,) * g
    if rstd.shape != expected or DTYPES[rstd.dtype][0] != "float32":
        raise CaseBuildError(
            f"{row.kernel_type} output rstd {shape_text(rstd)} {rstd.dtype} should be "
            f"[{','.join(map(str, expected))}] FLOAT (x1 with the {g} normalised dim(s) set to 1)"
        )


class AddRmsNormBiasReplay(OpReplay):
    kernel_types = ("AddRmsNormBias",)
    npu_api = "torch.ops._C_ascend.npu_add_rms_norm_bias"

    def check(self, row: KernelRow) -> None:
        x1, x2, gamma, beta = _slots(row)
        assert x1.shape is not None and gamma.shape is not None
        kind = row.kernel_type
        if x2.shape != x1.shape:
            raise CaseBuildError(
                f"{kind} x2 {shape_text(x2)} differs from x1 {shape_text(x1)}; the kernel adds equal shapes "
                "(a mixed-rank TensorCast row is not a kernel call)"
            )
        g = len(gamma.shape)
        if g == 0 or g > len(x1.shape) or x1.shape[len(x1.shape) - g :] != gamma.shape:
            raise CaseBuildError(f"{kind} gamma {shape_text(gamma)} is not the trailing dims of x1 {shape_text(x1)}")
        if beta is not None and beta.shape != gamma.shape:
            raise CaseBuildError(f"{kind} beta {shape_text(beta)} should have gamma's shape {shape_text(gamma)}")
        dtypes = [x1.dtype, x2.dtype, gamma.dtype] + ([beta.dtype] if beta is not None else [])
        if x1.dtype not in FLOATING or x2.dtype != x1.dtype or any(d not in FLOATING for d in dtypes):
            raise CaseBuildError(f"{kind} needs floating inputs with x1 and x2 of one dtype, got {';'.join(dtypes)}")
        _check_outputs(row, x1, g)

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        self.check(row)
        x1, x2, gamma, beta = _slots(row)
        assert gamma.shape is not None
        return (
            self.random(x1, device, generator),
            self.random(x2, device, generator),
            self.random(gamma, device, generator),
            self.random(beta, device, generator) if beta is not None else None,
            list(gamma.shape),
            EPSILON,
        )

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        x1, x2, gamma, beta, _, eps = args
        return self.api_call(x1, x2, gamma, beta, eps, select=(0, 1, 2))

    def run(
        self,
        x1: "torch.Tensor",
        x2: "torch.Tensor",
        gamma: "torch.Tensor",
        beta: "torch.Tensor | None",
        shape: list[int],
        eps: float,
    ) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
        import torch

        x = x1.float().add_(x2)  # the kernel sums in float32 and normalises that sum
        fused = getattr(torch, "_fused_rms_norm", None)
        if fused is not None:
            y, rstd = fused(x, shape, gamma.float(), eps)
        else:  # older torch: the explicit formula
            dims = tuple(range(x.dim() - len(shape), x.dim()))
            rstd = x.square().mean(dims, keepdim=True).add_(eps).rsqrt_()
            y = x * rstd * gamma
        if beta is not None:
            y = y.add_(beta)
        return y.to(x1.dtype), rstd, x.to(x1.dtype)

    def reference(
        self,
        x1: "torch.Tensor",
        x2: "torch.Tensor",
        gamma: "torch.Tensor",
        beta: "torch.Tensor | None",
        shape: list[int],
        eps: float,
    ) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
        a, b, w = (t.detach().to("cpu").double() for t in (x1, x2, gamma))
        x = a + b
        dims = tuple(range(x.dim() - len(shape), x.dim()))
        rstd = (x.square().mean(dims, keepdim=True) + eps).rsqrt()
        y = x * rstd * w
        if beta is not None:
            y = y + beta.detach().to("cpu").double()
        return y, rstd, x
