"""DispatchFFNCombine: the EP Size signature, the NPU call, the single-rank and expert-parallel portable paths.

No public row of this kernel type exists.  The rows below are written in exactly the layout
Ascend's replay script for the same database parses (msmodeling
``tools/perf_data_collection/op_replay/DispatchFFNCombine_run.py``: seven input slots
``x;weight1;weight2;expert_idx;scale1;scale2;probs``, two outputs ``out;expert_token_nums``
(``[E]`` or ``[1,E]``), scales ``[E,N]`` or flattened ``[E*N]``, and the ``EP Size`` column),
with the dtypes of vllm-ascend's operator definition (``dispatch_ffn_combine_def.cpp``).
``DSV3`` has DeepSeek-V3's decode sizes on 16 local experts: it is checked on the meta device
(its float64 reference would take minutes on 2 cores) and its numerics on reduced rows.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from perf_plugin.replay.api_call import NpuFormat
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.dispatch_ffn_combine import (
    DispatchFFNCombineReplay,
    EpGroup,
    decode_quant_param,
    encode_quant_param,
)
from perf_plugin.replay.kernels.moe_routing import GatingConfig, MoeGatingTopKReplay
from perf_plugin.replay.rank_group import RankGroup, group_scope, with_comm_names
from perf_plugin.replay.registry import signature_of
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import kernel_row, meta_outputs, npu_call_of, op_mapping_api, replay_of, replay_on_cpu, shapes

DFC = "DispatchFFNCombine"


def dfc_row(inputs: str, outputs: str, ep_size: str = "1", x_dtype: str = "DT_BF16", w_format: str = "FRACTAL_NZ") -> dict[str, str]:
    return {
        "OP State": "dynamic", "Accelerator Core": "MIX_AIC",
        "Input Shapes": f'"{inputs}"', "Input Data Types": f"{x_dtype};INT8;INT8;INT32;INT64;INT64;FLOAT",
        "Input Formats": f"ND;{w_format};{w_format};ND;ND;ND;ND",
        "Output Shapes": f'"{outputs}"', "Output Data Types": f"{x_dtype};INT32", "Output Formats": "ND;ND",
        "EP Size": ep_size,
    }  # fmt: skip


SMALL = dfc_row("24,128;4,128,128;4,64,128;24,2;4,128;4,128;24,2", "24,128;1,4")
FLAT_SCALES_FP16 = dfc_row("17,64;6,64,96;6,48,64;17,3;576;384;17,3", "17,64;6", x_dtype="FLOAT16", w_format="ND")
DSV3 = dfc_row("256,7168;16,7168,4096;16,2048,7168;256,8;16,4096;16,7168;256,8", "256,7168;1,16")
DSV3_REDUCED = dfc_row("64,512;16,512,256;16,128,512;64,8;16,256;16,512;64,8", "64,512;1,16")


def test_ep_size_is_part_of_the_signature() -> None:
    one, eight = SMALL, dict(SMALL, **{"EP Size": "8"})
    assert signature_of(DFC, one) != signature_of(DFC, eight)
    assert signature_of(DFC, one) == signature_of(DFC, dict(SMALL))
    assert signature_of(DFC, one).extra == ("1",)


def test_the_npu_call_is_vllm_ascends_custom_op_with_an_ep_group_to_supply() -> None:
    call = npu_call_of(DFC, SMALL)
    assert call.api == op_mapping_api(DFC) == "torch.ops._C_ascend.dispatch_ffn_combine"
    assert call.args == () and call.outputs == (0, 1)
    kw = call.kwargs
    assert kw["group"] == EpGroup(1)  # the HCCL communicator name, known only once the process group exists
    assert kw["max_output_size"] == 24 * 2
    (w1,), (w2,) = kw["weight1"], kw["weight2"]
    assert isinstance(w1, NpuFormat) and w1.format == "FRACTAL_NZ" and tuple(w1.tensor.shape) == (4, 128, 128)
    assert isinstance(w2, NpuFormat) and tuple(w2.tensor.shape) == (4, 64, 128)
    assert shapes({k: kw[k] for k in ("x", "expert_idx", "scale1", "scale2", "probs", "out", "expert_token_nums")}) == {
        "x": (24, 128), "expert_idx": (24, 2), "scale1": [(4, 128)], "scale2": [(4, 128)], "probs": (24, 2),
        "out": (24, 128), "expert_token_nums": (1, 4),
    }  # fmt: skip
    assert kw["expert_idx"].dtype == torch.int32 and kw["scale1"][0].dtype == torch.int64
    assert int(kw["expert_idx"].max()) < 4  # EP Size 1: every expert is local


@pytest.mark.parametrize("cells", [SMALL, FLAT_SCALES_FP16, DSV3_REDUCED], ids=["bf16-nz", "fp16-flat-scales", "dsv3-reduced"])
def test_single_rank_rows_run_on_the_cpu(cells: dict[str, str]) -> None:
    (out, counts), (_, reference_counts) = replay_on_cpu(DFC, cells)
    tokens, top_k = (int(d) for d in cells["Input Shapes"].strip('"').split(";")[3].split(","))
    assert int(counts.sum()) == tokens * top_k and torch.equal(counts, reference_counts)


def test_deepseek_sized_row_builds_on_the_meta_device() -> None:
    assert shapes(meta_outputs(DFC, DSV3)) == ((256, 7168), (1, 16))


@pytest.mark.parametrize(
    ("cells", "message"),
    [
        (dict(SMALL, **{"EP Size": "8"}), "this run's group has 1 (an NPU run replays such rows under torchrun with "
                                          "--perf-dispatch-ffn-combine-ep-size 8)"),
        (dict(SMALL, **{"EP Size": ""}), "no 'EP Size'"),
        (dict(SMALL, **{"Input Data Types": "DT_BF16;DT_BF16;DT_BF16;INT32;INT64;INT64;FLOAT"}), "only the W8A8 variant"),
        (dfc_row("24,128;4,128,128;4,128,128;24,2;4,128;4,128;24,2", "24,128;1,4"), "weight2 is [4,128,128], expected [4,64,128]"),
        (dfc_row("24,128;4,128,128;4,64,128;24,8;4,128;4,128;24,8", "24,128;1,4"), "top-k 8 exceeds the 4 experts"),
        (dfc_row("24,128;4,128,128;4,64,128;24,2;4,64;4,128;24,2", "24,128;1,4"), "scale1 is [4,64] INT64"),
        (dfc_row("24,128;4,128,128;4,64,128;24,2;4,128;4,128;24,2", "24,128;8"), "expert_token_nums is [8] INT32"),
    ],
    ids=["ep8", "no-ep-size", "bf16-weights", "weight2", "top-k", "scale1", "counts"],
)
def test_rows_it_cannot_reproduce_are_rejected_with_the_reason(cells: dict[str, str], message: str) -> None:
    with pytest.raises(CaseBuildError, match=re.escape(message)):
        replay_of(DFC).check(kernel_row(DFC, cells))


class UnweightedCombine(DispatchFFNCombineReplay):
    """Sums the experts' outputs without the routing probabilities."""

    def run(self, *args):  # type: ignore[no-untyped-def]
        args = list(args)
        args[6] = torch.ones_like(args[6])
        return super().run(*args)


