"""RmsNormGrad: the NPU call and the CPU numerics on the real Level2 rows (CANN 8.3 training).

The two 4M-element rows run whole on the CPU; the 8.4M-element one (16 heads of 128) is checked
for shapes on the meta device and numerically through a reduced row of its layout (512 tokens).
"""

from __future__ import annotations

import pytest
import torch

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.norm_grad import RmsNormGradReplay
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import kernel_row, level2_rows, meta_outputs, npu_call_of, op_mapping_api, replay_on_cpu, shapes

ROWS = level2_rows("RmsNormGrad")
BIG = 5_000_000


def slots(cell: str) -> list[tuple[int, ...]]:
    return [tuple(int(d) for d in s.split(",")) for s in cell.strip('"').split(";")]


def size(row: dict[str, str]) -> int:
    return int(torch.tensor(slots(row["Input Shapes"])[0]).prod())


def reduced(row: dict[str, str], tokens: int) -> dict[str, str]:
    out = dict(row)
    for column in ("Input Shapes", "Output Shapes"):
        parts = out[column].strip('"').split(";")
        # every slot but the trailing gamma/dgamma leads with the token dim
        out[column] = '"' + ";".join(f"{tokens}," + p.split(",", 1)[1] if p.count(",") else p for p in parts) + '"'
    return out


def test_the_level2_profile_has_three_rows_one_of_them_large() -> None:
    assert len(ROWS) == 3 and sum(size(r) > BIG for r in ROWS) == 1


@pytest.mark.parametrize("row", ROWS, ids=lambda c: c["Input Shapes"])
def test_calls_npu_rms_norm_backward_with_gamma_before_rstd(row: dict[str, str]) -> None:
    call = npu_call_of("RmsNormGrad", row)
    assert op_mapping_api("RmsNormGrad") is None  # the op_mapping files name none
    assert call.api == "torch.ops.npu.npu_rms_norm_backward"
    dy, x, rstd, gamma = slots(row["Input Shapes"])
    assert shapes(call.args) == (dy, x, gamma, rstd)  # npu_rms_norm_backward(dy, self, gamma, rstd)
    assert [a.dtype for a in call.args] == [torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.float32]
    assert call.kwargs == {} and call.outputs == (0, 1)


def test_real_rows_match_the_float64_reference() -> None:
    for row in ROWS:
        if size(row) > BIG:
            dx, dgamma = meta_outputs("RmsNormGrad", row)
            assert (dx.shape, dx.dtype, dgamma.dtype) == (slots(row["Input Shapes"])[1], torch.bfloat16, torch.float32)
            replay_on_cpu("RmsNormGrad", reduced(row, 512))
        else:
            replay_on_cpu("RmsNormGrad", row)


def test_rstd_is_the_forward_rstd_of_x() -> None:
    row = kernel_row("RmsNormGrad", ROWS[1])
    _, x, rstd, _, g = RmsNormGradReplay().make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(1))
    assert g == 1 and rstd.dtype == torch.float32
    expected = torch.ops.aten._fused_rms_norm(x.float(), [128], None, 1e-6)[1]
    assert torch.allclose(rstd, expected.reshape(rstd.shape), rtol=1e-6)


def test_matches_autograd_of_the_forward() -> None:
    """The closed form against torch's autograd of ``x * rstd(x) * gamma`` (float64, rstd of x)."""
    x = torch.randn(6, 2, 16, dtype=torch.float64, requires_grad=True)
    gamma = torch.randn(2, 16, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(6, 2, 16, dtype=torch.float64)
    rstd = x.square().mean((1, 2), keepdim=True).add(1e-6).rsqrt()
    (x * rstd * gamma).backward(dy)
    dx, dgamma = RmsNormGradReplay().reference(dy, x, rstd.detach(), gamma, 2)
    assert torch.allclose(dx, x.grad) and torch.allclose(dgamma, gamma.grad)


@pytest.mark.parametrize(
    ("inputs", "in_types", "outputs", "out_types", "reason"),
    [
        ("8,64;8,64;8,1;32", "DT_BF16;DT_BF16;FLOAT;DT_BF16", "8,64;32", "DT_BF16;FLOAT", "trailing dims"),
        ("8,64;8,64;8,2;64", "DT_BF16;DT_BF16;FLOAT;DT_BF16", "8,64;64", "DT_BF16;FLOAT", "rstd"),
        ("8,64;8,64;8,1;64", "DT_BF16;DT_BF16;DT_BF16;DT_BF16", "8,64;64", "DT_BF16;FLOAT", "FLOAT"),
        ("8,64;8,64;8,1;64", "DT_BF16;DT_BF16;FLOAT;DT_BF16", "8,64;64", "DT_BF16;DT_BF16", "dgamma"),
        ("8,32;8,64;8,1;64", "DT_BF16;DT_BF16;FLOAT;DT_BF16", "8,64;64", "DT_BF16;FLOAT", "dy"),
        ("8,64;8,64;64", "DT_BF16;DT_BF16;DT_BF16", "8,64;64", "DT_BF16;FLOAT", "dy;x;rstd;gamma"),
    ],
)
def test_rows_it_cannot_reproduce_are_refused(inputs: str, in_types: str, outputs: str, out_types: str, reason: str) -> None:
    cells = {"Input Shapes": f'"{inputs}"', "Input Data Types": in_types, "Output Shapes": f'"{outputs}"', "Output Data Types": out_types}
    with pytest.raises(CaseBuildError, match=reason):
        RmsNormGradReplay().check(kernel_row("RmsNormGrad", cells))


class _ForgetsGamma(RmsNormGradReplay):
    def run(self, dy: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, gamma: torch.Tensor, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        return super().run(dy, x, rstd, torch.ones_like(gamma), g)


def test_a_wrong_run_fails_verification() -> None:
    replay, row = _ForgetsGamma(), kernel_row("RmsNormGrad", ROWS[1])
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(VerificationError, match="output 0"):
        verify_outputs(replay, row, replay.run(*args), replay.reference(*args))
