"""RINGMLAPrefillBF16Kernel (ATB ring MLA prefill, ``torch_npu.atb.npu_ring_mla``).

No public database row of this kernel type exists (op_mapping 0.13 lists it as "CSV data to be
added").  The rows here are written in exactly the layout msmodeling's
``tools/perf_data_collection/op_replay/RINGMLAPrefillBF16Kernel_run.py`` parses: 15 input slots,
q_nope;q_rope;k_nope;k_rope;value in 0-4, the ``[512, 512]`` mask in slot 5 for the first ring step,
pre_out and prev_lse in slots 13-14 for a later step; outputs out;softmax_lse ``[N, T]`` FLOAT.
Head sizes are DeepSeek's (128 + 64 rotary, value 128) with 16 heads (128 heads over TP 8).
"""

from __future__ import annotations

import math

import pytest
import torch

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.mla_prefill import RingMlaPrefillReplay
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import kernel_row, meta_outputs, npu_call_of, op_mapping_api, replay_on_cpu, shapes

RING = "RINGMLAPrefillBF16Kernel"


def _row(slots: list[str], dtypes: list[str], outputs: str, **extra: str) -> dict[str, str]:
    slots = slots + [""] * (15 - len(slots))
    dtypes = dtypes + ["DT_UNDEFINED"] * (15 - len(dtypes))
    return {"OP State": "dynamic", "Accelerator Core": "MIX_AIC", "Input Shapes": '"' + ";".join(slots) + '"',
            "Input Data Types": ";".join(dtypes), "Input Formats": ";".join("ND" if s else "NULL" for s in slots),
            "Output Shapes": f'"{outputs}"', "Output Data Types": "DT_BF16;FLOAT", "Output Formats": "ND;ND",
            **extra}  # fmt: skip


def first_ring(tokens: int, heads: int = 16, kv_heads: int | None = None, **extra: str) -> dict[str, str]:
    kv = kv_heads or heads
    return _row([f"{tokens},{heads},128", f"{tokens},{heads},64", f"{tokens},{kv},128", f"{tokens},{kv},64",
                 f"{tokens},{kv},128", "512,512"], ["DT_BF16"] * 6, f"{tokens},{heads},128;{heads},{tokens}",
                **extra)  # fmt: skip


def later_ring(tokens: int, context: int, heads: int = 16, **extra: str) -> dict[str, str]:
    slots = [f"{tokens},{heads},128", f"{tokens},{heads},64", f"{context},{heads},128", f"{context},{heads},64",
             f"{context},{heads},128"] + [""] * 8 + [f"{tokens},{heads},128", f"{heads},{tokens}"]  # fmt: skip
    dtypes = ["DT_BF16"] * 5 + ["DT_UNDEFINED"] * 8 + ["DT_BF16", "FLOAT"]
    return _row(slots, dtypes, f"{tokens},{heads},128;{heads},{tokens}", **extra)


def test_first_ring_step_calls_npu_ring_mla_as_vllm_ascend_does() -> None:
    assert op_mapping_api(RING) is None  # op_mapping's note names torch_npu.atb.npu_ring_mla, no microbench_api
    call = npu_call_of(RING, first_ring(300, avg_seq_len="100"))
    assert call.api == "torch_npu.atb.npu_ring_mla"
    assert shapes(call.args[:6]) == ((300, 16, 128), (300, 16, 64), (300, 16, 128), (300, 16, 64), (300, 16, 128),
                                     (512, 512))  # fmt: skip
    seqlen = call.args[6]
    assert seqlen.device.type == "cpu" and seqlen.dtype == torch.int32 and seqlen.tolist() == [100, 100, 100]
    mask = call.args[5]
    assert mask.dtype == torch.bfloat16 and torch.equal(mask, torch.ones(512, 512).triu(1).bfloat16())
    assert shapes(call.kwargs) == {
        "head_num": 16, "kv_head_num": 16, "pre_out": None, "prev_lse": None, "qk_scale": 1 / math.sqrt(192),
        "kernel_type": "kernel_type_high_precision", "mask_type": "mask_type_triu", "input_layout": "type_bsnd",
        "calc_type": "calc_type_first_ring", "output": (300, 16, 128), "softmax_lse": (16, 300),
    }  # fmt: skip
    assert call.outputs == (0, 1)


