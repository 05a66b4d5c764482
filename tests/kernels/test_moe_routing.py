"""MoeTokenPermute, MoeTokenUnpermute and MoeGatingTopK: NPU calls, portable runs, semantics.

No public row of these kernel types exists.  The rows below are written in exactly the layout
Ascend's replay scripts for the same database parse (msmodeling
``tools/perf_data_collection/op_replay/MoeTokenPermute_run.py``: ``tokens;indices``;
``MoeTokenUnpermute_run.py``: ``permuted_tokens;sorted_indices[;probs]``, a third slot that may
be empty/``DT_UNDEFINED``; ``MoeGatingTopK_run.py``: ``x [T,E];bias [E]`` -> ``y;expert_idx;norm``)
with the output slots of the aclnn documentation of each kernel.  The hand-computed examples follow
the formulas of that documentation (CANN ops-transformer ``moe/moe_token_permute``,
``moe_token_unpermute``, ``moe_gating_top_k``).
"""

from __future__ import annotations

import re

import pytest
import torch

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.moe_routing import (
    GatingConfig,
    MoeGatingTopKReplay,
    MoeTokenPermuteReplay,
    MoeTokenUnpermuteReplay,
    permute_order,
)
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import kernel_row, npu_call_of, op_mapping_api, replay_of, replay_on_cpu, shapes

PERMUTE, UNPERMUTE, GATING = "MoeTokenPermute", "MoeTokenUnpermute", "MoeGatingTopK"


def row(inputs: str, in_dtypes: str, outputs: str, out_dtypes: str) -> dict[str, str]:
    def formats(dtypes: str) -> str:
        return ";".join("NULL" if d in ("", "DT_UNDEFINED") else "ND" for d in dtypes.split(";"))

    return {
        "OP State": "dynamic", "Accelerator Core": "AI_VECTOR_CORE",
        "Input Shapes": f'"{inputs}"', "Input Data Types": in_dtypes, "Input Formats": formats(in_dtypes),
        "Output Shapes": f'"{outputs}"', "Output Data Types": out_dtypes, "Output Formats": formats(out_dtypes),
    }  # fmt: skip


PERMUTE_ROWS = {
    "bf16-top8-int32": row("128,512;128,8", "DT_BF16;INT32", "1024,512;1024", "DT_BF16;INT32"),
    "fp32-top2-int64": row("37,64;37,2", "FLOAT;INT64", "74,64;74", "FLOAT;INT32"),
    "fp16-1d-indices": row("16,32;16", "FLOAT16;INT64", "16,32;16", "FLOAT16;INT32"),
    "dropped-tokens": row("64,128;64,8", "DT_BF16;INT32", "300,128;512", "DT_BF16;INT32"),
}
UNPERMUTE_ROWS = {
    "bf16-probs": row("1024,512;1024;128,8", "DT_BF16;INT32;DT_BF16", "128,512", "DT_BF16"),
    "fp16-fp32-probs": row("74,64;74;37,2", "FLOAT16;INT32;FLOAT", "37,64", "FLOAT16"),
    "no-probs": row("96,64;96;", "DT_BF16;INT32;DT_UNDEFINED", "96,64", "DT_BF16"),
}
GATING_ROWS = {
    "dsv3-sigmoid-bias": row("64,256;256", "DT_BF16;DT_BF16", "64,8;64,8;64,256", "DT_BF16;INT32;FLOAT"),
    "fp32-sigmoid-bias": row("33,160;160", "FLOAT;FLOAT", "33,8;33,8;33,160", "FLOAT;INT32;FLOAT"),
    "fp16-softmax-two-outputs": row("48,128", "FLOAT16", "48,6;48,6", "FLOAT16;INT32"),
}


# ----------------------------------------------------------------------------- NPU calls
def test_permute_calls_npu_moe_token_permute() -> None:
    assert op_mapping_api(PERMUTE) is None  # no microbench_api: msmodeling's replay API is used
    call = npu_call_of(PERMUTE, PERMUTE_ROWS["bf16-top8-int32"])
    assert call.api == "torch_npu.npu_moe_token_permute" and call.kwargs == {} and call.outputs == (0, 1)
    tokens, indices = call.args
    assert shapes(call.args) == ((128, 512), (128, 8)) and indices.dtype == torch.int32
    assert all(len(set(r)) == 8 for r in indices.tolist())  # distinct top-k experts per token
    assert npu_call_of(PERMUTE, PERMUTE_ROWS["dropped-tokens"]).kwargs == {"num_out_tokens": 300}


