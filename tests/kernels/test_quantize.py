"""AscendQuantV2 and DynamicQuant: NPU calls, portable replays, refusals, and a verification that bites.

No public row of either kernel type exists (the fixtures have none; Ascend/msmodeling's database
CSVs are Git LFS pointers).  The rows below are written in the layout msmodeling's replay scripts
parse: ``AscendQuantV2_run.py`` reads ``x;scale[;offset]`` with ``DT_``-spelled dtypes and one
output dtype (DT_INT8 -> ``torch.qint8``); ``DynamicQuant_run.py`` takes exactly one input ``x``
and returns ``(y, scale)``.  Shapes are DeepSeek-V3's hidden size (7168) over 128 tokens, the
W8A8 activations vllm-ascend quantises; a smooth-scale row and an axis -2 row use the
signatures aclnnDynamicQuant and aclnnAscendQuantV3 document.  A 16384-token row is checked on
the meta device only.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.quantize import AscendQuantV2Replay, DynamicQuantReplay
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import kernel_row, meta_outputs, npu_call_of, op_mapping_api, replay_of, replay_on_cpu, shapes

QUANT, DYNAMIC = "AscendQuantV2", "DynamicQuant"


def _cells(inputs: str, dtypes: str, outputs: str, out_dtypes: str) -> dict[str, str]:
    count_in, count_out = len(dtypes.split(";")), len(out_dtypes.split(";"))
    return {
        "Input Shapes": f'"{inputs}"', "Input Data Types": dtypes, "Input Formats": ";".join(["ND"] * count_in),
        "Output Shapes": f'"{outputs}"', "Output Data Types": out_dtypes, "Output Formats": ";".join(["ND"] * count_out),
    }  # fmt: skip


PER_CHANNEL = _cells("128,7168;7168;7168", "DT_BF16;DT_BF16;DT_BF16", "128,7168", "DT_INT8")
PER_TENSOR = _cells("4,64,512;1", "DT_FLOAT16;DT_FLOAT16", "4,64,512", "DT_INT8")
AXIS_MINUS_2 = _cells("64,512;64;64", "DT_FLOAT;DT_FLOAT;DT_FLOAT", "64,512", "DT_INT8")
DYNAMIC_ROW = _cells("128,7168", "DT_BF16", "128,7168;128", "DT_INT8;DT_FLOAT")
SMOOTH = _cells("2,64,512;512", "DT_FLOAT16;DT_FLOAT16", "2,64,512;2,64", "DT_INT8;DT_FLOAT")
QUANT_ROWS = {"per-channel": PER_CHANNEL, "per-tensor": PER_TENSOR, "axis-2": AXIS_MINUS_2}
DYNAMIC_ROWS = {"plain": DYNAMIC_ROW, "smooth": SMOOTH}


def test_the_apis_are_the_ones_op_mapping_names() -> None:
    assert replay_of(QUANT).npu_api == op_mapping_api(QUANT) == "torch_npu.npu_quantize"
    assert replay_of(DYNAMIC).npu_api == op_mapping_api(DYNAMIC) == "torch_npu.npu_dynamic_quant"


@pytest.mark.parametrize(
    ("cells", "expected"),
    [
        (PER_CHANNEL, ((128, 7168), (7168,), (7168,), -1)),
        (PER_TENSOR, ((4, 64, 512), (1,), None, -1)),
        (AXIS_MINUS_2, ((64, 512), (64,), (64,), -2)),
    ],
    ids=list(QUANT_ROWS),
)
def test_ascend_quant_calls_npu_quantize_in_multiply_mode(cells: dict[str, str], expected: Any) -> None:
    call = npu_call_of(QUANT, cells)
    x, scale, offset, axis = expected
    # (input, scales, zero_points, dtype, axis, div_mode): div_mode=False is aclnnAscendQuantV3
    assert shapes(call.args) == (x, scale, offset, torch.qint8, axis, False)
    assert not call.kwargs and call.outputs is None


@pytest.mark.parametrize(("cells", "smooth"), [(DYNAMIC_ROW, None), (SMOOTH, (512,))], ids=list(DYNAMIC_ROWS))
def test_dynamic_quant_calls_npu_dynamic_quant_and_takes_both_outputs(cells: dict[str, str], smooth: Any) -> None:
    call = npu_call_of(DYNAMIC, cells)
    assert shapes(call.args) == (tuple(int(d) for d in cells["Input Shapes"].strip('"').split(";")[0].split(",")),)
    assert shapes(dict(call.kwargs)) == ({"smooth_scales": smooth} if smooth else {})
    assert call.outputs == (0, 1)


@pytest.mark.parametrize("cells", list(QUANT_ROWS.values()), ids=list(QUANT_ROWS))
def test_ascend_quant_rows_replay_exactly_on_the_cpu(cells: dict[str, str]) -> None:
    for seed in range(6):  # any draw, even a single per-tensor scale, exercises both
        y, _ = replay_on_cpu(QUANT, cells, seed)
        assert y.dtype == torch.int8
        saturated = float((y == 127).float().mean() + (y == -128).float().mean())
        assert 0.0 < saturated < 0.4, seed  # both the rounding and the clamp are exercised


@pytest.mark.parametrize("cells", list(DYNAMIC_ROWS.values()), ids=list(DYNAMIC_ROWS))
def test_dynamic_quant_rows_replay_on_the_cpu(cells: dict[str, str]) -> None:
    (y, scale), _ = replay_on_cpu(DYNAMIC, cells)
    # every row reaches +-127 at its largest element, and scale * 127 is that element
    assert torch.equal(y.abs().amax(dim=-1), torch.full_like(scale, 127, dtype=torch.int8))


def test_large_rows_have_the_recorded_outputs_on_the_meta_device() -> None:
    y = meta_outputs(QUANT, _cells("16384,7168;7168;7168", "DT_BF16;DT_BF16;DT_BF16", "16384,7168", "DT_INT8"))
    y_dyn, scale = meta_outputs(DYNAMIC, _cells("16384,7168", "DT_BF16", "16384,7168;16384", "DT_INT8;DT_FLOAT"))
    assert (y.shape, y_dyn.shape, scale.shape) == ((16384, 7168), (16384, 7168), (16384,))
    assert (y.dtype, y_dyn.dtype, scale.dtype) == (torch.int8, torch.int8, torch.float32)


def test_ascend_quant_rounds_half_to_even_and_saturates() -> None:
    # the kernel casts with CAST_RINT, then to int8 with saturation
    x = torch.tensor([[0.5, 1.5, 2.5, -2.5, 100.0, -100.0]], dtype=torch.bfloat16)
    scale = torch.tensor([1.0, 1.0, 1.0, 1.0, 2.0, 2.0], dtype=torch.bfloat16)
    y = AscendQuantV2Replay().run(x, scale, None, -1, (6,))
    assert y.tolist() == [[0, 2, 2, -2, 127, -128]]


def test_dynamic_quant_scales_each_row_by_its_own_maximum() -> None:
    x = torch.tensor([[1.0, -2.0, 0.5], [4.0, 1.0, -8.0]], dtype=torch.float16)
    y, scale = DynamicQuantReplay().run(x, None)
    assert y.tolist() == [[64, -127, 32], [64, 16, -127]]
    assert scale.tolist() == pytest.approx([2.0 / 127, 8.0 / 127])


@pytest.mark.parametrize(
    ("kernel_type", "cells", "reason"),
    [
        (QUANT, _cells("128,7168;7168", "DT_BF16;DT_BF16", "128,7168", "DT_UINT8"), "expected INT8"),
        (QUANT, _cells("128,7168;7168", "DT_BF16;DT_BF16", "128,896", "DT_INT32"), "expected INT8"),
        (QUANT, _cells("128,7168;512", "DT_BF16;DT_BF16", "128,7168", "DT_INT8"), "matches neither"),
        (QUANT, _cells("128,7168;7168;1", "DT_BF16;DT_BF16;DT_BF16", "128,7168", "DT_INT8"), "offset"),
        (QUANT, _cells("128,7168;7168", "DT_INT8;DT_BF16", "128,7168", "DT_INT8"), "x is INT8"),
        (DYNAMIC, _cells("128,7168;8,7168;8", "DT_BF16;DT_BF16;INT32", "128,7168;128", "DT_INT8;DT_FLOAT"), "group_index"),
        (DYNAMIC, _cells("128,7168", "DT_BF16", "128,7168;128;128", "DT_INT8;DT_FLOAT;DT_FLOAT"), "asymmetric"),
        (DYNAMIC, _cells("128,7168", "DT_FLOAT", "128,7168;128", "DT_INT8;DT_FLOAT"), "FLOAT16/BF16"),
        (DYNAMIC, _cells("128,7168;512", "DT_BF16;DT_BF16", "128,7168;128", "DT_INT8;DT_FLOAT"), "smooth_scales"),
    ],
)
def test_rows_it_cannot_build_are_refused_with_the_reason(kernel_type: str, cells: dict[str, str], reason: str) -> None:
    with pytest.raises(CaseBuildError, match=reason):
        replay_of(kernel_type).check(kernel_row(kernel_type, cells))


class _RoundsHalfAwayFromZero(AscendQuantV2Replay):
    def run(self, x: torch.Tensor, scale: torch.Tensor, offset: Any, axis: int, broadcast: Any) -> torch.Tensor:
        value = torch.mul(x, scale.float().reshape(broadcast))
        return (value.sign() * (value.abs() + 0.5).floor()).clamp_(-128, 127).to(torch.int8)


class _ScalesByTheWrongMaximum(DynamicQuantReplay):
    def run(self, x: torch.Tensor, smooth: Any) -> tuple[torch.Tensor, torch.Tensor]:
        y, scale = super().run(x, smooth)
        return y, scale * (127.0 / 128.0)  # amax / 128: the int8 minimum's magnitude


def _verify(wrong: Any, kernel_type: str, cells: dict[str, str]) -> None:
    row = kernel_row(kernel_type, cells)
    args = wrong.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    verify_outputs(wrong, row, wrong.run(*args), wrong.reference(*args))


def test_verification_catches_a_single_rounding_difference() -> None:
    # bf16 x times a bf16 scale is exact in float32, so exact .5 ties occur in a 128x7168 row
    no_offset = _cells("128,7168;7168", "DT_BF16;DT_BF16", "128,7168", "DT_INT8")
    with pytest.raises(VerificationError, match="elements differ from the reference"):
        _verify(_RoundsHalfAwayFromZero(), QUANT, no_offset)


def test_verification_catches_a_wrong_dynamic_scale() -> None:
    with pytest.raises(VerificationError, match="output 1 .* relative error"):
        _verify(_ScalesByTheWrongMaximum(), DYNAMIC, DYNAMIC_ROW)