class MiscountedTokens(DispatchFFNCombineReplay):
    def run(self, *args):  # type: ignore[no-untyped-def]
        out, counts = super().run(*args)
        return out, counts.roll(1, dims=-1)


@pytest.mark.parametrize("replay", [UnweightedCombine(), MiscountedTokens()], ids=["probs-ignored", "counts-rolled"])
def test_a_wrong_run_fails_verification(replay: DispatchFFNCombineReplay) -> None:
    kernel = kernel_row(DFC, SMALL)
    args = replay.make_inputs(kernel, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(VerificationError):
        verify_outputs(replay, kernel, replay.run(*args), replay.reference(*args))


def test_scales_use_the_npu_trans_quant_param_encoding() -> None:
    """op-plugin's reference for npu_trans_quant_param: float32 bits & 0xFFFFE000, bit 46 set."""
    scale = torch.tensor([0.0123, 1.5, 3.0e-5], dtype=torch.float32)
    encoded = encode_quant_param(scale)
    bits = scale.view(torch.int32).long() & 0xFFFFE000
    assert encoded.dtype == torch.int64 and torch.equal(encoded, bits | (1 << 46))
    assert torch.allclose(decode_quant_param(encoded), scale, rtol=2**-10)  # 10 mantissa bits kept


def test_gating_output_routes_the_fused_layer() -> None:
    """The chain the fused kernel stands for on one rank: gating top-k, then dispatch/FFN/combine
    on those expert ids and weights (permute, grouped GEMMs with SwiGLU, weighted combine)."""
    generator = torch.Generator().manual_seed(7)
    replay, kernel = DispatchFFNCombineReplay(), kernel_row(DFC, SMALL)
    args = list(replay.make_inputs(kernel, torch.device("cpu"), generator))
    logits = torch.randn(24, 4, generator=generator)
    probs, ids = MoeGatingTopKReplay().run(logits, None, GatingConfig(k=2, norm_type=0, renorm=1, out_flag=False))
    args[3], args[6] = ids, probs.float()
    out, counts = replay.run(*args)
    verify_outputs(replay, kernel, (out, counts), replay.reference(*args))
    assert torch.equal(counts.view(-1), torch.bincount(ids.view(-1).long(), minlength=4).int())


# ----------------------------------------------------------------------------- expert parallelism
EP2 = dict(SMALL, **{"EP Size": "2"})
# The same layer as one rank would see all of it: both ranks' 24 tokens and 4 experts each.
EP2_AS_ONE = dfc_row("48,128;8,128,128;8,64,128;48,2;8,128;8,128;48,2", "48,128;1,8")


def test_an_ep_row_is_checked_and_called_in_the_group_that_is_active() -> None:
    replay, row = replay_of(DFC), kernel_row(DFC, EP2)
    assert replay.group_size(row) == 2 and replay.group_column == "EP Size"
    with group_scope(RankGroup(2)):  # planned, as at collection
        replay.check(row)
    with group_scope(RankGroup(4)), pytest.raises(CaseBuildError, match="this run's group has 4"):
        replay.check(row)
    with group_scope(RankGroup(2, 1, handle="the process group")):
        args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(1))
        call = replay.npu_call(row, args)
        assert call.kwargs["group"] == EpGroup(2) and call.kwargs["max_output_size"] == 24 * 2 * 2
        assert int(args[3].max()) < 8  # expert ids span both ranks' 4 experts
        named = with_comm_names(call, lambda group: f"hccl_{group.handle}_{group.rank}")
    assert named.kwargs["group"] == "hccl_the process group_1"
    with pytest.raises(ValueError, match="needs the communicator of a process group of 2 rank"):
        with_comm_names(call, str)  # no group active: the call cannot be made


