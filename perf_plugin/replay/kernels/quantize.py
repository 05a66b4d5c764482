"""Quantisation replays: ``AscendQuantV2`` (static scale) and ``DynamicQuant`` (per-token scale).

``AscendQuantV2`` row: ``x;scale[;offset] -> y``.  ``x`` is FLOAT16/BF16/FLOAT, ``scale`` and the
optional ``offset`` have one shape, either 1-D (size 1: per tensor; size ``x[-1]`` or ``x[-2]``:
per channel along that axis) or ``x``'s rank with every dim 1 but one of the last two; ``y`` is
INT8 with ``x``'s shape.  The kernel (ops-nn ``quant/ascend_quant_v2``, ``ascend_quant_v2_kernel.h``)
casts to float32, computes ``x * scale + offset`` in float32, rounds with ``CAST_RINT`` (half to
even) and saturates to int8 (the repository's golden clips to [-128, 127]).  On an NPU it is
``torch_npu.npu_quantize(x, scale, offset, torch.qint8, axis, False)``: with ``div_mode=False``
op-plugin calls ``aclnnAscendQuantV3`` (``QuantizeKernelNpuOpApi.cpp``; ``div_mode=True`` would
launch a different kernel, ``Quantize``); Ascend/msmodeling's ``AscendQuantV2_run.py`` makes the
same call with ``axis=-1`` (op-plugin passes an axis below -1 on and makes any other -1).

``DynamicQuant`` row: ``x[;smooth_scales] -> y;scale``.  ``x`` is FLOAT16/BF16 of rank >= 2,
``smooth_scales`` ``[x[-1]]`` in ``x``'s dtype, ``y`` INT8 of ``x``'s shape, ``scale`` FLOAT of
``x.shape[:-1]``.  Per row: ``amax = max|x * smooth|``, ``y = round(x * (127 / amax))``,
``scale = amax / 127`` (aclnnDynamicQuant documents ``y = round(x / scale)``; the A2/A3 kernel
base ``DynamicQuantBase::GetScale`` computes the multiplier ``127 / max`` and multiplies, which is
what is replayed).  Msmodeling's ``DynamicQuant_run.py`` replays rows with one input through
``torch_npu.npu_dynamic_quant(x)``, which returns ``(y, scale)``.  MoE rows (``group_index``),
asymmetric rows (an ``offset`` output) and int4/fp8 outputs are not replayed.

Portable path: the same float32 arithmetic in torch elementwise kernels (torch has no fused
equivalent: ``quantize_per_channel`` divides by the scale and adds an integer zero point, a
different rounding).  The references compute in float64 and round to float32 after each
operation the kernel does in float32; since 53 >= 2*24+2, that gives the correctly rounded
float32 result of every single ``+ - * /`` (Figueroa's double-rounding theorem), so the int8
outputs are compared exactly (tolerance 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.tensors import KernelRow, TensorSpec, shape_text

if TYPE_CHECKING:
    import torch

Shape = tuple[int, ...]
HALF_DTYPES = frozenset({"FLOAT16", "FP16", "HALF", "BF16", "BFLOAT16"})
QUANT_INPUT_DTYPES = HALF_DTYPES | {"FLOAT", "FLOAT32", "FP32"}
INT8_MAX = 127.0
# Scales have magnitudes in [0.9, 1.1] * 100 and |x| is in [0.5, 1.5], so |x * scale| spans
# [45, 165]: whatever the draw, even one per-tensor scale, most values land inside int8 and
# 8-34 % saturate, so both the rounding and the clamp are exercised by every case.
STATIC_SCALE_MAGNITUDE = 100.0
STATIC_SCALE_SPREAD = 0.2  # of the random draw's [0.5, 1.5] magnitudes: [0.9, 1.1]
OFFSET_MAGNITUDE = 4.0


def _f32(value: "torch.Tensor") -> "torch.Tensor":
    """A float64 tensor rounded to the nearest float32 values (and back to float64)."""
    import torch

    return value.to(torch.float32).to(torch.float64)


def _saturate_int8(rounded: "torch.Tensor") -> "torch.Tensor":
    import torch

    return rounded.clamp_(-128, 127).to(torch.int8)


def _single_output(row: KernelRow, dtype: str, shape: Shape) -> None:
    outputs = row.present_outputs
    if len(outputs) != 1:
        raise CaseBuildError(f"{row.kernel_type} needs exactly one output (y), got {len(outputs)}")
    y = outputs[0]
    if y.dtype != dtype or y.shape != shape:
        raise CaseBuildError(
            f"{row.kernel_type} output y is {y.dtype} {shape_text(y)}; expected {dtype} {shape_text(shape)} "
            "(int4, int32-packed and float8 outputs are not replayed)"
        )


# ----------------------------------------------------------------------------- AscendQuantV2
def quant_axis(x: Shape, scale: Shape) -> int:
    """The axis (-1 or -2) of ``x`` that ``scale`` runs along; raises ValueError when none fits."""
    if len(scale) == 1:
        if scale[0] in (1, x[-1]):
            return -1
        if len(x) >= 2 and scale[0] == x[-2]:
            return -2
    elif len(scale) == len(x) and len(x) >= 2:
        rest_are_one = all(d == 1 for d in scale[:-2])
        if rest_are_one and scale[-2] == 1 and scale[-1] in (1, x[-1]):
            return -1
        if rest_are_one and scale[-1] == 1 and scale[-2] == x[-2]:
            return -2
    raise ValueError(
        f"scale {shape_text(scale)} matches neither the last nor the second-to-last axis of x {shape_text(x)}"
    )


class AscendQuantV2Replay(OpReplay):
    """``y = saturate_int8(rint(float32(x) * scale + offset))`` along the last or second-to-last axis."""

    kernel_types = ("AscendQuantV2",)
    npu_api = "torch_npu.npu_quantize"

    def _slots(self, row: KernelRow) -> tuple[TensorSpec, TensorSpec, TensorSpec | None]:
        inputs = row.inputs
        if len(inputs) < 2 or not inputs[0].present or not inputs[1].present:
            raise CaseBuildError(f"{row.kernel_type} needs x and scale (input slots 0 and 1)")
        extra = [i for i, s in enumerate(inputs[3:], start=3) if s.present]
        if extra:
            raise CaseBuildError(f"{row.kernel_type} input slot {extra[0]} is present; only x;scale;offset are known")
        offset = inputs[2] if len(inputs) > 2 and inputs[2].present else None
        return inputs[0], inputs[1], offset

    def axis(self, row: KernelRow) -> int:
        x, scale, offset = self._slots(row)
        assert x.shape is not None and scale.shape is not None
        for name, spec in (("x", x), ("scale", scale)) + ((("offset", offset),) if offset else ()):
            if spec.dtype not in QUANT_INPUT_DTYPES:
                raise CaseBuildError(f"{row.kernel_type} {name} is {spec.dtype}; expected FLOAT16, BF16 or FLOAT")
        if offset is not None and offset.shape != scale.shape:
            raise CaseBuildError(
                f"{row.kernel_type} offset {shape_text(offset)} differs from scale {shape_text(scale)} (must match)"
            )
        try:
            axis = quant_axis(x.shape, scale.shape)
        except ValueError as exc:
            raise CaseBuildError(f"{row.kernel_type} {exc}") from None
        _single_output(row, "INT8", x.shape)
        return axis

    def check(self, row: KernelRow) -> None:
        self.axis(row)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        axis = self.axis(row)
        x_spec, scale_spec, offset_spec = self._slots(row)
        assert x_spec.shape is not None and scale_spec.shape is not None
        x = self.random(x_spec, device, generator)
        drawn = self.random(scale_spec, device, generator)
        # magnitudes 1 + (|s| - 1) * spread, signs kept
        scale = drawn.mul(STATIC_SCALE_SPREAD).add_(drawn.sign(), alpha=1 - STATIC_SCALE_SPREAD)
        scale.mul_(STATIC_SCALE_MAGNITUDE)
        offset = None
        if offset_spec is not None:
            offset = self.random(offset_spec, device, generator).mul_(OFFSET_MAGNITUDE)
        # a 1-D per-channel scale along axis -2 broadcasts as a column
        column = axis == -2 and len(scale_spec.shape) == 1
        broadcast = (scale_spec.shape[0], 1) if column else tuple(scale_spec.shape)
        return x, scale, offset, axis, broadcast

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        import torch

        x, scale, offset, axis, _ = args
        # positional as op-plugin declares it: (input, scales, zero_points, dtype, axis, div_mode)
        return self.api_call(x, scale, offset, torch.qint8, axis, False)

    def run(
        self, x: "torch.Tensor", scale: "torch.Tensor", offset: "torch.Tensor | None", axis: int, broadcast: Shape
    ) -> "torch.Tensor":
        import torch

        # x (half) times a float32 scale promotes to one float32 multiply, as the kernel does
        y = torch.mul(x, scale.float().reshape(broadcast))
        if offset is not None:
            y.add_(offset.float().reshape(broadcast))
        return _saturate_int8(y.round_())

    def reference(
        self, x: "torch.Tensor", scale: "torch.Tensor", offset: "torch.Tensor | None", axis: int, broadcast: Shape
    ) -> "torch.Tensor":
        import torch

        x64 = x.detach().to("cpu", torch.float64)
        value = _f32(x64 * scale.detach().to("cpu", torch.float64).reshape(broadcast))
        if offset is not None:
            value = _f32(value + offset.detach().to("cpu", torch.float64).reshape(broadcast))
        return _saturate_int8(torch.round(value))


# ----------------------------------------------------------------------------- DynamicQuant
class DynamicQuantReplay(OpReplay):
    """Per-token symmetric int8 quantisation: ``y = rint(x * 127 / max|x|)``, ``scale = max|x| / 127``."""

    kernel_types = ("DynamicQuant",)
    npu_api = "torch_npu.npu_dynamic_quant"

    def _slots(self, row: KernelRow) -> tuple[TensorSpec, TensorSpec | None]:
        inputs = row.inputs
        if not inputs or not inputs[0].present:
            raise CaseBuildError(f"{row.kernel_type} needs x (input slot 0)")
        if any(s.present for s in inputs[2:]):
            raise CaseBuildError(
                f"{row.kernel_type} has a group_index (input slot 2): MoE per-expert smooth scales are not replayed"
            )
        smooth = inputs[1] if len(inputs) > 1 and inputs[1].present else None
        return inputs[0], smooth

    def check(self, row: KernelRow) -> None:
        x, smooth = self._slots(row)
        assert x.shape is not None
        if x.dtype not in HALF_DTYPES or len(x.shape) < 2:
            raise CaseBuildError(
                f"{row.kernel_type} x is {x.dtype} {shape_text(x)}; expected FLOAT16/BF16 of rank >= 2"
            )
        if smooth is not None and (smooth.shape != x.shape[-1:] or smooth.dtype != x.dtype):
            raise CaseBuildError(
                f"{row.kernel_type} smooth_scales is {smooth.dtype} {shape_text(smooth)}; expected {x.dtype} "
                f"{shape_text(x.shape[-1:])}"
            )
        outputs = row.present_outputs
        expected = (TensorSpec(x.shape, "INT8"), TensorSpec(x.shape[:-1], "FLOAT"))
        got = tuple(TensorSpec(s.shape, s.dtype) for s in outputs)
        if got != expected:
            raise CaseBuildError(
                f"{row.kernel_type} outputs are "
                + ";".join(f"{s.dtype} {shape_text(s)}" for s in outputs)
                + f"; expected INT8 {shape_text(x)};FLOAT {shape_text(x.shape[:-1])} (asymmetric rows with an "
                "offset output and int4/int32/float8 outputs are not replayed)"
            )

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        self.check(row)
        x_spec, smooth_spec = self._slots(row)
        x = self.random(x_spec, device, generator)
        smooth = self.random(smooth_spec, device, generator).abs_() if smooth_spec is not None else None
        return x, smooth

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        x, smooth = args
        kwargs = {"smooth_scales": smooth} if smooth is not None else {}
        return self.api_call(x, select=(0, 1), **kwargs)

    def run(self, x: "torch.Tensor", smooth: "torch.Tensor | None") -> tuple["torch.Tensor", "torch.Tensor"]:
        import torch

        values = x.float()
        if smooth is not None:
            values.mul_(smooth)  # in place on float32: the product is rounded to float32 once
        # max |v| per row in one reduction (no |v| temporary)
        amax = torch.linalg.vector_norm(values, ord=float("inf"), dim=-1, keepdim=True)
        # a true division: ``127 / tensor`` is reciprocal-then-multiply in torch (two roundings)
        multiplier = torch.full_like(amax, INT8_MAX).div_(amax)
        y = _saturate_int8(values.mul_(multiplier).round_())
        return y, amax.squeeze(-1).div_(INT8_MAX)

    def reference(self, x: "torch.Tensor", smooth: "torch.Tensor | None") -> tuple["torch.Tensor", "torch.Tensor"]:
        import torch

        values = x.detach().to("cpu", torch.float64)
        if smooth is not None:
            values = _f32(values * smooth.detach().to("cpu", torch.float64))
        amax = values.abs().amax(dim=-1, keepdim=True)
        multiplier = _f32(INT8_MAX / amax)
        y = _saturate_int8(torch.round(_f32(values * multiplier)))
        return y, _f32(amax / INT8_MAX).squeeze(-1)
