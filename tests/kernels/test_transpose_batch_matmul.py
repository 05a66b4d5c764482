"""TransposeBatchMatMul: the real rows (``db_row_TransposeBatchMatMul.csv``), their NPU call and
their portable replay.

The real rows record ``x1`` as ``[M,B,K]`` (``4,16,128;16,128,512 -> 4,16,512``); the layout
``[B,M,K]`` that Ascend/msmodeling's ``TransposeBatchMatMul_run.py`` parses is a written row in
that script's layout (it checks ``x1[0] == x2[0]`` and an ``(M,B,N)`` output).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.transpose_batch_matmul import TransposeBatchMatMulReplay
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import (
    aten_ops_of_run,
    fixture_rows,
    kernel_row,
    npu_call_of,
    op_mapping_api,
    replay_of,
    replay_on_cpu,
    shapes,
)

TYPE = "TransposeBatchMatMul"
REAL_ROWS = fixture_rows("db_row_TransposeBatchMatMul.csv")


def _cells(inputs: str, dtypes: str, output: str, out_dtype: str, formats: str = "ND;ND") -> dict[str, str]:
    return {
        "Input Shapes": f'"{inputs}"', "Input Data Types": dtypes, "Input Formats": formats,
        "Output Shapes": f'"{output}"', "Output Data Types": out_dtype, "Output Formats": "ND",
    }  # fmt: skip


# x1 [B,M,K] = [16,64,512], as msmodeling's replay script expects it
BATCH_FIRST = _cells("16,64,512;16,512,128", "DT_FLOAT16;DT_FLOAT16", "64,16,128", "DT_FLOAT16")


def _shape(cell: str, slot: int) -> tuple[int, ...]:
    return tuple(int(d) for d in cell.strip('"').split(";")[slot].split(","))


def test_the_real_rows_are_the_m_b_k_layout() -> None:
    assert [c["Input Shapes"] for c in REAL_ROWS] == ["4,16,128;16,128,512", "4,16,512;16,512,128"]


@pytest.mark.parametrize("cells", REAL_ROWS, ids=lambda c: c["Input Shapes"])
def test_real_rows_call_npu_transpose_batchmatmul_reading_x1_batch_second(cells: dict[str, str]) -> None:
    # npu_api is op_mapping's string; the call that launches the fused kernel is another API
    assert replay_of(TYPE).npu_api == op_mapping_api(TYPE) == "torch.bmm"
    call = npu_call_of(TYPE, cells)
    assert call.api == "torch_npu.npu_transpose_batchmatmul"
    assert shapes(call.args) == (_shape(cells["Input Shapes"], 0), _shape(cells["Input Shapes"], 1))
    assert dict(call.kwargs) == {"perm_x1": [1, 0, 2], "perm_x2": [0, 1, 2], "perm_y": [1, 0, 2]}
    assert call.outputs is None  # the API returns the one output
    x1, x2 = call.args
    assert x1.is_contiguous() and x2.is_contiguous()  # stored as recorded; the kernel permutes


def test_a_batch_first_row_calls_with_the_identity_x1_permutation() -> None:
    call = npu_call_of(TYPE, BATCH_FIRST)
    assert shapes(call.args) == ((16, 64, 512), (16, 512, 128))
    assert call.kwargs["perm_x1"] == [0, 1, 2] and call.kwargs["perm_y"] == [1, 0, 2]


@pytest.mark.parametrize("cells", REAL_ROWS + [BATCH_FIRST], ids=lambda c: c["Input Shapes"])
def test_rows_replay_on_the_cpu(cells: dict[str, str]) -> None:
    outputs, _ = replay_on_cpu(TYPE, cells)
    assert tuple(outputs.shape) == _shape(cells["Output Shapes"], 0) and outputs.is_contiguous()


def test_the_output_is_y_m_b_n_of_an_independent_einsum() -> None:
    cells = REAL_ROWS[0]
    replay = TransposeBatchMatMulReplay()
    args = replay.make_inputs(kernel_row(TYPE, cells), torch.device("cpu"), torch.Generator().manual_seed(1))
    x1, x2 = args[0].double(), args[1].double()
    expected = torch.einsum("mbk,bkn->mbn", x1, x2)
    torch.testing.assert_close(replay.run(*args).double(), expected, rtol=1.6e-2, atol=0.1)


def test_run_is_one_bmm_writing_into_the_permuted_output() -> None:
    ops = aten_ops_of_run(TYPE, REAL_ROWS[0])
    assert [op for op in ops if op != "aten.transpose"] == ["aten.bmm"]


@pytest.mark.parametrize(
    ("cells", "reason"),
    [
        (_cells("4,16,100;16,100,512", "DT_BF16;DT_BF16", "4,16,512", "DT_BF16"), "divisible by 128"),
        (_cells("4,16,128;8,128,512", "DT_BF16;DT_BF16", "4,16,512", "DT_BF16"), "inconsistent"),
        (_cells("4,16,128;16,128,512", "DT_BF16;DT_BF16", "16,4,512", "DT_BF16"), "inconsistent"),
        (_cells("4,16,128;16,128,512;512", "DT_BF16;DT_BF16;DT_BF16", "4,16,512", "DT_BF16", "ND;ND;ND"), "slot 2"),
        (_cells("4,16,128;16,128,512", "DT_BF16;FLOAT16", "4,16,512", "DT_BF16"), "one floating dtype"),
        (_cells("4,16,128;16,128,512", "DT_BF16;DT_BF16", "4,16,512", "DT_BF16", "ND;FRACTAL_NZ"), "FRACTAL_NZ"),
    ],
)
def test_rows_it_cannot_build_are_refused_with_the_reason(cells: dict[str, str], reason: str) -> None:
    with pytest.raises(CaseBuildError, match=reason):
        replay_of(TYPE).check(kernel_row(TYPE, cells))


class _ReadsX1WithoutPermuting(TransposeBatchMatMulReplay):
    """Treats the [M,B,K] storage as [B,M,K] (a reshape instead of the transpose)."""

    def run(self, x1: torch.Tensor, x2: torch.Tensor, out: torch.Tensor, perm: Any) -> torch.Tensor:
        return torch.bmm(x1.reshape(x2.shape[0], -1, x1.shape[-1]), x2).transpose(0, 1)


def test_verification_catches_a_run_that_ignores_the_x1_permutation() -> None:
    row = kernel_row(TYPE, REAL_ROWS[0])
    wrong, right = _ReadsX1WithoutPermuting(), replay_of(TYPE)
    args = right.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(VerificationError, match="relative error"):
        verify_outputs(wrong, row, wrong.run(*args), right.reference(*args))
