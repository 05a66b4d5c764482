"""AddRmsNormBias: the NPU call (the op_mapping's vllm-ascend custom op) and the CPU numerics.

No public row of this kernel type exists.  The rows below are written in the layout Ascend's
replay script ``AddRmsNormBias_run.py`` parses: four input slots ``x1;x2;gamma;beta`` (an absent
beta as an empty slot, ``DT_UNDEFINED``/``NULL``), three outputs ``y;rstd;x``, dtypes spelled
``DT_BF16``/``FLOAT``, shape cells quoted.  Shapes are Qwen3-style hidden sizes (decode and prefill).
"""

from __future__ import annotations

import pytest
import torch

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.add_rms_norm import AddRmsNormBiasReplay
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import kernel_row, npu_call_of, op_mapping_api, replay_on_cpu, shapes


def cells(inputs: str, in_types: str, outputs: str, out_types: str = "DT_BF16;FLOAT;DT_BF16") -> dict[str, str]:
    def formats(types: str) -> str:
        return ";".join("NULL" if t == "DT_UNDEFINED" else "ND" for t in types.split(";"))

    return {
        "Input Shapes": f'"{inputs}"', "Input Data Types": in_types, "Input Formats": formats(in_types),
        "Output Shapes": f'"{outputs}"', "Output Data Types": out_types, "Output Formats": formats(out_types),
    }  # fmt: skip


NO_BETA = cells("64,4096;64,4096;4096;", "DT_BF16;DT_BF16;DT_BF16;DT_UNDEFINED", "64,4096;64,1;64,4096")
WITH_BETA = cells("1024,2048;1024,2048;2048;2048", "DT_BF16;DT_BF16;DT_BF16;DT_BF16", "1024,2048;1024,1;1024,2048")
THREE_D = cells("4,256,1024;4,256,1024;1024;", "DT_FLOAT16;DT_FLOAT16;DT_FLOAT16;DT_UNDEFINED",
                "4,256,1024;4,256,1;4,256,1024", "DT_FLOAT16;FLOAT;DT_FLOAT16")  # fmt: skip
ROWS = [NO_BETA, WITH_BETA, THREE_D]


@pytest.mark.parametrize("row", ROWS, ids=lambda c: c["Input Shapes"])
def test_calls_the_custom_op_with_x1_x2_gamma_beta_epsilon(row: dict[str, str]) -> None:
    call = npu_call_of("AddRmsNormBias", row)
    assert call.api == op_mapping_api("AddRmsNormBias") == "torch.ops._C_ascend.npu_add_rms_norm_bias"
    expected = tuple(tuple(int(d) for d in s.split(",")) if s else None for s in row["Input Shapes"].strip('"').split(";"))
    assert shapes(call.args) == expected + (1e-6,)  # an absent beta is passed as None
    assert call.kwargs == {} and call.outputs == (0, 1, 2)


@pytest.mark.parametrize("row", ROWS, ids=lambda c: c["Input Shapes"])
def test_rows_match_the_float64_reference(row: dict[str, str]) -> None:
    (y, rstd, x), _ = replay_on_cpu("AddRmsNormBias", row)
    assert rstd.dtype == torch.float32 and y.dtype == x.dtype


def test_beta_is_added_after_the_norm() -> None:
    replay = AddRmsNormBiasReplay()
    x1, x2, gamma = torch.ones(1, 4), torch.ones(1, 4), torch.full((4,), 2.0)
    y, rstd, x = replay.run(x1, x2, gamma, torch.full((4,), 0.5), [4], 0.0)
    assert y.tolist() == [[2.5] * 4] and rstd.tolist() == [[0.5]] and x.tolist() == [[2.0] * 4]


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (cells("1,64,4096;64,4096;4096;", "DT_BF16;DT_BF16;DT_BF16;DT_UNDEFINED", "1,64,4096;1,64,1;1,64,4096"), "mixed-rank"),
        (cells("64,4096;64,4096;2048;", "DT_BF16;DT_BF16;DT_BF16;DT_UNDEFINED", "64,4096;64,1;64,4096"), "trailing dims"),
        (cells("64,4096;64,4096;4096;64", "DT_BF16;DT_BF16;DT_BF16;DT_BF16", "64,4096;64,1;64,4096"), "beta"),
        (cells("64,4096;64,4096;4096;", "DT_BF16;DT_BF16;DT_BF16;DT_UNDEFINED", "64,4096;64,4096;64,4096", "DT_BF16;FLOAT;DT_BF16"), "rstd"),
        (cells("64,4096;64,4096;4096;", "DT_BF16;DT_BF16;DT_BF16;DT_UNDEFINED", "64,4096;64,1", "DT_BF16;FLOAT"), "y;rstd;x"),
        (cells("64,4096;64,4096;4096;", "DT_BF16;DT_FLOAT16;DT_BF16;DT_UNDEFINED", "64,4096;64,1;64,4096"), "one dtype"),
    ],
)  # fmt: skip
def test_rows_it_cannot_reproduce_are_refused(row: dict[str, str], reason: str) -> None:
    with pytest.raises(CaseBuildError, match=reason):
        AddRmsNormBiasReplay().check(kernel_row("AddRmsNormBias", row))


class _IgnoresBeta(AddRmsNormBiasReplay):
    def run(self, x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None,
            shape: list[int], eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        return super().run(x1, x2, gamma, None, shape, eps)


def test_a_wrong_run_fails_verification() -> None:
    replay, row = _IgnoresBeta(), kernel_row("AddRmsNormBias", WITH_BETA)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(VerificationError, match="output 0"):
        verify_outputs(replay, row, replay.run(*args), replay.reference(*args))
