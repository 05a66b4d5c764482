"""Dropout on an NPU: ``DSAGenBitMask`` draws the keep mask, ``DropOutDoMask`` applies it.

Row layouts (the real Level1 training profile, ``tests/fixtures/ascend/kernel_details_level1.csv``,
the dropout of AlexNet's classifier):

* ``DSAGenBitMask``: no tensor inputs (N/A: the shape and probability are the launch's
  attributes) -> ``mask [numel/8]`` UINT8, one bit per element of the tensor to drop from,
  drawn by the device's random-number engine (DSA);
* ``DropOutDoMask``: ``x [..]; mask [numel/8] UINT8; keep_prob [1]`` -> ``y`` of x's shape:
  ``y = x * bit / keep_prob``.

API: torch_npu's ``torch_npu._npu_dropout(x, p)`` launches both; the replays time each with the
portable equivalent of its work: a random byte tensor for the mask (values drawn, so only its
shape, dtype and bytes are checked), and the bit unpacking and scaling for ``DoMask``, verified
against the same on float64 CPU copies.  Little-endian bit order within a byte, as torch_npu's
mask is read.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.tensors import FLOATING, KernelRow, shape_text

if TYPE_CHECKING:
    import torch

KEEP = 0.5


def unpack_bits(mask: "torch.Tensor", numel: int) -> "torch.Tensor":
    """UINT8 ``[numel/8]`` -> bool ``[numel]``, bit ``i`` of byte ``j`` being element ``8j + i``."""
    import torch

    shifts = torch.arange(8, device=mask.device, dtype=torch.uint8)
    return ((mask.unsqueeze(1) >> shifts) & 1).reshape(-1)[:numel].bool()


class DSAGenBitMaskReplay(OpReplay):
    kernel_types = ("DSAGenBitMask",)
    npu_api = "torch.randint"

    def check(self, row: KernelRow) -> None:
        out = row.present_outputs
        if len(out) != 1 or out[0].dtype != "UINT8" or out[0].shape is None or len(out[0].shape) != 1:
            raise CaseBuildError("DSAGenBitMask needs one UINT8 [bytes] output (the bit mask)")

    def values_verifiable(self, row: KernelRow) -> bool:
        return False  # random draws

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        self.check(row)
        shape = row.present_outputs[0].shape
        assert shape is not None
        return shape, device, generator

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> Any:
        import torch

        shape, device, generator = args
        return self.api_call(0, 256, shape, dtype=torch.uint8, device=device, generator=generator)

    def run(self, shape: tuple[int, ...], device: "torch.device", generator: "torch.Generator") -> "torch.Tensor":
        import torch

        return torch.randint(0, 256, shape, dtype=torch.uint8, device=device, generator=generator)


class DropOutDoMaskReplay(OpReplay):
    kernel_types = ("DropOutDoMask",)
    npu_api = "torch_npu.npu_dropout_do_mask"

    def check(self, row: KernelRow) -> None:
        if len(row.inputs) != 3 or len(row.present_outputs) != 1:
            raise CaseBuildError("DropOutDoMask needs x, mask, keep_prob and one output")
        x, mask, keep = row.inputs
        assert x.shape is not None
        if x.dtype not in FLOATING or mask.dtype != "UINT8" or mask.shape != (math.ceil(math.prod(x.shape) / 8),):
            raise CaseBuildError(f"DropOutDoMask x {shape_text(x)} {x.dtype} with mask {shape_text(mask)} {mask.dtype}: "
                                 "expected a floating x and one UINT8 bit per element")

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        self.check(row)
        x = self.random(row.inputs[0], device, generator)
        return x, self.random(row.inputs[1], device, generator, low=0, high=256), KEEP

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> Any:
        x, mask, keep = args
        return self.api_call(x, mask, 1.0 - keep)

    def run(self, x: "torch.Tensor", mask: "torch.Tensor", keep: float) -> "torch.Tensor":
        kept = unpack_bits(mask, x.numel()).reshape(x.shape)
        return x * kept / keep


