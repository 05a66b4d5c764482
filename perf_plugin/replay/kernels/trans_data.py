"""``TransData``: a tensor copied from one storage format into another.

Row layout (the real Level1 training profile, ``tests/fixtures/ascend/kernel_details_level1.csv``:
35 rows, 16 % of its time): one input and one output, their formats naming the conversion, e.g.
``"32,3,224,224"`` FLOAT NCHW -> ``"32,1,224,224,8"`` FLOAT NC1HWC0 (an activation into the
convolutions' 5HD layout), ``"32,8,55,55,8"`` NC1HWC0 -> ``"32,64,55,55"`` NCHW, ``"64,3,11,11"``
NCHW -> ``"121,4,16,8"`` FRACTAL_Z (a convolution weight); ``NC1HWC0:1`` is the 5HD sub-format
with C0 = 16.  Replayed: NCHW <-> NC1HWC0 (any C0) and NCHW <-> FRACTAL_Z
(``perf_plugin.replay.kernels._ascend_formats`` gives the layouts); other pairs say which.

NPU API: ``torch_npu.npu_format_cast(x, acl_format)`` on the tensor in its source format (cast
there before timing, ``NpuFormat``): the TransData kernel is that cast.  Portable path: the same
rearrangement as a padded copy and a permutation, on the source layout's storage tensor (a 5HD
source built from random NCHW data, so its padding holds zeros as a real one does).  Verified
exactly against the same rearrangement of float64 CPU copies (it moves values, never computes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.api_call import ACL_FORMATS, ApiCall, NpuFormat
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.kernels._ascend_formats import (
    NCHW_LIKE,
    base_format,
    fits_5hd,
    fits_fractal_z,
    from_5hd,
    from_fractal_z,
    to_5hd,
    to_fractal_z,
)
from perf_plugin.replay.tensors import KernelRow, TensorSpec, shape_text

if TYPE_CHECKING:
    import torch

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Conversion:
    source: str  # NCHW | NC1HWC0 | FRACTAL_Z
    target: str
    nchw: Shape  # the logical NCHW shape of the data
    stored: Shape  # the other side's storage shape

    @property
    def c0(self) -> int:
        return self.stored[-1]


def plan(row: KernelRow) -> Conversion:
    inputs, outputs = [s for s in row.inputs if s.present], row.present_outputs
    if len(inputs) != 1 or len(outputs) != 1:
        raise CaseBuildError(f"TransData needs one input and one output; the row has {len(inputs)} and {len(outputs)}")
    x, y = inputs[0], outputs[0]
    assert x.shape is not None and y.shape is not None
    source, target = base_format(x.format) or "ND", base_format(y.format) or "ND"
    if x.dtype != y.dtype:
        raise CaseBuildError(f"TransData {x.dtype} -> {y.dtype}: a conversion that also casts is not replayed")
    if source in NCHW_LIKE and len(x.shape) == 4 and target in ("NC1HWC0", "FRACTAL_Z"):
        fits = fits_5hd if target == "NC1HWC0" else fits_fractal_z
        if fits(x.shape, y.shape):
            return Conversion("NCHW", target, x.shape, y.shape)
    if target in NCHW_LIKE and len(y.shape) == 4 and source in ("NC1HWC0", "FRACTAL_Z"):
        fits = fits_5hd if source == "NC1HWC0" else fits_fractal_z
        if fits(y.shape, x.shape):
            return Conversion(source, "NCHW", y.shape, x.shape)
    raise CaseBuildError(f"TransData {shape_text(x)} {x.format or 'ND'} -> {shape_text(y)} {y.format or 'ND'}: only "
                         "NCHW <-> NC1HWC0 and NCHW <-> FRACTAL_Z conversions of these shapes are replayed")


def convert(x: "torch.Tensor", conversion: Conversion) -> "torch.Tensor":
    if conversion.source == "NCHW":
        return to_5hd(x, conversion.c0) if conversion.target == "NC1HWC0" else to_fractal_z(x, conversion.c0)
    if conversion.source == "NC1HWC0":
        return from_5hd(x, conversion.nchw[1])
    return from_fractal_z(x, conversion.nchw)


class TransDataReplay(OpReplay):
    kernel_types = ("TransData",)
    npu_api = "torch_npu.npu_format_cast"

    def check(self, row: KernelRow) -> None:
        plan(row)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        conversion = plan(row)
        logical = self.random(TensorSpec(conversion.nchw, row.inputs[0].dtype), device, generator)
        if conversion.source == "NCHW" or device.type == "npu":
            return logical, conversion  # the NPU holds it in the source format (npu_call)
        stored = to_5hd(logical, conversion.c0) if conversion.source == "NC1HWC0" else to_fractal_z(logical, conversion.c0)
        return stored, conversion

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        logical, conversion = args
        source = logical if conversion.source == "NCHW" else NpuFormat(logical, conversion.source)
        return self.api_call(source, ACL_FORMATS[conversion.target])

    def run(self, x: "torch.Tensor", conversion: Conversion) -> "torch.Tensor":
        return convert(x, conversion)

    def tolerance(self, output: TensorSpec) -> float:
        return 0.0  # a copy: every value exact