def test_unpermute_calls_npu_moe_token_unpermute_with_a_permutation() -> None:
    assert op_mapping_api(UNPERMUTE) is None
    call = npu_call_of(UNPERMUTE, UNPERMUTE_ROWS["bf16-probs"])
    assert call.api == "torch_npu.npu_moe_token_unpermute" and call.outputs is None
    permuted, order, probs = call.args
    assert shapes(call.args) == ((1024, 512), (1024,), (128, 8)) and order.dtype == torch.int32
    assert sorted(order.tolist()) == list(range(1024))
    assert npu_call_of(UNPERMUTE, UNPERMUTE_ROWS["no-probs"]).args[2] is None


def test_gating_calls_npu_moe_gating_top_k_with_the_api_defaults() -> None:
    call = npu_call_of(GATING, GATING_ROWS["dsv3-sigmoid-bias"])
    assert call.api == op_mapping_api(GATING) == "torch_npu.npu_moe_gating_top_k"
    assert shapes(call.args) == ((64, 256), 8) and shapes(call.kwargs["bias"]) == (256,)
    assert {k: v for k, v in call.kwargs.items() if k != "bias"} == {
        "k_group": 1, "group_count": 1, "group_select_mode": 0, "renorm": 0, "norm_type": 1, "out_flag": True,
        "routed_scaling_factor": 1.0, "eps": 1e-20,
    }  # fmt: skip
    assert call.outputs == (0, 1, 2)
    softmax = npu_call_of(GATING, GATING_ROWS["fp16-softmax-two-outputs"])
    assert softmax.kwargs["bias"] is None and softmax.kwargs["norm_type"] == 0 and softmax.outputs == (0, 1)


# ----------------------------------------------------------------------------- portable runs
@pytest.mark.parametrize("cells", PERMUTE_ROWS.values(), ids=PERMUTE_ROWS.keys())
def test_permute_runs_exactly_on_the_cpu(cells: dict[str, str]) -> None:
    replay_on_cpu(PERMUTE, cells)


@pytest.mark.parametrize("cells", UNPERMUTE_ROWS.values(), ids=UNPERMUTE_ROWS.keys())
def test_unpermute_runs_on_the_cpu(cells: dict[str, str]) -> None:
    replay_on_cpu(UNPERMUTE, cells)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("cells", GATING_ROWS.values(), ids=GATING_ROWS.keys())
def test_gating_runs_on_the_cpu_with_exact_expert_ids(cells: dict[str, str], seed: int) -> None:
    replay_on_cpu(GATING, cells, seed=seed)


# ----------------------------------------------------------------------------- rejected rows
@pytest.mark.parametrize(
    ("kernel_type", "cells", "message"),
    [
        (PERMUTE, row("8,16;8,2", "DT_BF16;FLOAT", "16,16;16", "DT_BF16;INT32"), "indices dtype FLOAT"),
        (PERMUTE, row("8,16;8,2", "DT_BF16;INT32", "17,16;16", "DT_BF16;INT32"), "0 < R <= T*k = 16"),
        (PERMUTE, row("8,16;8,2", "DT_BF16;INT32", "16,16;16", "DT_BF16;INT64"), "[16] INT32"),
        (UNPERMUTE, row("16,16;16;8,3", "DT_BF16;INT32;DT_BF16", "8,16", "DT_BF16"), "T*k = 16"),
        (UNPERMUTE, row("16,16;16;8,2", "DT_BF16;INT32;DT_BF16", "8,16", "FLOAT"), "should be [8,16] BF16"),
        (GATING, row("8,64;32", "DT_BF16;DT_BF16", "8,4;8,4;8,64", "DT_BF16;INT32;FLOAT"), "bias [32] BF16 should be [64]"),
        (GATING, row("8,4096", "FLOAT", "8,8;8,8", "FLOAT;INT32"), "E <= 2048"),
        (GATING, row("8,64", "FLOAT", "8,4;8,4;8,64", "FLOAT;INT64;FLOAT"), "expert_idx [8,k] INT32"),
    ],
    ids=["float-indices", "too-many-rows", "int64-order", "probs-shape", "out-dtype", "bias-shape", "too-many-experts", "idx-dtype"],
)  # fmt: skip
def test_rows_it_cannot_reproduce_are_rejected_with_the_reason(kernel_type: str, cells: dict[str, str], message: str) -> None:
    with pytest.raises(CaseBuildError, match=re.escape(message)):
        replay_of(kernel_type).check(kernel_row(kernel_type, cells))


