"""SparseFlashAttention and LightningIndexer (DeepSeek sparse attention).

No public database row of either kernel type exists.  The rows here are written in exactly the
layout Ascend's replay scripts parse (msmodeling ``tools/perf_data_collection/op_replay/
SparseFlashAttention_run.py``: 9 inputs, and ``LightningIndexer_run.py``: 6 inputs, 2 outputs; dtype
spelling ``DT_BF16;DT_INT32``, embedded quotes).  The ``EXAMPLE`` rows carry the example shapes those
scripts' docstrings give (query ``(102, 16, 512)``, caches ``(1766, 128, 1, 512)``, top-k 2048, block
table ``(34, 1584)``...); without a KV length they fall back to the block table's capacity (200K
tokens per request), too large for the CPU, so they are checked through their NPU call and output
shapes, and the numerics through reduced rows of the same layout with an ``avg_seq_len``.
"""

from __future__ import annotations

import math

import pytest
import torch

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.sparse_attention import (
    LightningIndexerReplay,
    SparseFlashAttentionReplay,
    _sparse_indices,
    sparse_attention_plan,
)
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import kernel_row, meta_outputs, npu_call_of, op_mapping_api, replay_on_cpu, shapes

SFA, LI = "SparseFlashAttention", "LightningIndexer"


def _row(inputs: str, dtypes: str, outputs: str, out_dtypes: str, **extra: str) -> dict[str, str]:
    n, m = len(inputs.split(";")), len(outputs.split(";"))
    return {"OP State": "dynamic", "Accelerator Core": "MIX_AIC", "Input Shapes": f'"{inputs}"',
            "Input Data Types": dtypes, "Input Formats": ";".join(["ND"] * n), "Output Shapes": f'"{outputs}"',
            "Output Data Types": out_dtypes, "Output Formats": ";".join(["ND"] * m), **extra}  # fmt: skip


SFA_TYPES = "DT_BF16;DT_BF16;DT_BF16;DT_INT32;DT_INT32;DT_INT32;DT_INT32;DT_BF16;DT_BF16"
LI_TYPES = "DT_BF16;DT_BF16;DT_BF16;DT_INT32;DT_INT32;DT_INT32"


def _sfa(tokens: int, batch: int, pool: int, width: int, topk: int, query: str = "", **extra: str) -> dict[str, str]:
    q = query or f"{tokens},16"
    return _row(f"{q},512;{pool},128,1,512;{pool},128,1,512;{q.rsplit(',', 1)[0]},1,{topk};{batch},{width};{batch};"
                f"{batch};{q},64;{pool},128,1,64", SFA_TYPES, f"{q},512", "DT_BF16", **extra)  # fmt: skip


def _li(tokens: int, batch: int, pool: int, width: int, topk: int, query: str = "", **extra: str) -> dict[str, str]:
    q = query or f"{tokens},64"
    lead = q.rsplit(",", 1)[0]
    return _row(f"{q},128;{pool},128,1,128;{q};{batch};{batch};{batch},{width}", LI_TYPES,
                f"{lead},1,{topk};{lead},1,{topk}", "DT_INT32;DT_BF16", **extra)  # fmt: skip


SFA_EXAMPLE = _sfa(102, 34, 1766, 1584, 2048)
LI_EXAMPLE = _row("102,32,128;1766,128,1,128;102,32;1;1;1,1584", LI_TYPES, "102,1,2048;102,1,2048", "DT_INT32;DT_BF16")
SFA_REDUCED = {
    "decode MTP, full top-k": _sfa(16, 4, 64, 16, 256, avg_seq_len="1000"),
    "short KV: -1 padding": _sfa(10, 3, 64, 16, 256, avg_seq_len="200"),
    "BSND query": _sfa(0, 2, 32, 8, 128, query="2,3,16", avg_seq_len="700"),
}
LI_REDUCED = {
    "TND uneven requests, short KV": _li(10, 3, 64, 16, 256, avg_seq_len="300"),
    "TND decode, long KV": _li(6, 6, 96, 16, 128, avg_seq_len="1500"),
    "BSND MTP": _li(0, 2, 32, 8, 64, query="2,2,64", avg_seq_len="900"),
}