def _ep_rank(rank: int, store: str, results: str) -> None:
    """One rank of a gloo group of 2: the EP row's portable run and reference, verified, saved."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        replay, row = DispatchFFNCombineReplay(), kernel_row(DFC, EP2)
        with group_scope(RankGroup(2, rank, dist.new_group([0, 1]))):
            args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(rank))
            out, counts = replay.run(*args)
            verify_outputs(replay, row, (out, counts), replay.reference(*args))
        torch.save({"inputs": args[:7], "out": out, "counts": counts}, f"{results}/{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_ranks_compute_what_one_rank_computes_for_the_whole_layer(tmp_path: Path) -> None:
    """Each rank's output and expert counts are its share of the single-rank layer over both
    ranks' tokens and experts (the single-rank path's float64 reference, checked above)."""
    import torch.multiprocessing as mp

    mp.spawn(_ep_rank, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"{rank}.pt") for rank in (0, 1)]
    # tokens, experts (their weights and scales) and routing of rank 0, then of rank 1
    x, w1, w2, ids, s1, s2, probs = (torch.cat([r["inputs"][i] for r in ranks]) for i in range(7))
    replay, whole = DispatchFFNCombineReplay(), kernel_row(DFC, EP2_AS_ONE)
    plan = replay.plan(whole)
    out_ref, counts_ref = replay.reference(x, w1, w2, ids, s1, s2, probs, None, torch.zeros(1, 8), None, plan)
    for rank, result in enumerate(ranks):
        mine = out_ref[rank * 24 : (rank + 1) * 24]
        error = float((result["out"].double() - mine).norm() / mine.norm())
        assert error < replay.tolerance(whole.present_outputs[0])
        assert torch.equal(result["counts"].view(-1), counts_ref.view(-1)[rank * 4 : (rank + 1) * 4])