def test_later_ring_step_merges_the_previous_output() -> None:
    call = npu_call_of(RING, later_ring(300, 500))
    assert call.args[6].tolist() == [[300], [500]]  # [2, B]: query and context lengths, one request
    assert shapes({k: call.kwargs[k] for k in ("pre_out", "prev_lse", "mask_type", "calc_type")}) == {
        "pre_out": (300, 16, 128), "prev_lse": (16, 300), "mask_type": "no_mask", "calc_type": "calc_type_default"}


def test_the_request_split_comes_from_avg_seq_len_only_when_it_divides() -> None:
    assert npu_call_of(RING, first_ring(300, avg_seq_len="128")).args[6].tolist() == [300]
    assert npu_call_of(RING, first_ring(300)).args[6].tolist() == [300]


def test_a_long_prefill_builds_its_call_and_outputs() -> None:
    row = first_ring(16384, avg_seq_len="4096")
    call = npu_call_of(RING, row, device="meta")
    assert call.args[6].tolist() == [4096] * 4
    out, lse = meta_outputs(RING, row)
    assert (tuple(out.shape), tuple(lse.shape), lse.dtype) == ((16384, 16, 128), (16, 16384), torch.float32)


ROWS = {
    "first ring, 3 requests": first_ring(300, avg_seq_len="100"),
    "first ring, GQA 16:4": first_ring(200, kv_heads=4),
    "later ring, context 500": later_ring(300, 500),
    "later ring, 2 requests": later_ring(128, 256, avg_seq_len="64"),
}


@pytest.mark.parametrize("cells", list(ROWS.values()), ids=list(ROWS))
def test_rows_run_on_the_cpu(cells: dict[str, str]) -> None:
    replay_on_cpu(RING, cells)


REFUSED = {
    "alibi slopes": (_row(first_ring(64)["Input Shapes"].strip('"').split(";")[:7] + ["16"],
                          ["DT_BF16"] * 6 + ["DT_UNDEFINED", "DT_BF16"], "64,16,128;16,64"),
                     "input slot 7"),  # fmt: skip
    "pre_out without prev_lse": (_row(later_ring(64, 64)["Input Shapes"].strip('"').split(";")[:14],
                                      ["DT_BF16"] * 5 + ["DT_UNDEFINED"] * 8 + ["DT_BF16"], "64,16,128;16,64"),
                                 "together"),  # fmt: skip
    "first ring over other tokens": (_row([f"64,16,{d}" for d in (128, 64)] + [f"96,16,{d}" for d in (128, 64, 128)]
                                          + ["512,512"], ["DT_BF16"] * 6, "64,16,128;16,64"),
                                     "themselves"),  # fmt: skip
    "output of the wrong shape": ({**first_ring(64), "Output Shapes": '"64,16,192;16,64"'}, "output"),
}


@pytest.mark.parametrize("cells,message", list(REFUSED.values()), ids=list(REFUSED))
def test_rows_it_cannot_reproduce_are_refused(cells: dict[str, str], message: str) -> None:
    with pytest.raises(CaseBuildError, match=message):
        RingMlaPrefillReplay().check(kernel_row(RING, cells))


class _NotCausal(RingMlaPrefillReplay):
    def run(self, *args):  # type: ignore[no-untyped-def]
        plan, _ = args[-1]
        return super().run(*args[:-1], (plan, None))


class _NoMerge(RingMlaPrefillReplay):
    def run(self, *args):  # type: ignore[no-untyped-def]
        plan, causal = args[-1]
        return super().run(*args[:-1], (type(plan)(**{**plan.__dict__, "first_ring": True}), causal))


@pytest.mark.parametrize("wrong,cells", [(_NotCausal, ROWS["first ring, 3 requests"]),
                                         (_NoMerge, ROWS["later ring, context 500"])],
                         ids=["first ring without its mask", "later ring without the merge"])  # fmt: skip
def test_verification_catches_a_wrong_portable_path(wrong: type[RingMlaPrefillReplay], cells: dict[str, str]) -> None:
    replay, row = wrong(), kernel_row(RING, cells)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(VerificationError, match="relative error"):
        verify_outputs(replay, row, replay.run(*args), replay.reference(*args))
