"""SwiGluGrad: the NPU call and the CPU numerics of the real Level2 row (CANN 8.3 training).

The real row (``dy [4096,3072]``, ``x [4096,6144]``: 25M elements of x) is checked for shapes on
the meta device; its numerics through a reduced row of the same layout (256 tokens).
"""

from __future__ import annotations

import pytest
import torch

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.swiglu_grad import SwiGluGradReplay
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import kernel_row, level2_rows, meta_outputs, npu_call_of, op_mapping_api, replay_on_cpu, shapes

ROWS = level2_rows("SwiGluGrad")


def cells(inputs: str, outputs: str, in_types: str = "DT_BF16;DT_BF16", out_types: str = "DT_BF16") -> dict[str, str]:
    return {"Input Shapes": f'"{inputs}"', "Input Data Types": in_types, "Output Shapes": f'"{outputs}"', "Output Data Types": out_types}


REDUCED = cells("256,3072;256,6144", "256,6144")


def test_the_level2_profile_has_one_row() -> None:
    assert [r["Input Shapes"] for r in ROWS] == ['"4096,3072;4096,6144"']


def test_calls_npu_swiglu_backward_on_the_dimension_x_doubles() -> None:
    call = npu_call_of("SwiGluGrad", ROWS[0])
    assert op_mapping_api("SwiGluGrad") is None  # the op_mapping files name none
    assert call.api == "torch.ops.npu.npu_swiglu_backward"
    assert shapes(call.args) == ((4096, 3072), (4096, 6144))  # (grad_output, input)
    assert call.kwargs == {"dim": 1} and call.outputs is None


def test_the_real_row_builds_and_its_layout_matches_the_float64_reference() -> None:
    dx = meta_outputs("SwiGluGrad", ROWS[0])
    assert (dx.shape, dx.dtype) == ((4096, 6144), torch.bfloat16)
    replay_on_cpu("SwiGluGrad", REDUCED)
    replay_on_cpu("SwiGluGrad", cells("3,16,8;6,16,8", "6,16,8", "FLOAT;FLOAT", "FLOAT"))  # dim 0, float32


def test_matches_autograd_of_the_forward() -> None:
    x = torch.randn(5, 12, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(5, 6, dtype=torch.float64)
    a, b = x.chunk(2, -1)
    (torch.nn.functional.silu(a) * b).backward(dy)
    assert torch.allclose(SwiGluGradReplay().run(dy, x.detach(), 1), x.grad)
    assert torch.allclose(SwiGluGradReplay().reference(dy, x.detach(), 1), x.grad)


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (cells("256,3000;256,6144", "256,6144"), "halved"),
        (cells("256,3072;256,6144", "256,3072"), "output dx"),
        (cells("256,3072;256,6144", "256,6144", "FLOAT;DT_BF16"), "one floating dtype"),
        (cells("256,6144", "256,6144", "DT_BF16"), "dy;x"),
    ],
)
def test_rows_it_cannot_reproduce_are_refused(row: dict[str, str], reason: str) -> None:
    with pytest.raises(CaseBuildError, match=reason):
        SwiGluGradReplay().check(kernel_row("SwiGluGrad", row))


class _SwapsTheHalves(SwiGluGradReplay):
    def run(self, dy: torch.Tensor, x: torch.Tensor, dim: int) -> torch.Tensor:
        return super().run(dy, torch.cat(x.chunk(2, dim)[::-1], dim), dim)


def test_a_wrong_run_fails_verification() -> None:
    replay, row = _SwapsTheHalves(), kernel_row("SwiGluGrad", REDUCED)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(VerificationError, match="relative error"):
        verify_outputs(replay, row, replay.run(*args), replay.reference(*args))