def test_sparse_flash_attention_calls_the_vllm_ascend_custom_op() -> None:
    assert op_mapping_api(SFA) is None  # the op_mapping files name no API: msmodeling's replay API
    call = npu_call_of(SFA, SFA_EXAMPLE, device="meta")
    assert call.api == "torch.ops._C_ascend.npu_sparse_flash_attention"
    assert shapes(call.args[:4]) == ((102, 16, 512), (1766, 128, 1, 512), (1766, 128, 1, 512), (102, 1, 2048))
    assert call.args[4:] == (pytest.approx(1 / math.sqrt(576)), 1)  # scale_value, sparse_block_size
    assert shapes(call.kwargs) == {
        "block_table": (34, 1584), "actual_seq_lengths_query": (34,), "actual_seq_lengths_kv": (34,),
        "query_rope": (102, 16, 64), "key_rope": (1766, 128, 1, 64), "layout_query": "TND",
        "layout_kv": "PA_BSND", "sparse_mode": 3,
    }  # fmt: skip
    assert call.outputs is None  # the binding returns one tensor
    assert tuple(meta_outputs(SFA, SFA_EXAMPLE).shape) == (102, 16, 512)


def test_lightning_indexer_calls_torch_npu_and_selects_the_indices() -> None:
    assert op_mapping_api(LI) is None
    call = npu_call_of(LI, LI_EXAMPLE, device="meta")
    assert call.api == "torch_npu.npu_lightning_indexer"
    assert shapes(call.args) == ((102, 32, 128), (1766, 128, 1, 128), (102, 32))
    assert shapes(call.kwargs) == {
        "actual_seq_lengths_query": (1,), "actual_seq_lengths_key": (1,), "block_table": (1, 1584),
        "layout_query": "TND", "layout_key": "PA_BSND", "sparse_count": 2048, "sparse_mode": 3,
    }  # fmt: skip
    assert call.outputs == (0,)  # sparse_values is not returned with a paged key
    assert tuple(meta_outputs(LI, LI_EXAMPLE).shape) == (102, 1, 2048)


def test_length_inputs_are_valid() -> None:
    row = SFA_REDUCED["short KV: -1 padding"]  # 10 tokens over 3 requests: 4, 3, 3
    call = npu_call_of(SFA, row)
    assert call.kwargs["actual_seq_lengths_query"].tolist() == [4, 7, 10]  # cumulative for TND
    assert call.kwargs["actual_seq_lengths_kv"].tolist() == [200, 200, 200]
    assert call.kwargs["actual_seq_lengths_query"].dtype == torch.int32
    table = call.kwargs["block_table"]
    assert table.dtype == torch.int32 and 0 <= int(table.min()) and int(table.max()) < 64
    assert all(table[b, :2].unique().numel() == 2 for b in range(3))  # 200 tokens: 2 distinct blocks each


@pytest.mark.parametrize("cells", list(SFA_REDUCED.values()), ids=list(SFA_REDUCED))
def test_sparse_indices_are_sorted_distinct_visible_positions(cells: dict[str, str]) -> None:
    plan = sparse_attention_plan(kernel_row(SFA, cells))
    indices = _sparse_indices(plan, torch.device("cpu"), torch.Generator().manual_seed(1))[:, 0]
    for row, visible in zip(indices.tolist(), plan.visible()):
        count = min(plan.topk, visible)
        chosen = row[:count]
        assert chosen == sorted(set(chosen)) and 0 <= chosen[0] and chosen[-1] < visible
        assert row[count:] == [-1] * (plan.topk - count)


@pytest.mark.parametrize("cells", list(SFA_REDUCED.values()), ids=list(SFA_REDUCED))
def test_sparse_flash_attention_runs_on_the_cpu(cells: dict[str, str]) -> None:
    replay_on_cpu(SFA, cells)


