"""RotaryPositionEmbedding, RotaryPositionEmbeddingGrad and InterleaveRope: NPU calls and CPU numerics.

RotaryPositionEmbedding and its Grad use the real Level2 rows (CANN 8.3 training profile).  The
16-head rows (8.4M elements) are checked for shapes on the meta device and numerically through a
reduced row of the same layout (256 tokens instead of 4096); the 8-head rows run whole.

No public InterleaveRope row exists: the rows below are written in the layout Ascend's replay
script ``InterleaveRope_run.py`` parses (three inputs ``x;cos;sin``, ``DT_BF16`` spelling), with
the shapes vllm-ascend's DeepSeek MLA calls it on (``q_pe [T,N,1,64]``, ``cos``/``sin [T,1,1,64]``).
The RotaryPositionEmbeddingGrad row with ``x`` (cos/sin requiring grad) is written in the Level2
rows' own layout, its empty slots filled.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.rope import (
    InterleaveRopeReplay,
    RotaryPositionEmbeddingGradReplay,
    RotaryPositionEmbeddingReplay,
)
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import (
    kernel_row,
    level2_rows,
    meta_outputs,
    npu_call_of,
    op_mapping_api,
    replay_on_cpu,
    shapes,
)


def cells(inputs: str, in_types: str, outputs: str, out_types: str) -> dict[str, str]:
    def formats(types: str) -> str:
        return ";".join("NULL" if t == "DT_UNDEFINED" else "ND" for t in types.split(";"))

    return {
        "Input Shapes": f'"{inputs}"', "Input Data Types": in_types, "Input Formats": formats(in_types),
        "Output Shapes": f'"{outputs}"', "Output Data Types": out_types, "Output Formats": formats(out_types),
    }  # fmt: skip


def dims(slot: str) -> tuple[int, ...]:
    return tuple(int(d) for d in slot.split(","))


def reduced(row: dict[str, str], tokens: int) -> dict[str, str]:
    """The same layout with the leading (token) dim cut to ``tokens``."""
    out = dict(row)
    for column in ("Input Shapes", "Output Shapes"):
        slots = out[column].strip('"').split(";")
        out[column] = '"' + ";".join(f"{tokens}," + s.split(",", 1)[1] if s else s for s in slots) + '"'
    return out


ROPE = level2_rows("RotaryPositionEmbedding")
ROPE_GRAD = level2_rows("RotaryPositionEmbeddingGrad")
BIG = 5_000_000  # elements of x above which a row is checked on the meta device


def _size(row: dict[str, str]) -> int:
    return int(torch.tensor(dims(row["Input Shapes"].strip('"').split(";")[0])).prod())


GRAD_WITH_X = cells(
    "256,1,8,128;256,1,1,128;256,1,1,128;256,1,8,128", "DT_BF16;DT_BF16;DT_BF16;DT_BF16",
    "256,1,8,128;256,1,1,128;256,1,1,128", "DT_BF16;DT_BF16;DT_BF16",
)  # fmt: skip
INTERLEAVE = [
    cells("4096,16,1,64;4096,1,1,64;4096,1,1,64", "DT_BF16;DT_BF16;DT_BF16", "4096,16,1,64", "DT_BF16"),
    cells("8,128,4,64;8,1,4,64;8,1,4,64", "DT_FLOAT16;DT_FLOAT16;DT_FLOAT16", "8,128,4,64", "DT_FLOAT16"),
]


def test_the_level2_profile_has_the_rows_these_tests_use() -> None:
    assert len(ROPE) == 2 and len(ROPE_GRAD) == 2
    assert {_size(r) > BIG for r in ROPE} == {True, False}


# ----------------------------------------------------------------------------- NPU calls
@pytest.mark.parametrize("row", ROPE, ids=lambda c: c["Input Shapes"])
def test_rope_calls_npu_rotary_mul_on_x_cos_sin(row: dict[str, str]) -> None:
    call = npu_call_of("RotaryPositionEmbedding", row)
    assert op_mapping_api("RotaryPositionEmbedding") is None  # the op_mapping files name none
    assert call.api == "torch_npu.npu_rotary_mul"
    assert shapes(call.args) == tuple(dims(s) for s in row["Input Shapes"].strip('"').split(";"))
    assert call.kwargs == {} and call.outputs is None  # default rotary_mode 'half'; y alone
    assert [a.dtype for a in call.args] == [torch.bfloat16] * 3


@pytest.mark.parametrize("row", ROPE_GRAD, ids=lambda c: c["Input Shapes"])
def test_rope_grad_without_x_calls_the_backward_with_cos_sin_not_requiring_grad(row: dict[str, str]) -> None:
    call = npu_call_of("RotaryPositionEmbeddingGrad", row)
    assert call.api == "torch.ops.npu.npu_rotary_mul_backward"
    dy, cos = dims(row["Input Shapes"].strip('"').split(";")[0]), dims(row["Input Shapes"].strip('"').split(";")[1])
    assert shapes(call.args) == (dy, dy, cos, cos)  # (grad, self, r1, r2)
    assert not any(a.requires_grad for a in call.args)  # so op-plugin hands the kernel no x
    assert call.outputs == (0,)


def test_rope_grad_with_x_marks_cos_sin_as_requiring_grad_and_selects_three_outputs() -> None:
    call = npu_call_of("RotaryPositionEmbeddingGrad", GRAD_WITH_X)
    dy, x, cos, sin = call.args
    assert (cos.requires_grad, sin.requires_grad, dy.requires_grad, x.requires_grad) == (True, True, False, False)
    assert call.outputs == (0, 1, 2)


@pytest.mark.parametrize("row", INTERLEAVE, ids=lambda c: c["Input Shapes"])
def test_interleave_rope_calls_the_api_op_mapping_names(row: dict[str, str]) -> None:
    call = npu_call_of("InterleaveRope", row)
    assert call.api == op_mapping_api("InterleaveRope") == "torch_npu.npu_interleave_rope"
    assert shapes(call.args) == tuple(dims(s) for s in row["Input Shapes"].strip('"').split(";"))
    assert call.kwargs == {} and call.outputs is None


# ----------------------------------------------------------------------------- CPU numerics
@pytest.mark.parametrize("kernel_type", ["RotaryPositionEmbedding", "RotaryPositionEmbeddingGrad"])
def test_real_rows_match_the_float64_reference(kernel_type: str) -> None:
    for row in level2_rows(kernel_type):
        if _size(row) > BIG:
            outputs = meta_outputs(kernel_type, row)  # shapes/dtypes of the whole row
            assert outputs.shape == dims(row["Output Shapes"].strip('"').split(";")[0])
            replay_on_cpu(kernel_type, reduced(row, 256))
        else:
            replay_on_cpu(kernel_type, row)


def test_rope_grad_with_x_gives_dcos_dsin_summed_over_the_heads() -> None:
    (dx, dcos, dsin), _ = replay_on_cpu("RotaryPositionEmbeddingGrad", GRAD_WITH_X)
    assert dx.shape == (256, 1, 8, 128) and dcos.shape == dsin.shape == (256, 1, 1, 128)
    assert not dx.requires_grad


@pytest.mark.parametrize("row", INTERLEAVE, ids=lambda c: c["Input Shapes"])
def test_interleave_rope_matches_the_float64_reference(row: dict[str, str]) -> None:
    replay_on_cpu("InterleaveRope", row)


def test_rope_inputs_are_cosines_and_sines_duplicated_over_the_halves() -> None:
    row = kernel_row("RotaryPositionEmbedding", ROPE[1])
    _, cos, sin = RotaryPositionEmbeddingReplay().make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(3))
    assert torch.allclose(cos.float().square() + sin.float().square(), torch.ones(()), atol=1e-2)
    assert torch.equal(cos[..., :64], cos[..., 64:]) and bool(cos.ne(0).all() and sin.ne(0).all())


def test_the_rotations_against_a_hand_computed_case() -> None:
    """D = 4, x = [1,2,3,4], angle 90 degrees: half mode rotates (x1,x3),(x2,x4); interleave
    first reorders x to [1,3,2,4]."""
    x = torch.tensor([1.0, 2.0, 3.0, 4.0]).reshape(1, 1, 1, 4)
    cos, sin = torch.zeros(1, 1, 1, 4), torch.ones(1, 1, 1, 4)
    assert RotaryPositionEmbeddingReplay().run(x, cos, sin).flatten().tolist() == [-3.0, -4.0, 1.0, 2.0]
    assert InterleaveRopeReplay().run(x, cos, sin).flatten().tolist() == [-2.0, -4.0, 1.0, 3.0]
    grad = RotaryPositionEmbeddingGradReplay().run(x, x, cos, sin, False)
    assert grad.flatten().tolist() == [3.0, 4.0, -1.0, -2.0]  # the transposed rotation


# ----------------------------------------------------------------------------- refused rows
@pytest.mark.parametrize(
    ("kernel_type", "row", "reason"),
    [
        ("RotaryPositionEmbedding", cells("8,1,4,64;8,1,1,32;8,1,1,32", "DT_BF16;DT_BF16;DT_BF16", "8,1,4,64", "DT_BF16"), "even last dim"),
        ("RotaryPositionEmbedding", cells("8,1,4,64;8,2,1,64;8,2,1,64", "DT_BF16;DT_BF16;DT_BF16", "8,1,4,64", "DT_BF16"), "does not broadcast"),
        ("RotaryPositionEmbedding", cells("8,4,64;8,1,64;8,1,64", "DT_BF16;DT_BF16;DT_BF16", "8,4,64", "DT_BF16"), "4-D"),
        ("RotaryPositionEmbedding", cells("8,1,4,64;8,1,1,64;8,1,1,64", "DT_BF16;FLOAT;FLOAT", "8,1,4,64", "DT_BF16"), "Cast"),
        ("RotaryPositionEmbedding", cells("8,1,4,64;8,1,1,64", "DT_BF16;DT_BF16", "8,1,4,64", "DT_BF16"), "x;cos;sin"),
        ("RotaryPositionEmbeddingGrad", cells("8,1,4,64;8,1,1,64;8,1,1,64;", "DT_BF16;DT_BF16;DT_BF16;DT_UNDEFINED", "8,1,4,64;8,1,1,64;8,1,1,64", "DT_BF16;DT_BF16;DT_BF16"), "need input x"),
        ("RotaryPositionEmbeddingGrad", cells("8,1,4,64;8,1,1,64;8,1,1,64;8,1,4,64", "DT_BF16;DT_BF16;DT_BF16;DT_BF16", "8,1,4,64;;", "DT_BF16;DT_BF16;DT_BF16"), "dx;dcos;dsin"),
        ("InterleaveRope", cells("8,16,1,64;8,16,1,64;8,16,1,64", "DT_BF16;DT_BF16;DT_BF16", "8,16,1,64", "DT_BF16"), "must have N"),
        ("InterleaveRope", cells("8,16,1,64;8,1,1,64;8,1,1,64", "DT_BF16;DT_BF16;DT_BF16", "8,16,1,32", "DT_BF16"), "output y"),
    ],
)  # fmt: skip
def test_rows_it_cannot_reproduce_are_refused_with_the_reason(kernel_type: str, row: dict[str, str], reason: str) -> None:
    replay = {"RotaryPositionEmbedding": RotaryPositionEmbeddingReplay, "RotaryPositionEmbeddingGrad":
              RotaryPositionEmbeddingGradReplay, "InterleaveRope": InterleaveRopeReplay}[kernel_type]()
    with pytest.raises(CaseBuildError, match=reason):
        replay.check(kernel_row(kernel_type, row))


# ----------------------------------------------------------------------------- verification bites
class _InterleavedInsteadOfHalf(RotaryPositionEmbeddingReplay):
    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rotated = torch.stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)
        return x * cos + rotated * sin


class _ForwardRotationInTheGradient(RotaryPositionEmbeddingGradReplay):
    def run(self, dy: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, with_x: bool) -> Any:
        return RotaryPositionEmbeddingReplay().run(dy, cos, sin)  # R instead of R^T


class _NoDeinterleave(InterleaveRopeReplay):
    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return RotaryPositionEmbeddingReplay().run(x, cos, sin)


@pytest.mark.parametrize(
    ("wrong", "kernel_type", "row"),
    [
        (_InterleavedInsteadOfHalf, "RotaryPositionEmbedding", ROPE[1]),
        (_ForwardRotationInTheGradient, "RotaryPositionEmbeddingGrad", reduced(ROPE_GRAD[0], 256)),
        (_NoDeinterleave, "InterleaveRope", INTERLEAVE[1]),
    ],
)
def test_a_wrong_run_fails_verification(wrong: type, kernel_type: str, row: dict[str, str]) -> None:
    replay = wrong()
    case = kernel_row(kernel_type, row)
    args = replay.make_inputs(case, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(VerificationError, match="relative error"):
        verify_outputs(replay, case, replay.run(*args), replay.reference(*args))
