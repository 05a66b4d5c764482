"""KvRmsNormRopeCache and split_qkv_rmsnorm_rope_kernel: NPU calls, cache writes and CPU numerics.

No public row of either kernel type exists.  The rows below are written in the layouts Ascend's
replay scripts parse:

* ``KvRmsNormRopeCache_run.py``: exactly twelve input slots ``kv;gamma;cos;sin;index;k_cache;
  ckv_cache;k_rope_scale;c_kv_scale;k_rope_offset;c_kv_offset;v`` (empty optional slots as
  ``DT_UNDEFINED``/``NULL``), four outputs ``k_cache;ckv_cache;k_rope;c_kv``; the shapes of
  vllm-ascend's DeepSeek MLA call (``kv [T,1,1,576]``, paged caches ``[blocks,128,1,64|512]``).
* ``split_qkv_rmsnorm_rope_kernel_run.py``: three replay inputs ``input;cos_sin_cache;positions``
  and three outputs ``q;k;v``, or the profiled two inputs / legacy two outputs; Qwen3 sizes
  (``head_dim`` 128, 32 q and 8 kv heads at TP1, 8 and 2 at TP4, ``max_position`` 40960).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.fused_rope_cache import KvRmsNormRopeCacheReplay, SplitQkvRmsNormRopeReplay
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import kernel_row, meta_outputs, npu_call_of, op_mapping_api, replay_on_cpu, shapes


def cells(inputs: str, in_types: str, outputs: str, out_types: str) -> dict[str, str]:
    def formats(types: str) -> str:
        return ";".join("NULL" if t == "DT_UNDEFINED" else "ND" for t in types.split(";"))

    return {
        "Input Shapes": f'"{inputs}"', "Input Data Types": in_types, "Input Formats": formats(in_types),
        "Output Shapes": f'"{outputs}"', "Output Data Types": out_types, "Output Formats": formats(out_types),
    }  # fmt: skip


def kv_row(tokens: int, blocks: int, outputs: bool = True, extra: str = ";;;;", extra_types: str = "") -> dict[str, str]:
    types = "DT_BF16;DT_BF16;DT_BF16;DT_BF16;INT64;DT_BF16;DT_BF16;" + (extra_types or ";".join(["DT_UNDEFINED"] * 5))
    caches = f"{blocks},128,1,64;{blocks},128,1,512"
    out = caches + (f";{tokens},1,1,64;{tokens},1,1,512" if outputs else ";;")
    shapes_ = f"{tokens},1,1,576;512;{tokens},1,1,64;{tokens},1,1,64;{tokens};{caches};{extra}"
    return cells(shapes_, types, out, "DT_BF16;DT_BF16;DT_BF16;DT_BF16")


KV_DECODE = kv_row(64, 16)
KV_PREFILL = kv_row(2048, 32)
KV_NO_OUTPUT = kv_row(64, 16, outputs=False)
QKV = {
    "prefill": cells("1024,6144;40960,128;1024", "DT_BF16;DT_BF16;INT64", "1024,4096;1024,1024;1024,1024", "DT_BF16;DT_BF16;DT_BF16"),
    "decode_tp4": cells("64,1536;40960,128;64", "DT_BF16;DT_BF16;INT64", "64,1024;64,256;64,256", "DT_BF16;DT_BF16;DT_BF16"),
    "profiled_two_in_two_out": cells("64,1536;40960,128", "DT_BF16;DT_BF16", "64,1024;64,256", "DT_BF16;DT_BF16"),
}  # fmt: skip


# ----------------------------------------------------------------------------- KvRmsNormRopeCache
@pytest.mark.parametrize(("row", "select"), [(KV_DECODE, (0, 1, 2, 3)), (KV_NO_OUTPUT, (0, 1))])
def test_kv_calls_npu_kv_rmsnorm_rope_cache_in_paged_mode(row: dict[str, str], select: tuple[int, ...]) -> None:
    call = npu_call_of("KvRmsNormRopeCache", row)
    assert call.api == op_mapping_api("KvRmsNormRopeCache") == "torch_npu.npu_kv_rmsnorm_rope_cache"
    assert shapes(call.args) == ((64, 1, 1, 576), (512,), (64, 1, 1, 64), (64, 1, 1, 64), (64,), (16, 128, 1, 64), (16, 128, 1, 512))
    assert call.args[4].dtype == torch.int64
    assert dict(call.kwargs) == {"epsilon": 1e-6, "cache_mode": "PA_BNSD", "is_output_kv": select == (0, 1, 2, 3)}
    assert call.outputs == select


def test_kv_index_is_distinct_slots_of_the_cache() -> None:
    row = kernel_row("KvRmsNormRopeCache", KV_PREFILL)
    args = KvRmsNormRopeCacheReplay().make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    index = args[4]
    assert index.numel() == 2048 and index.unique().numel() == 2048
    assert int(index.min()) >= 0 and int(index.max()) < 32 * 128


@pytest.mark.parametrize("row", [KV_DECODE, KV_PREFILL, KV_NO_OUTPUT], ids=["decode", "prefill", "caches_only"])
def test_kv_rows_match_the_float64_reference(row: dict[str, str]) -> None:
    outputs, _ = replay_on_cpu("KvRmsNormRopeCache", row)
    assert len(outputs) == (2 if row is KV_NO_OUTPUT else 4)


def test_kv_writes_exactly_the_indexed_slots() -> None:
    replay, row = KvRmsNormRopeCacheReplay(), kernel_row("KvRmsNormRopeCache", KV_DECODE)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(2))
    before = args[5].clone().view(-1, 64)
    k_cache, _, k_rope, _ = replay.run(*args)
    flat, index = k_cache.view(-1, 64), args[4]
    assert torch.equal(flat[index], k_rope.reshape(-1, 64))
    untouched = torch.ones(flat.shape[0], dtype=torch.bool)
    untouched[index] = False
    assert torch.equal(flat[untouched], before[untouched])


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (kv_row(64, 16, extra="64;512;64;512;", extra_types="FLOAT;FLOAT;FLOAT;FLOAT;DT_UNDEFINED"), "k_rope_scale"),
        (kv_row(64, 16, extra=";;;;64,1,1,128", extra_types="DT_UNDEFINED;DT_UNDEFINED;DT_UNDEFINED;DT_UNDEFINED;DT_BF16"), r"\(v\)"),
        (kv_row(64, 0), "cannot hold"),
        (cells("64,1,1,576;512;64,1,1,64;64,1,1,64;64,1;16,128,1,64;16,128,1,512", "DT_BF16;DT_BF16;DT_BF16;DT_BF16;INT64;DT_BF16;DT_BF16",
               "16,128,1,64;16,128,1,512;64,1,1,64;64,1,1,512", "DT_BF16;DT_BF16;DT_BF16;DT_BF16"), "Norm"),
        (cells("64,1,1,576;512;64,1,1,64;64,1,1,64;64;16,128,1,64;16,128,1,512", "DT_BF16;DT_BF16;DT_BF16;DT_BF16;INT64;INT8;INT8",
               "16,128,1,64;16,128,1,512;64,1,1,64;64,1,1,512", "INT8;INT8;DT_BF16;DT_BF16"), "quantised"),
        (cells("64,1,1,576;448;64,1,1,64;64,1,1,64;64;16,128,1,64;16,128,1,512", "DT_BF16;DT_BF16;DT_BF16;DT_BF16;INT64;DT_BF16;DT_BF16",
               "16,128,1,64;16,128,1,512;64,1,1,64;64,1,1,512", "DT_BF16;DT_BF16;DT_BF16;DT_BF16"), "cos/sin"),
        (cells("64,1,1,576;512;64,1,1,64;64,1,1,64;64;16,128,1,64;16,128,1,512", "DT_BF16;DT_BF16;DT_BF16;DT_BF16;INT64;DT_BF16;DT_BF16",
               "16,128,1,64;16,128,1,512;64,1,1,64", "DT_BF16;DT_BF16;DT_BF16"), "together"),
    ],
)  # fmt: skip
def test_kv_rows_it_cannot_reproduce_are_refused(row: dict[str, str], reason: str) -> None:
    with pytest.raises(CaseBuildError, match=reason):
        KvRmsNormRopeCacheReplay().check(kernel_row("KvRmsNormRopeCache", row))


# ----------------------------------------------------------------------------- split_qkv_rmsnorm_rope
@pytest.mark.parametrize("name", QKV)
def test_qkv_calls_the_vllm_operator_with_keywords_only(name: str) -> None:
    row = QKV[name]
    call = npu_call_of("split_qkv_rmsnorm_rope_kernel", row)
    assert call.api == op_mapping_api("split_qkv_rmsnorm_rope_kernel") == "torch.ops.vllm.qkv_rmsnorm_rope"
    tokens = 1024 if name == "prefill" else 64
    q, kv = (4096, 1024) if name == "prefill" else (1024, 256)
    assert call.args == ()
    assert shapes(dict(call.kwargs)) == {
        "input": (tokens, q + 2 * kv), "cos_sin_cache": (40960, 128), "positions": (tokens,),
        "q_weight": (128,), "k_weight": (128,), "q_hidden_size": q, "kv_hidden_size": kv, "head_dim": 128, "eps": 1e-6,
    }  # fmt: skip
    assert call.kwargs["positions"].dtype == torch.int64
    assert call.outputs == ((0, 1) if name == "profiled_two_in_two_out" else (0, 1, 2))


@pytest.mark.parametrize("name", QKV)
def test_qkv_rows_match_the_float64_reference(name: str) -> None:
    outputs, _ = replay_on_cpu("split_qkv_rmsnorm_rope_kernel", QKV[name])
    assert len(outputs) == (2 if name == "profiled_two_in_two_out" else 3)


def test_qkv_positions_index_the_cache_and_v_is_copied() -> None:
    replay, row = SplitQkvRmsNormRopeReplay(), kernel_row("split_qkv_rmsnorm_rope_kernel", QKV["decode_tp4"])
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(5))
    positions = args[2]
    assert int(positions.min()) >= 0 and int(positions.max()) < 40960
    _, _, v = replay.run(*args)
    assert torch.equal(v, args[0][:, 1280:])
    assert meta_outputs("split_qkv_rmsnorm_rope_kernel", QKV["prefill"])[0].shape == (1024, 4096)


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (cells("64,1600;40960,128;64", "DT_BF16;DT_BF16;INT64", "64,1024;64,256;64,256", "DT_BF16;DT_BF16;DT_BF16"), "input width"),
        (cells("64,1536;40960,96;64", "DT_BF16;DT_BF16;INT64", "64,1024;64,256;64,256", "DT_BF16;DT_BF16;DT_BF16"), "head_dim"),
        (cells("64,1536;40960,128;32", "DT_BF16;DT_BF16;INT64", "64,1024;64,256;64,256", "DT_BF16;DT_BF16;DT_BF16"), "positions"),
        (cells("64,1536;40960,128;64", "DT_BF16;DT_BF16;INT64", "64,1024", "DT_BF16"), "q;k"),
        (cells("64,1536;40960,128;64", "DT_BF16;DT_FLOAT16;INT64", "64,1024;64,256;64,256", "DT_BF16;DT_BF16;DT_BF16"), "one floating dtype"),
    ],
)  # fmt: skip
def test_qkv_rows_it_cannot_reproduce_are_refused(row: dict[str, str], reason: str) -> None:
    with pytest.raises(CaseBuildError, match=reason):
        SplitQkvRmsNormRopeReplay().check(kernel_row("split_qkv_rmsnorm_rope_kernel", row))


# ----------------------------------------------------------------------------- verification bites
class _WritesTheWrongSlots(KvRmsNormRopeCacheReplay):
    def run(self, *args: Any) -> tuple[torch.Tensor, ...]:
        kv, gamma, cos, sin, index, *rest = args
        return super().run(kv, gamma, cos, sin, index.flip(0), *rest)


class _SwapsTheNormWeights(SplitQkvRmsNormRopeReplay):
    def run(self, *args: Any) -> tuple[torch.Tensor, ...]:
        x, cache, positions, q_weight, k_weight, *rest = args
        return super().run(x, cache, positions, k_weight, q_weight, *rest)


@pytest.mark.parametrize(
    ("wrong", "kernel_type", "row", "slot"),
    [
        (_WritesTheWrongSlots, "KvRmsNormRopeCache", KV_DECODE, "output 0"),
        (_SwapsTheNormWeights, "split_qkv_rmsnorm_rope_kernel", QKV["decode_tp4"], "output 0"),
    ],
)
def test_a_wrong_run_fails_verification(wrong: type, kernel_type: str, row: dict[str, str], slot: str) -> None:
    replay = wrong()
    case = kernel_row(kernel_type, row)
    args = replay.make_inputs(case, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(VerificationError, match=slot):
        verify_outputs(replay, case, replay.run(*args), replay.reference(*args))
