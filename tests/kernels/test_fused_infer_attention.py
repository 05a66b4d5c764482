"""FusedInferAttentionScore: the real database rows of ``db_row_FusedInferAttentionScore.csv``.

The file is a real database in an older column naming (``Average Duration(us)``...; ``avg_seq_len``
holds the mean runtime KV length, -1 where unknown).  Its rows are three families: paged TND decode
(query ``[T, 4, 128]``, caches ``[12307, 128, 128]``, block table ``[T, 512]``), contiguous TND
prefill (``[24624, 4, 128]`` over 7 requests) and MLA decode ``BNSD_NBSD`` with rotary inputs.

Every real row builds its NPU call (on the ``meta`` device: no 400 MB caches) and its outputs' shapes.
Two real rows run the portable path on the CPU at full size (a 160-request paged decode over the
12307-block caches, and an MLA decode); the contiguous prefill rows (7 x 3518^2 x 4 heads in
float64) and the larger decode rows are numerically checked through reduced rows of the same
layouts, built from the real ones.
"""

from __future__ import annotations

import math
from itertools import accumulate

import pytest
import torch

from perf_plugin.database.table import CsvTable
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.fused_infer_attention import FusedInferAttentionScoreReplay, fia_plan
from perf_plugin.replay.kernels.mla_prefill import build_block_table
from perf_plugin.replay.registry import signature_of
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import (
    ASCEND,
    fixture_rows,
    kernel_row,
    meta_outputs,
    npu_call_of,
    op_mapping_api,
    replay_on_cpu,
    shapes,
)

FIA = "FusedInferAttentionScore"
FILE = "db_row_FusedInferAttentionScore.csv"
ROWS = fixture_rows(FILE, kernel_type=None)  # the distinct shapes (8 of the file's 10 rows)
EVERY_ROW = [CsvTable.read(ASCEND / FILE).row_dict(i) for i in range(10)]


def _slots(cells: dict[str, str], column: str = "Input Shapes") -> list[tuple[int, ...] | None]:
    return [tuple(int(d) for d in s.split(",")) if s else None for s in cells[column].strip('"').split(";")]


def _with(cells: dict[str, str], **changes: str) -> dict[str, str]:
    return {**cells, **changes}


def _inputs(*slots: str, dtypes: dict[int, str] | None = None) -> dict[str, str]:
    """The 31-slot input cells of a row: ``slots`` fill slots 0.. (empty strings stay empty)."""
    shapes_ = list(slots) + [""] * (31 - len(slots))
    types = {0: "DT_BF16", 1: "DT_BF16", 2: "DT_BF16", 4: "INT8", 5: "INT64", 6: "INT64", 14: "INT32", 24: "DT_BF16",
             25: "DT_BF16", **(dtypes or {})}  # fmt: skip
    return {
        "Input Shapes": '"' + ";".join(shapes_) + '"',
        "Input Data Types": ";".join(types.get(i, "DT_UNDEFINED") if shapes_[i] else "DT_UNDEFINED" for i in range(31)),
        "Input Formats": ";".join("ND" if s else "NULL" for s in shapes_),
    }


def _reduced(inputs: dict[str, str], out: str, lse: str = "", **extra: str) -> dict[str, str]:
    return {"OP State": "dynamic", "Accelerator Core": "MIX_AIC", **inputs, "Output Shapes": f'"{out};{lse}"',
            "Output Data Types": "DT_BF16;FLOAT", "Output Formats": "ND;ND", **extra}  # fmt: skip


def _slot_list(*pairs: tuple[int, str]) -> list[str]:
    slots = [""] * 26
    for index, shape in pairs:
        slots[index] = shape
    return slots


# Reduced rows of the real layouts (same slots, dtypes and metadata columns, smaller sizes).
PAGED_DECODE = _reduced(_inputs(*_slot_list((0, "8,4,128"), (1, "64,128,128"), (2, "64,128,128"), (4, "2048,2048"),
                                            (5, "8"), (6, "8"), (14, "8,16"))),
                        "8,4,128", avg_seq_len="1000")  # fmt: skip
