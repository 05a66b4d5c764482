"""RmsNorm and SwiGlu launch their fused kernels on an NPU: the calls built from the real rows."""

from __future__ import annotations

import pytest

from tests.kernels.support import level2_rows, npu_call_of, op_mapping_api, shapes


@pytest.mark.parametrize("cells", level2_rows("RmsNorm"), ids=lambda c: c["Input Shapes"])
def test_rms_norm_calls_npu_rms_norm_with_x_gamma_and_epsilon(cells: dict[str, str]) -> None:
    call = npu_call_of("RmsNorm", cells)
    assert call.api == op_mapping_api("RmsNorm") == "torch_npu.npu_rms_norm"
    x, gamma = shapes(call.args)
    assert (x, gamma) == tuple(tuple(int(d) for d in slot.split(",")) for slot in cells["Input Shapes"].strip('"').split(";"))
    assert call.kwargs == {"epsilon": 1e-6}
    assert call.outputs == ((0, 1) if cells["Output Shapes"].count(";") else (0,))


@pytest.mark.parametrize("cells", level2_rows("SwiGlu"), ids=lambda c: c["Input Shapes"])
def test_swiglu_calls_npu_swiglu_on_the_dimension_the_output_halves(cells: dict[str, str]) -> None:
    call = npu_call_of("SwiGlu", cells)
    assert call.api == op_mapping_api("SwiGlu") == "torch_npu.npu_swiglu"
    (x,) = shapes(call.args)
    out = tuple(int(d) for d in cells["Output Shapes"].strip('"').split(","))
    dim = call.kwargs["dim"]
    assert x[dim] == 2 * out[dim] and x[:dim] + x[dim + 1:] == out[:dim] + out[dim + 1:]
