"""QuantBatchMatmulV3 (W8A8): the NPU call, the portable int8 GEMM + dequantisation, refusals.

No public row exists (no fixture has one; Ascend/msmodeling's database CSVs are Git LFS pointers).
The rows below are written in the layout msmodeling's ``QuantBatchMatmulV3_run.py`` parses:
``x1;x2;scale[;extra]`` with only the present inputs, ``DT_``-spelled dtypes, a FRACTAL_NZ weight
recorded by its 4-D storage shape (the script expands ``(a,b,c,d)`` to ``(b*c, a*d)``), and the
extra's role told by dtype and size (INT32 bias, FLOAT ``[M]`` pertoken scale, FLOAT ``[1]``/``[N]``
offset).  Shapes are DeepSeek-V3 W8A8 linears (hidden 7168, 128 tokens).  Two more rows use the
kernel's own six-slot order ``x1;x2;scale;offset;bias;pertoken_scale`` with empty slots, as a
profiler writes optional inputs; a 4096-token row is checked on the meta device only.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from perf_plugin.replay.api_call import NpuFormat
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.quant_matmul import QuantBatchMatmulV3Replay
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import kernel_row, meta_outputs, npu_call_of, op_mapping_api, replay_of, replay_on_cpu, shapes

TYPE = "QuantBatchMatmulV3"


def _cells(inputs: str, dtypes: str, output: str, out_dtype: str, formats: str = "") -> dict[str, str]:
    formats = formats or ";".join(["ND"] * len(dtypes.split(";")))
    return {
        "Input Shapes": f'"{inputs}"', "Input Data Types": dtypes, "Input Formats": formats,
        "Output Shapes": f'"{output}"', "Output Data Types": out_dtype, "Output Formats": "ND",
    }  # fmt: skip


# w8a8 dynamic: per-token scale, NZ weight [N/32, K/16, 16, 32] of K x N = 7168 x 2048, bf16 out
NZ_PERTOKEN = _cells(
    "128,7168;64,448,16,32;2048;128", "DT_INT8;DT_INT8;DT_FLOAT;DT_FLOAT", "128,2048", "DT_BF16",
    "ND;FRACTAL_NZ;ND;ND",
)  # fmt: skip
# w8a8 static, fp16 out: packed INT64 scale, INT32 bias, weight stored [N,K]
PACKED_BIAS = _cells("128,1536;4096,1536;4096;4096", "DT_INT8;DT_INT8;DT_INT64;DT_INT32", "128,4096", "DT_FLOAT16")
# int8 out with a per-channel offset: the kernel's UINT64 view of the packed scale
INT8_OFFSET = _cells("96,1024;1024,512;512;512", "DT_INT8;DT_INT8;DT_UINT64;DT_FLOAT", "96,512", "DT_INT8")
# the kernel's six slots: per-tensor packed scale and INT32 bias, int8 out
SIX_SLOTS_INT8 = _cells(
    "96,1024;512,1024;1;;512;", "DT_INT8;DT_INT8;DT_UINT64;DT_FLOAT;DT_INT32;DT_FLOAT", "96,512", "DT_INT8"
)
# the kernel's six slots: BF16 scale and bias with a per-token scale
SIX_SLOTS_BF16 = _cells(
    "64,512;512,256;256;;256;64", "DT_INT8;DT_INT8;DT_BF16;DT_FLOAT;DT_BF16;DT_FLOAT", "64,256", "DT_BF16"
)
ROWS = {
    "nz-pertoken": NZ_PERTOKEN, "packed-bias": PACKED_BIAS, "int8-offset": INT8_OFFSET,
    "six-slots-int8": SIX_SLOTS_INT8, "six-slots-bf16": SIX_SLOTS_BF16,
}  # fmt: skip


def test_npu_api_is_op_mappings_but_the_call_is_npu_quant_matmul() -> None:
    # op_mapping's string is A16W8 (float x, WeightQuantBatchMatmulV2); int8 x reaches
    # QuantBatchMatmulV3 only through npu_quant_matmul (see the module docstring)
    assert replay_of(TYPE).npu_api == op_mapping_api(TYPE) == "torch_npu.npu_weight_quant_batchmatmul"
    for cells in ROWS.values():
        assert npu_call_of(TYPE, cells).api == "torch_npu.npu_quant_matmul"


def test_nz_row_hands_the_logical_weight_in_fractal_nz_with_the_pertoken_scale() -> None:
    call = npu_call_of(TYPE, NZ_PERTOKEN)
    x1, weight, scale = call.args
    assert isinstance(weight, NpuFormat) and weight.format == "FRACTAL_NZ"
    assert shapes(call.args) == ((128, 7168), ((7168, 2048), "FRACTAL_NZ"), (2048,))
    assert x1.dtype == weight.tensor.dtype == torch.int8 and scale.dtype == torch.float32
    assert shapes(dict(call.kwargs)) == {"output_dtype": torch.bfloat16, "pertoken_scale": (128,)}


def test_transposed_weight_is_a_view_of_its_n_k_storage_with_the_packed_scale_and_bias() -> None:
    call = npu_call_of(TYPE, PACKED_BIAS)
    x1, weight, scale = call.args
    assert tuple(weight.shape) == (1536, 4096) and weight.t().is_contiguous()  # stored [N,K]
    assert scale.dtype == torch.int64 and tuple(scale.shape) == (4096,)
    assert call.kwargs["output_dtype"] == torch.float16 and call.kwargs["bias"].dtype == torch.int32
    assert set(call.kwargs) == {"output_dtype", "bias"}


def test_packed_scale_has_npu_trans_quant_params_layout() -> None:
    replay = replay_of(TYPE)
    row = kernel_row(TYPE, INT8_OFFSET)
    x1, x2, packed, offset, bias, pertoken, dequant, plan = replay.make_inputs(
        row, torch.device("cpu"), torch.Generator().manual_seed(0)
    )
    bits = dequant.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    assert torch.equal(packed & 0xFFFFFFFF, bits) and bool((bits & 0x1FFF == 0).all())  # 19 upper bits kept
    assert bool(((packed >> 46) & 1 == 1).all())
    assert torch.equal(((packed >> 37) & 0x1FF).to(torch.int64), offset.to(torch.int64) & 0x1FF)
    call = replay.npu_call(row, (x1, x2, packed, offset, bias, pertoken, dequant, plan))
    assert call is not None
    assert set(call.kwargs) == {"output_dtype", "offset"} and call.kwargs["output_dtype"] == torch.int8


@pytest.mark.parametrize("cells", list(ROWS.values()), ids=list(ROWS))
def test_rows_replay_on_the_cpu(cells: dict[str, str]) -> None:
    outputs, _ = replay_on_cpu(TYPE, cells)
    assert tuple(outputs.shape) == tuple(int(d) for d in cells["Output Shapes"].strip('"').split(","))
    if outputs.dtype == torch.int8:  # values spread over int8, a little saturation
        assert 0.0 < float((outputs.abs() >= 127).float().mean()) < 0.1


def test_a_large_row_has_the_recorded_output_on_the_meta_device() -> None:
    cells = _cells(
        "4096,7168;576,448,16,32;18432;4096", "DT_INT8;DT_INT8;DT_FLOAT;DT_FLOAT", "4096,18432", "DT_BF16",
        "ND;FRACTAL_NZ;ND;ND",
    )  # fmt: skip
    out = meta_outputs(TYPE, cells)
    assert (tuple(out.shape), out.dtype) == ((4096, 18432), torch.bfloat16)


def test_int8_output_is_the_dequantised_accumulator_rounded_half_to_even() -> None:
    replay = QuantBatchMatmulV3Replay()
    row = kernel_row(TYPE, _cells("24,16;16,8;1", "DT_INT8;DT_INT8;DT_INT64", "24,8", "DT_INT8"))
    *_, plan = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    x1 = torch.arange(24, dtype=torch.int8).unsqueeze(1).expand(24, 16).contiguous()  # rows of i
    x2 = torch.zeros(16, 8, dtype=torch.int8)
    x2[0, :] = 1  # accumulator = i
    dequant = torch.tensor([0.5])
    y = replay.run(x1, x2, dequant, None, None, None, dequant, plan)[:, 0]
    assert y[:8].tolist() == [0, 0, 1, 2, 2, 2, 3, 4]  # 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, 3.5 -> 4
    assert int(y.max()) == 12
    y = replay.run(x1 * 5, x2, dequant, None, None, None, torch.tensor([1.5]), plan)[:, 0]
    assert y[-1].item() == 127  # 23 * 5 * 1.5 saturates


@pytest.mark.parametrize(
    ("cells", "reason"),
    [
        (_cells("128,7168;7168,2048;2048", "DT_FLOAT8_E4M3FN;DT_FLOAT8_E4M3FN;DT_FLOAT", "128,2048", "DT_BF16"), "INT8 x INT8"),
        (_cells("128,7168;7168,256;256", "DT_INT32;DT_INT32;DT_INT64", "128,2048", "DT_FLOAT16"), "INT8 x INT8"),
        (_cells("128,7168;7168,2048;2048", "DT_INT8;DT_INT8;DT_FLOAT", "128,2048", "DT_FLOAT16"), "packed scale"),
        (_cells("128,7168;7168,2048;2048", "DT_INT8;DT_INT8;DT_INT64", "128,2048", "DT_BF16"), "not a packed one"),
        (_cells("128,7168;7168,2048;2048", "DT_INT8;DT_INT8;DT_FLOAT", "128,2048", "DT_INT32"), "INT8 are replayed"),
        (_cells("128,7168;7168,2048;2048;;2048;", "DT_INT8;DT_INT8;DT_FLOAT;DT_FLOAT;DT_BF16;DT_FLOAT", "128,2048", "DT_INT8"), "packed scale"),
        (_cells("128,7168;7168,2048;2048;2048;;", "DT_INT8;DT_INT8;DT_FLOAT;DT_FLOAT;DT_INT32;DT_FLOAT", "128,2048", "DT_BF16"), "offset"),
        (_cells("128,7168;7168,2048;2048;77", "DT_INT8;DT_INT8;DT_FLOAT;DT_FLOAT", "128,2048", "DT_BF16"), "cannot be told apart"),
        (_cells("128,7168;7000,2048;2048", "DT_INT8;DT_INT8;DT_FLOAT", "128,2048", "DT_BF16"), "neither"),
        (_cells("128,7168;64,400,16,32;2048", "DT_INT8;DT_INT8;DT_FLOAT", "128,2048", "DT_BF16", "ND;FRACTAL_NZ;ND"), "storage shape"),
        (_cells("128,7168;7168,2048;512", "DT_INT8;DT_INT8;DT_FLOAT", "128,2048", "DT_BF16"), "scale is FLOAT"),
        (_cells("2,64,7168;7168,2048;2048;64", "DT_INT8;DT_INT8;DT_FLOAT;DT_FLOAT", "2,64,2048", "DT_BF16"), "2-D x1"),
    ],
)  # fmt: skip
def test_rows_it_cannot_build_are_refused_with_the_reason(cells: dict[str, str], reason: str) -> None:
    with pytest.raises(CaseBuildError, match=reason):
        replay_of(TYPE).check(kernel_row(TYPE, cells))


class _ForgetsThePertokenScale(QuantBatchMatmulV3Replay):
    def run(self, *args: Any) -> torch.Tensor:
        x1, x2, api_scale, offset, bias, _, dequant, plan = args
        return super().run(x1, x2, api_scale, offset, bias, None, dequant, plan)


class _TruncatesInsteadOfRounding(QuantBatchMatmulV3Replay):
    def run(self, *args: Any) -> torch.Tensor:
        x1, x2, _, offset, bias, _, dequant, plan = args
        acc = torch._int_mm(x1, x2).add_(bias)
        return torch.mul(acc, dequant).trunc_().clamp_(-128, 127).to(torch.int8)


@pytest.mark.parametrize(
    ("wrong", "cells", "message"),
    [
        (_ForgetsThePertokenScale(), SIX_SLOTS_BF16, "relative error"),
        (_TruncatesInsteadOfRounding(), SIX_SLOTS_INT8, "elements differ"),
    ],
    ids=["pertoken", "rounding"],
)
def test_verification_catches_a_wrong_run(wrong: QuantBatchMatmulV3Replay, cells: dict[str, str], message: str) -> None:
    row = kernel_row(TYPE, cells)
    args = wrong.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(VerificationError, match=message):
        verify_outputs(wrong, row, wrong.run(*args), wrong.reference(*args))