PAGED_MTP_UNEVEN = _reduced(_inputs(*_slot_list((0, "12,4,128"), (1, "64,128,128"), (2, "64,128,128"), (4, "2048,2048"),
                                                (5, "6"), (6, "6"), (14, "6,16"))), "12,4,128",
                            **{"Runtime actual_seq_lengths_values": "1,3,5,8,10,12",
                               "Runtime actual_seq_lengths_kv_values": "300,1000,77,129,128,640"})  # fmt: skip
CONTIGUOUS_PREFILL = _reduced(_inputs(*_slot_list((0, "700,4,128"), (1, "700,1,128"), (2, "700,1,128"),
                                                  (4, "2048,2048"), (5, "3"), (6, "3"))),
                              "700,4,128", avg_seq_len="233")  # fmt: skip
MLA_DECODE = _reduced(_inputs(*_slot_list((0, "3,16,1,512"), (1, "40,1,128,512"), (2, "40,1,128,512"), (6, "3"),
                                          (14, "3,40"), (24, "3,16,1,64"), (25, "40,1,128,64")),
                              dtypes={}), "16,3,1,512", avg_seq_len="1500")  # fmt: skip
BSND_PAGED_GQA = _reduced(_inputs(*_slot_list((0, "3,2,8,64"), (1, "32,128,128"), (2, "32,128,128"), (6, "3"),
                                              (14, "3,8"))), "3,2,8,64", avg_seq_len="500")  # fmt: skip
BNSD_PAGED_4D = _reduced(_inputs(*_slot_list((0, "2,8,1,64"), (1, "16,2,128,64"), (2, "16,2,128,64"), (6, "2"),
                                             (14, "2,8"))), "2,8,1,64", avg_seq_len="700")  # fmt: skip
EVEN_CAUSAL_PREFILL = _reduced(_inputs(*_slot_list((0, "512,8,64"), (1, "512,2,64"), (2, "512,2,64"),
                                                   (4, "2048,2048"), (5, "2"), (6, "2"))),
                               "512,8,64", avg_seq_len="256")  # fmt: skip
WITH_LSE = _reduced(_inputs(*_slot_list((0, "90,4,64"), (1, "90,2,64"), (2, "90,2,64"), (4, "2048,2048"), (5, "2"),
                                        (6, "2"))), "90,4,64", lse="90,4,1")  # fmt: skip
REDUCED = {"paged decode": PAGED_DECODE, "paged MTP, uneven runtime lengths": PAGED_MTP_UNEVEN,
           "contiguous prefill, uneven": CONTIGUOUS_PREFILL, "MLA BNSD_NBSD": MLA_DECODE,
           "BSND paged GQA 4:1": BSND_PAGED_GQA, "BNSD paged [blocks, N, bs, D]": BNSD_PAGED_4D,
           "softmax_lse": WITH_LSE, "contiguous prefill, even, GQA 4:1": EVEN_CAUSAL_PREFILL}  # fmt: skip


def _expected_call(cells: dict[str, str]) -> dict[str, object]:
    """What the real row's call must pass, from its shapes and avg_seq_len (independently derived)."""
    slots, avg = _slots(cells), int(cells["avg_seq_len"])
    query, key = slots[0], slots[1]
    assert query is not None and key is not None
    if len(query) == 4:  # MLA decode: [B, N, 1, 512] + rope, latent cache [blocks, 1, 128, 512]
        return {"input_layout": "BNSD_NBSD", "num_heads": query[1], "num_key_value_heads": 1,
                "scale": 1 / math.sqrt(512 + 64), "sparse_mode": 0, "block_size": 128,
                "actual_seq_lengths_kv": [avg] * query[0], "softmax_lse_flag": False}  # fmt: skip
    tokens, batch = query[0], slots[5][0] if slots[5] else 0
    common = {"input_layout": "TND", "num_heads": 4, "num_key_value_heads": 1, "scale": 1 / math.sqrt(128),
              "sparse_mode": 3, "softmax_lse_flag": False}  # fmt: skip
    if slots[14] is not None:  # paged decode: one token per request, avg_seq_len KV tokens each
        return {**common, "block_size": 128, "actual_seq_lengths": list(range(1, tokens + 1)),
                "actual_seq_lengths_kv": [avg] * tokens}  # fmt: skip
    base, extra = divmod(tokens, batch)
    cumulative = list(accumulate(base + (i < extra) for i in range(batch)))
    assert abs(tokens / batch - avg) < 1  # avg_seq_len is the mean request length
    return {**common, "actual_seq_lengths": cumulative, "actual_seq_lengths_kv": cumulative}