# ----------------------------------------------------------------------------- the verification bites
class UnstablePermute(MoeTokenPermuteReplay):
    """Sorts pairs of one expert in reverse pair order (the kernel keeps pair order)."""

    def run(self, tokens, indices, k, rows):  # type: ignore[no-untyped-def]
        flat = indices.reshape(-1).long()
        first = torch.argsort(flat * flat.numel() - torch.arange(flat.numel()))
        dest = torch.argsort(first)
        return tokens.index_select(0, first[:rows] // k), dest.int()


class UnweightedUnpermute(MoeTokenUnpermuteReplay):
    def run(self, permuted, order, probs):  # type: ignore[no-untyped-def]
        return super().run(permuted, order, torch.ones_like(probs))


class BiasBlindGating(MoeGatingTopKReplay):
    """Chooses experts on the scores alone, forgetting the bias."""

    def run(self, x, bias, cfg):  # type: ignore[no-untyped-def]
        return super().run(x, None, cfg)


@pytest.mark.parametrize(
    ("replay", "kernel_type", "cells"),
    [
        (UnstablePermute(), PERMUTE, PERMUTE_ROWS["bf16-top8-int32"]),
        (UnweightedUnpermute(), UNPERMUTE, UNPERMUTE_ROWS["bf16-probs"]),
        (BiasBlindGating(), GATING, GATING_ROWS["dsv3-sigmoid-bias"]),
    ],
    ids=["permute", "unpermute", "gating"],
)
def test_a_wrong_run_fails_verification(replay: object, kernel_type: str, cells: dict[str, str]) -> None:
    kernel = kernel_row(kernel_type, cells)
    args = replay.make_inputs(kernel, torch.device("cpu"), torch.Generator().manual_seed(0))  # type: ignore[attr-defined]
    with pytest.raises(VerificationError):
        verify_outputs(replay, kernel, replay.run(*args), replay.reference(*args))  # type: ignore[attr-defined, arg-type]


# ----------------------------------------------------------------------------- semantics
def test_permute_matches_the_documented_example() -> None:
    """aclnnMoeTokenPermute's sample: tokens 0.1/0.2/0.3 with experts [[1,2],[0,1],[0,2]]."""
    tokens = torch.tensor([[0.1] * 4, [0.2] * 4, [0.3] * 4])
    indices = torch.tensor([[1, 2], [0, 1], [0, 2]], dtype=torch.int32)
    replay = MoeTokenPermuteReplay()
    for permuted, order in (replay.run(tokens, indices, 2, 6), replay.reference(tokens, indices, 2, 6)):
        assert order.tolist() == [2, 4, 0, 3, 1, 5]  # pair i lands in row order[i]
        assert permuted[:, 0].tolist() == pytest.approx([0.2, 0.3, 0.1, 0.2, 0.1, 0.3])


def test_unpermute_with_averaging_probs_undoes_permute() -> None:
    generator = torch.Generator().manual_seed(5)
    tokens = torch.randn(12, 16, generator=generator, dtype=torch.float64)
    ids = torch.rand(12, 6, generator=generator).argsort(1)[:, :3]
    permuted, order = MoeTokenPermuteReplay().run(tokens, ids, 3, 36)
    probs = torch.full((12, 3), 1 / 3, dtype=torch.float64)
    assert torch.allclose(MoeTokenUnpermuteReplay().run(permuted, order, probs), tokens)
    assert torch.equal(permute_order(ids.reshape(-1))[1].int(), order)


def test_group_top_k_keeps_only_the_best_groups() -> None:
    """8 experts in 4 groups of 2; the best 2 groups by max (mode 0) or top-2 sum (mode 1)."""
    x = torch.logit(torch.tensor([[0.90, 0.10, 0.60, 0.55, 0.20, 0.85, 0.50, 0.45]], dtype=torch.float64))
    replay = MoeGatingTopKReplay()
    by_max = GatingConfig(k=3, norm_type=1, k_group=2, group_count=4, group_select_mode=0)
    by_sum = GatingConfig(k=3, norm_type=1, k_group=2, group_count=4, group_select_mode=1)
    for run in (replay.run, replay.reference):
        # groups by max: 0 (0.90) and 2 (0.85); the best 3 of experts 0, 1, 4, 5
        assert sorted(run(x, None, by_max)[1][0].tolist()) == [0, 4, 5]
        # groups by top-2 sum: 1 (1.15) and 2 (1.05); the best 3 of experts 2, 3, 4, 5
        y, idx, _ = run(x, None, by_sum)
        assert sorted(idx[0].tolist()) == [2, 3, 5]
        assert float(y.sum()) == pytest.approx(1.0)  # sigmoid weights are renormalised


@pytest.mark.parametrize("renorm", [0, 1])
def test_softmax_gating_renormalises_only_when_asked(renorm: int) -> None:
    replay = MoeGatingTopKReplay()
    x = torch.randn(10, 64, generator=torch.Generator().manual_seed(4))
    cfg = GatingConfig(k=4, renorm=renorm, routed_scaling_factor=2.5, group_count=8, k_group=2, group_select_mode=1)
    y, idx, norm = replay.run(x, None, cfg)
    ry, ridx, _ = replay.reference(x, None, cfg)
    assert torch.equal(idx, ridx) and torch.allclose(y.double(), ry, rtol=1e-5)
    expected = norm.gather(1, idx.long()) * 2.5
    if renorm:
        expected = expected / expected.sum(-1, keepdim=True) * 2.5
    assert torch.allclose(y, expected, rtol=1e-5)