@pytest.mark.parametrize("cells", list(LI_REDUCED.values()), ids=list(LI_REDUCED))
def test_lightning_indexer_runs_on_the_cpu(cells: dict[str, str]) -> None:
    out, _ = replay_on_cpu(LI, cells)
    plan_visible = [int(v) for v in (out >= 0).sum(-1).flatten()]
    assert min(plan_visible) >= 1 and out.dtype == torch.int32


def test_lightning_indexer_selects_the_best_visible_positions() -> None:
    row = kernel_row(LI, LI_REDUCED["TND uneven requests, short KV"])  # 300 KV tokens, top 256
    replay = LightningIndexerReplay()
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    out = replay.run(*args)
    query, key, weights, _, _, table = args[:6]
    keys = key.view(-1, 128)[(table[0, :3].long()[:, None] * 128 + torch.arange(128)).flatten()[:300]].double()
    scores = (weights[0].double()[:, None] * (query[0].double() @ keys.T).clamp_min(0)).sum(0)  # request 0, token 0
    visible = 300 - 4 + 0 + 1  # request 0 holds 4 of the 10 tokens; its first sees 297 positions
    top = out[0, 0, :256].long()
    assert int(top.max()) < visible and top.unique().numel() == 256
    assert scores[top].min() >= scores[:visible][torch.ones(visible, dtype=torch.bool).index_fill_(0, top, False)].max()


REFUSED = {
    "SFA cache not paged": (SFA, _row("16,16,512;64,128,512;64,128,512;16,1,256;4,16;4;4;16,16,64;64,128,64",
                                      SFA_TYPES, "16,16,512", "DT_BF16"), "4-d"),  # fmt: skip
    "SFA indices of the wrong width": (SFA, _row("16,16,512;64,128,1,512;64,128,1,512;16,2,256;4,16;4;4;16,16,64;"
                                                 "64,128,1,64", SFA_TYPES, "16,16,512", "DT_BF16"),
                                       "sparse_indices"),  # fmt: skip
    "SFA KV beyond the block table": (SFA, _sfa(16, 4, 64, 4, 256, avg_seq_len="1000"), "needs 8 blocks"),
    "LI weights of another shape": (LI, _row("10,64,128;64,128,1,128;10,32;3;3;3,16", LI_TYPES,
                                             "10,1,256;10,1,256", "DT_INT32;DT_BF16"), "weights"),  # fmt: skip
    "LI top-k over 2048": (LI, _li(10, 3, 64, 16, 4096, avg_seq_len="300"), "topk"),
    "LI 64-bit lengths": (LI, _row("10,64,128;64,128,1,128;10,64;3;3;3,16", LI_TYPES.replace("DT_INT32", "INT64", 1),
                                   "10,1,256;10,1,256", "DT_INT32;DT_BF16"), "INT32"),  # fmt: skip
}


@pytest.mark.parametrize("kind,cells,message", list(REFUSED.values()), ids=list(REFUSED))
def test_rows_it_cannot_reproduce_are_refused(kind: str, cells: dict[str, str], message: str) -> None:
    replay = SparseFlashAttentionReplay() if kind == SFA else LightningIndexerReplay()
    with pytest.raises(CaseBuildError, match=message):
        replay.check(kernel_row(kind, cells))


class _PaddingAsPositionZero(SparseFlashAttentionReplay):
    def run(self, query, key, value, indices, *rest):  # type: ignore[no-untyped-def]
        return super().run(query, key, value, indices.clamp(min=0), *rest)


class _UnorderedTies(LightningIndexerReplay):
    def run(self, *args):  # type: ignore[no-untyped-def]
        out = super().run(*args)
        return out.flip(-1)  # the same set, another order


@pytest.mark.parametrize("wrong,kind,cells", [
    (_PaddingAsPositionZero, SFA, SFA_REDUCED["short KV: -1 padding"]),
    (_UnorderedTies, LI, LI_REDUCED["TND decode, long KV"]),
], ids=["SFA attends the -1 padding", "LI in another order"])  # fmt: skip
def test_verification_catches_a_wrong_portable_path(wrong: type, kind: str, cells: dict[str, str]) -> None:
    replay, row = wrong(), kernel_row(kind, cells)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(VerificationError):
        verify_outputs(replay, row, replay.run(*args), replay.reference(*args))