@pytest.mark.parametrize("cells", ROWS, ids=lambda c: c["Input Shapes"].split(";")[0].strip('"'))
def test_real_rows_call_npu_fused_infer_attention_score(cells: dict[str, str]) -> None:
    call = npu_call_of(FIA, cells, device="meta")
    assert call.api == op_mapping_api(FIA) == "torch_npu.npu_fused_infer_attention_score"
    slots = _slots(cells)
    assert shapes(call.args) == (slots[0], slots[1], slots[2])
    expected = _expected_call(cells)
    assert {k: call.kwargs[k] for k in expected} == expected
    for name, index in (("atten_mask", 4), ("block_table", 14), ("query_rope", 24), ("key_rope", 25)):
        assert shapes(call.kwargs.get(name)) == slots[index]
    assert call.outputs == (0,)  # softmax_lse is an empty slot: softmax_lse_flag=False
    assert tuple(meta_outputs(FIA, cells).shape) == _slots(cells, "Output Shapes")[0]


def test_the_runtime_kv_length_tells_rows_of_one_shape_apart() -> None:
    same_shape = [c for c in EVERY_ROW if c["Input Shapes"] == EVERY_ROW[0]["Input Shapes"]]
    assert [c["avg_seq_len"] for c in same_shape] == ["4096", "8192", "-1"]
    assert len({signature_of(FIA, c) for c in same_shape}) == 3
    kv = [fia_plan(kernel_row(FIA, c)).kv_lens for c in same_shape]
    assert kv == [(4096,) * 128, (8192,) * 128, (128,) * 128]  # -1: one block per request (msmodeling)


@pytest.mark.parametrize("index", [0, 2, 6])
def test_real_block_tables_are_valid_and_consistent_with_the_lengths(index: int) -> None:
    plan = fia_plan(kernel_row(FIA, ROWS[index]))
    table_shape, pool = _slots(ROWS[index])[14], _slots(ROWS[index])[1][0]  # type: ignore[index]
    assert table_shape is not None
    table = build_block_table(plan.kv_lens, plan.block_size, pool, table_shape, torch.device("cpu"),
                              torch.Generator().manual_seed(0))  # fmt: skip
    assert table.dtype == torch.int32 and tuple(table.shape) == table_shape
    assert 0 <= int(table.min()) and int(table.max()) < pool
    for b, n in enumerate(plan.kv_lens):
        used = table[b, : math.ceil(n / plan.block_size)]
        assert used.unique().numel() == used.numel()  # a request's blocks are distinct
    if index == 2:  # 496 requests x 32 blocks > 12307: the pool wraps round, every id still valid
        assert sum(math.ceil(n / 128) for n in plan.kv_lens) > pool


@pytest.mark.parametrize("index", [3, 6], ids=["paged TND decode 160x2048", "MLA BNSD_NBSD 4x2048"])
def test_real_rows_run_on_the_cpu(index: int) -> None:
    out, ref = replay_on_cpu(FIA, ROWS[index])
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == _slots(ROWS[index], "Output Shapes")[0]


@pytest.mark.parametrize("cells", list(REDUCED.values()), ids=list(REDUCED))
def test_reduced_rows_of_the_real_layouts_run_on_the_cpu(cells: dict[str, str]) -> None:
    replay_on_cpu(FIA, cells)


def test_reduced_row_calls() -> None:
    uneven = npu_call_of(FIA, PAGED_MTP_UNEVEN)
    assert uneven.kwargs["actual_seq_lengths"] == [1, 3, 5, 8, 10, 12]
    assert uneven.kwargs["actual_seq_lengths_kv"] == [300, 1000, 77, 129, 128, 640]
    bsnd = npu_call_of(FIA, BSND_PAGED_GQA)
    assert (bsnd.kwargs["input_layout"], bsnd.kwargs["num_heads"], bsnd.kwargs["num_key_value_heads"]) == ("BSND", 8, 2)
    assert "atten_mask" not in bsnd.kwargs and bsnd.kwargs["sparse_mode"] == 0
    lse = npu_call_of(FIA, WITH_LSE)
    assert lse.kwargs["softmax_lse_flag"] is True and lse.outputs == (0, 1)
    assert lse.kwargs["actual_seq_lengths_kv"] == [45, 90]  # contiguous TND: cumulative


REFUSED = {
    "a quantisation slot": (_with(PAGED_DECODE, **_inputs(*_slot_list((0, "8,4,128"), (1, "64,128,128"),
        (2, "64,128,128"), (4, "2048,2048"), (5, "8"), (6, "8"), (14, "8,16")) + ["", "", "", "", "1"],
        dtypes={30: "FLOAT"})), "input slot 30"),  # fmt: skip
    "BSH query": (_reduced(_inputs("8,1,512", "64,128,128", "64,128,128", "", "", "", "8", *[""] * 7, "8,16"),
                           "8,1,512"), "BSH"),  # fmt: skip
    "full mask": (_with(PAGED_DECODE, **_inputs(*_slot_list((0, "8,4,128"), (1, "64,128,128"), (2, "64,128,128"),
        (4, "8,1,1,2048"), (5, "8"), (6, "8"), (14, "8,16")))), "atten_mask"),  # fmt: skip
    "KV longer than the block table": (_with(PAGED_DECODE, avg_seq_len="5000"), "needs 40 blocks"),
    "lse of the wrong shape": (_with(WITH_LSE, **{"Output Shapes": '"90,4,64;4,90"'}), "softmax_lse"),
    "BSND query over a heads-first cache": (_with(BNSD_PAGED_4D, **{"Runtime input_layout": "BSND"}), "paged cache"),
}


@pytest.mark.parametrize("cells,message", list(REFUSED.values()), ids=list(REFUSED))
def test_rows_it_cannot_reproduce_are_refused(cells: dict[str, str], message: str) -> None:
    with pytest.raises(CaseBuildError, match=message):
        FusedInferAttentionScoreReplay().check(kernel_row(FIA, cells))


class _NoCausalMask(FusedInferAttentionScoreReplay):
    def run(self, *args):  # type: ignore[no-untyped-def]
        case = args[-1]
        return super().run(*args[:-1], type(case)(case.plan, case.q_index, case.out_index, case.kv_index, None))


class _FirstBlocks(FusedInferAttentionScoreReplay):
    def run(self, *args):  # type: ignore[no-untyped-def]
        table = args[4]
        ordered = torch.arange(table.numel(), dtype=table.dtype).view_as(table) % args[1].shape[0]
        return super().run(*args[:4], ordered, *args[5:])


class _NotCausal(FusedInferAttentionScoreReplay):
    def run(self, *args):  # type: ignore[no-untyped-def]
        case = args[-1]
        return super().run(*args[:-1], type(case)(case.plan, case.q_index, case.out_index, case.kv_index, None))


def _case(cells: dict[str, str]):  # type: ignore[no-untyped-def]
    replay, row = FusedInferAttentionScoreReplay(), kernel_row(FIA, cells)
    return replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))[-1]


def test_equal_lengths_attend_without_a_mask() -> None:
    """The fused kernel reads no position past a request's length: a paged decode whose lengths end
    inside a block is cut to them, and a causal prefill of equal lengths takes the causal kernel."""
    decode = _case(PAGED_DECODE)  # 1000 of 1024 gathered positions
    assert decode.allowed is None and not decode.is_causal and decode.plan.kv_span == 1000
    prefill = _case(EVEN_CAUSAL_PREFILL)
    assert prefill.is_causal and prefill.allowed is None and prefill.plan.kv_lens == (256, 256)
    uneven = _case(CONTIGUOUS_PREFILL)
    assert not uneven.is_causal and uneven.allowed is not None


@pytest.mark.parametrize("wrong,cells", [(_NoCausalMask, CONTIGUOUS_PREFILL), (_FirstBlocks, PAGED_DECODE),
                                         (_NotCausal, EVEN_CAUSAL_PREFILL)],
                         ids=["ignores the causal mask", "ignores the block table", "not causal"])  # fmt: skip
def test_verification_catches_a_wrong_portable_path(wrong: type[FusedInferAttentionScoreReplay],
                                                    cells: dict[str, str]) -> None:  # fmt: skip
    replay, row = wrong(), kernel_row(FIA, cells)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(VerificationError, match="relative error"):
        verify_outputs(replay, row, replay.run(*args), replay.reference(*args))
