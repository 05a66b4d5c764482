"""FlashAttentionScore / FlashAttentionScoreGrad: NPU calls, CPU numerics, rejections, trace ingest.

The real Level2 rows (S=4096, 16 query heads of 128, 8 KV heads, SBH, compressed causal mask)
hold 4096x4096 scores per head: too much for a float64 reference on this 2-core machine, so they
are checked for shapes on the meta device, and their numerics through reduced rows of the same
layout (S=256, same heads, GQA and mask).  Small rows written in the same slot layout cover the
other layouts and dtypes.  The CUDA tests run where a GPU is.
"""

from __future__ import annotations

import csv
import math
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.cache_modes import replicate_inputs
from perf_plugin.replay.kernels._flash_attention_math import Geometry, math_backward, math_forward
from perf_plugin.replay.kernels.flash_attention import FlashAttentionScoreGradReplay, FlashAttentionScoreReplay
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import (
    aten_ops_of_run,
    kernel_row,
    level2_rows,
    meta_outputs,
    npu_call_of,
    op_mapping_api,
    replay_of,
    replay_on_cpu,
    shapes,
)

FORWARD, GRAD = level2_rows("FlashAttentionScore"), level2_rows("FlashAttentionScoreGrad")
FWD_IN_TYPES = "{0};{0};{0};{0};UINT8;{0};BOOL;INT64;INT64;INT64;INT64;INT64;FLOAT;FLOAT;FLOAT"
GRAD_IN_TYPES = "{0};{0};{0};{0};BOOL;FLOAT;FLOAT;{0};{0};INT64;FLOAT;FLOAT;FLOAT;FLOAT;FLOAT"


def forward_cells(q: str, k: str, stats: str, dtype: str = "DT_BF16", mask: str = "", extra: str = ";;;;;;;;") -> dict[str, str]:
    """A forward row in the Level2 slot layout: q;k;v;pse;drop_mask;padding_mask;atten_mask;..."""
    return {
        "Input Shapes": f'"{q};{k};{k};;;;{mask}{extra}"',
        "Input Data Types": FWD_IN_TYPES.format(dtype),
        "Output Shapes": f'"{stats};{stats};;{q}"',
        "Output Data Types": f"FLOAT;FLOAT;{dtype};{dtype}",
    }


def grad_cells(q: str, k: str, stats: str, dtype: str = "DT_BF16", mask: str = "", outputs: str = "") -> dict[str, str]:
    """A gradient row in the Level2 slot layout: q;k;v;dy;atten_mask;softmax_max;softmax_sum;;attention_in."""
    return {
        "Input Shapes": f'"{q};{k};{k};{q};{mask};{stats};{stats};;{q};;;;;;"',
        "Input Data Types": GRAD_IN_TYPES.format(dtype),
        "Output Shapes": f'"{outputs or f"{q};{k};{k};;;"}"',
        "Output Data Types": ";".join([dtype] * 6),
    }


# The real rows with S 4096 -> 256: same layout, heads, GQA and compressed mask.
REDUCED_FORWARD = forward_cells("256,1,2048", "256,1,1024", "1,16,256,8", mask="2048,2048")
REDUCED_GRAD = grad_cells("256,1,2048", "256,1,1024", "1,16,256,8", mask="2048,2048")


def test_the_level2_profile_has_one_row_of_each() -> None:
    assert [r["Input Shapes"] for r in FORWARD] == ['"4096,1,2048;4096,1,1024;4096,1,1024;;;;2048,2048;;;;;;;;"']
    assert [r["Output Shapes"] for r in FORWARD] == ['"1,16,4096,8;1,16,4096,8;;4096,1,2048"']
    assert REDUCED_FORWARD["Input Data Types"] == FORWARD[0]["Input Data Types"]
    assert [r["Input Shapes"] for r in GRAD] == [
        '"4096,1,2048;4096,1,1024;4096,1,1024;4096,1,2048;2048,2048;1,16,4096,8;1,16,4096,8;;4096,1,2048;;;;;;"'
    ]
    assert REDUCED_GRAD["Input Data Types"] == GRAD[0]["Input Data Types"]


def test_the_forward_calls_npu_fusion_attention_with_head_num_layout_and_causal_sparse_mode() -> None:
    call = npu_call_of("FlashAttentionScore", FORWARD[0])
    assert op_mapping_api("FlashAttentionScore") is None and call.api == "torch_npu.npu_fusion_attention"
    assert shapes(call.args) == ((4096, 1, 2048), (4096, 1, 1024), (4096, 1, 1024), 16, "SBH")
    mask = call.kwargs["atten_mask"]
    assert mask.dtype == torch.bool and torch.equal(mask, torch.ones(2048, 2048, dtype=torch.bool).triu(1))
    assert {k: v for k, v in call.kwargs.items() if k != "atten_mask"} == {
        "scale": 1 / math.sqrt(128), "keep_prob": 1.0, "sparse_mode": 2,
    }  # fmt: skip
    assert call.outputs == (1, 2, 0)  # (attention_out, softmax_max, softmax_sum, ...) -> the row's order


def test_the_gradient_calls_npu_fusion_attention_grad_with_the_forward_outputs() -> None:
    call = npu_call_of("FlashAttentionScoreGrad", GRAD[0], device="meta")
    assert op_mapping_api("FlashAttentionScoreGrad") is None and call.api == "torch_npu.npu_fusion_attention_grad"
    assert shapes(call.args) == ((4096, 1, 2048), (4096, 1, 1024), (4096, 1, 1024), (4096, 1, 2048), 16, "SBH")
    assert shapes(call.kwargs) == {
        "atten_mask": (2048, 2048), "softmax_max": (1, 16, 4096, 8), "softmax_sum": (1, 16, 4096, 8),
        "attention_in": (4096, 1, 2048), "scale_value": 1 / math.sqrt(128), "keep_prob": 1.0, "sparse_mode": 2,
    }  # fmt: skip
    assert call.outputs == (0, 1, 2)  # (dq, dk, dv, dpse)


def test_the_real_rows_build_with_the_rows_output_shapes() -> None:
    softmax_max, softmax_sum, out = meta_outputs("FlashAttentionScore", FORWARD[0])
    assert shapes((softmax_max, softmax_sum, out)) == ((1, 16, 4096, 8), (1, 16, 4096, 8), (4096, 1, 2048))
    assert (softmax_max.dtype, out.dtype) == (torch.float32, torch.bfloat16)
    assert shapes(meta_outputs("FlashAttentionScoreGrad", GRAD[0])) == ((4096, 1, 2048), (4096, 1, 1024), (4096, 1, 1024))


def test_reduced_level2_rows_match_the_float64_reference() -> None:
    (lse, ones, _), (ref_lse, _, _) = replay_on_cpu("FlashAttentionScore", REDUCED_FORWARD)
    assert torch.equal(ones, torch.ones_like(ones)) and torch.equal(lse[..., 0], lse[..., 7])
    replay_on_cpu("FlashAttentionScoreGrad", REDUCED_GRAD, seed=1)


SMALL = [  # q, k, softmax_max: other layouts, GQA groups, Sq != Skv, dtypes
    ("64,2,128", "64,2,64", "2,4,64,8", "DT_BF16", ""),  # SBH, 2 query heads per KV head, no mask
    ("2,48,128", "2,80,32", "2,4,48,8", "FLOAT16", "2048,2048"),  # BSH, MQA, causal, Sq < Skv
    ("2,4,48,32", "2,2,48,32", "2,4,48,8", "FLOAT", "2048,2048"),  # BNSD
    ("1,40,4,64", "1,40,4,64", "1,4,40,8", "DT_BF16", ""),  # BSND
]


@pytest.mark.parametrize(("q", "k", "stats", "dtype", "mask"), SMALL, ids=[f"{s[0]}-{s[3]}" for s in SMALL])
def test_other_layouts_and_dtypes_match_the_reference(q: str, k: str, stats: str, dtype: str, mask: str) -> None:
    replay_on_cpu("FlashAttentionScore", forward_cells(q, k, stats, dtype, mask))
    replay_on_cpu("FlashAttentionScoreGrad", grad_cells(q, k, stats, dtype, mask))


def _geometry_of(kernel_type: str, cells: dict[str, str]) -> Geometry:
    args = replay_of(kernel_type).make_inputs(kernel_row(kernel_type, cells), torch.device("meta"), None)  # type: ignore[arg-type]
    return args[-1]  # type: ignore[no-any-return]


def test_the_layout_is_read_from_the_shapes() -> None:
    assert _geometry_of("FlashAttentionScore", REDUCED_FORWARD) == Geometry("SBH", 1, 16, 8, 256, 256, 128, True)
    assert _geometry_of("FlashAttentionScoreGrad", REDUCED_GRAD) == Geometry("SBH", 1, 16, 8, 256, 256, 128, True)
    bsh = forward_cells("2,48,128", "2,80,32", "2,4,48,8")
    assert _geometry_of("FlashAttentionScore", bsh) == Geometry("BSH", 2, 4, 1, 48, 80, 32, False)


def test_the_references_match_autograd_of_scaled_dot_product_attention() -> None:
    g = Geometry("BNSD", 2, 4, 2, 24, 24, 16, True)
    q = torch.randn(2, 4, 24, 16, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(2, 4, 24, 16, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 24, 16, dtype=torch.float64, requires_grad=True) for _ in range(2))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    out.backward(dy)
    assert q.grad is not None and k.grad is not None and v.grad is not None
    ours, peak, total = math_forward([q.detach(), k.detach(), v.detach()], g)
    first = (q[:, :, 0] * k[:, :, 0].repeat_interleave(2, 1)).sum(-1) / 4  # the first query sees only key 0
    assert torch.allclose(ours, out) and torch.allclose(peak[:, :, 0, 0], first)
    assert torch.allclose(total[:, :, 0], torch.ones(2, 4, 1, dtype=torch.float64))
    grads = math_backward([q.detach(), k.detach(), v.detach(), dy], g)
    assert all(torch.allclose(a, b) for a, b in zip(grads, (q.grad, k.grad, v.grad)))


def test_the_gradients_inputs_are_the_forwards_outputs_with_the_true_max_and_sum() -> None:
    row = kernel_row("FlashAttentionScoreGrad", REDUCED_GRAD)
    args = replay_of("FlashAttentionScoreGrad").make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    q, k, v, _, _, smax, ssum, attention_in, lse, _, g = args
    lse_fused, _, out = FlashAttentionScoreReplay().run(q, k, v, None, torch.ones(1, 16, 256, 8), False, g)
    assert torch.allclose(smax + ssum.log(), lse_fused, atol=1e-4)  # float32 sums in another order
    assert torch.allclose(lse, lse_fused[..., 0], atol=1e-4)
    assert (ssum >= 1).all() and torch.equal(ssum[:, :, 0], torch.ones_like(ssum[:, :, 0]))  # row 0 sees only key 0
    assert torch.allclose(attention_in.float(), out.float(), atol=2e-2)


def test_on_an_npu_the_softmax_outputs_are_checked_as_the_true_max_and_sum() -> None:
    """The NPU kernel writes the row max and sum of exp, not the (lse, 1) pair of the portable run."""
    replay, row = FlashAttentionScoreReplay(), kernel_row("FlashAttentionScore", REDUCED_FORWARD)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert args[-2] is False  # made for the CPU: the portable run's outputs are checked
    npu_args = (*args[:-2], True, args[-1])  # as make_inputs builds them on an NPU
    g = args[-1]
    out, peak, total = math_forward(g.views(*(t.float() for t in args[:3])), g)  # what the NPU kernel computes
    npu_outputs = (peak.expand(1, 16, 256, 8), total.expand(1, 16, 256, 8), g.from_bnsd(out).bfloat16())
    verify_outputs(replay, row, npu_outputs, replay.reference(*npu_args))
    with pytest.raises(VerificationError, match="output 0"):
        verify_outputs(replay, row, replay.run(*npu_args), replay.reference(*npu_args))


def test_run_launches_only_the_fused_attention_operator() -> None:
    views = {"aten.view", "aten.permute", "aten.transpose", "aten.unsqueeze", "aten.expand", "aten._unsafe_view"}
    forward = [op for op in aten_ops_of_run("FlashAttentionScore", REDUCED_FORWARD) if op not in views]
    assert forward == ["aten._scaled_dot_product_flash_attention_for_cpu"]
    grad = [op for op in aten_ops_of_run("FlashAttentionScoreGrad", REDUCED_GRAD) if op not in views]
    assert grad == ["aten._scaled_dot_product_flash_attention_for_cpu_backward"]


def _with(cells: dict[str, str], column: str, value: str) -> dict[str, str]:
    return {**cells, column: value}


SBH = ("64,2,128", "64,2,64", "2,4,64,8")  # q, k, softmax_max of a small SBH row
MIXED_DTYPES = FWD_IN_TYPES.format("FLOAT16").replace("FLOAT16;", "DT_BF16;", 1)


@pytest.mark.parametrize(
    ("kernel_type", "row", "reason"),
    [
        ("FlashAttentionScore", forward_cells(*SBH, mask="64,64"), r"atten_mask \(slot 6\) \[64,64\].*explicit"),
        ("FlashAttentionScore", _with(forward_cells(*SBH), "Input Shapes", '"64,2,128;64,2,64;64,2,64;;1024;;;;;;;;;;"'), r"drop_mask \(slot 4\)"),
        ("FlashAttentionScore", _with(forward_cells(*SBH), "Input Shapes", '"64,2,128;64,2,64;64,2,64;2,4,64,64;;;;;;;;;;;"'), r"pse \(slot 3\)"),
        # a 3-D query with actual_seq_qlen is read as TND: this SBH query's key does not fit it
        ("FlashAttentionScore", forward_cells(*SBH, extra=";;2;2;;;;;"), "does not fit query"),
        ("FlashAttentionScore", forward_cells("128,4,32", "128,2,32", "128,4,8"), "TND"),
        ("FlashAttentionScore", forward_cells("64,2,128", "64,2,48", "2,4,64,8"), "fit none of SBH"),
        ("FlashAttentionScore", _with(forward_cells(*SBH), "Input Data Types", MIXED_DTYPES), "one floating dtype"),
        ("FlashAttentionScoreGrad", _with(grad_cells(*SBH), "Input Shapes", '"64,2,128;64,2,64;64,2,64;64,2,128;;2,4,64,8;2,4,64,8;2,4,64,64;64,2,128;;;;;;"'), "softmax_in slot 7 empty"),
        ("FlashAttentionScoreGrad", grad_cells(*SBH, outputs="64,2,128;64,2,64;64,2,64;2,4,64,64;;"), "dpse"),
        ("FlashAttentionScoreGrad", grad_cells(*SBH, mask="1,1,64,64"), "explicit mask"),
    ],
)  # fmt: skip
def test_rows_it_cannot_reproduce_are_refused(kernel_type: str, row: dict[str, str], reason: str) -> None:
    with pytest.raises(CaseBuildError, match=reason):
        replay_of(kernel_type).check(kernel_row(kernel_type, row))


class _NotCausal(FlashAttentionScoreReplay):
    def run(self, *args: Any) -> tuple[torch.Tensor, ...]:
        return super().run(*args[:-1], dataclasses.replace(args[-1], causal=False))


class _SwapsDkAndDv(FlashAttentionScoreGradReplay):
    def run(self, *args: Any) -> tuple[torch.Tensor, ...]:
        dq, dk, dv = super().run(*args)
        return dq, dv, dk


@pytest.mark.parametrize(("replay", "cells"), [(_NotCausal(), REDUCED_FORWARD), (_SwapsDkAndDv(), REDUCED_GRAD)])
def test_a_wrong_run_fails_verification(replay: Any, cells: dict[str, str]) -> None:
    row = kernel_row(replay.kernel_types[0], cells)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(VerificationError, match="relative error"):
        verify_outputs(replay, row, replay.run(*args), replay.reference(*args))


def _sdpa_trace(path: Path) -> Path:
    from torch.profiler import ProfilerActivity, profile

    q = torch.randn(2, 4, 64, 32, dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(2, 2, 64, 32, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(2):  # causal GQA forward and backward, as a training step runs them
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum().backward()
        with torch.no_grad():
            torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # no mask
            mask = torch.ones(64, 64, dtype=torch.bool).tril()  # an explicit mask: not this kernel's row
            torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), mask)
    prof.export_chrome_trace(str(path))
    return path


def test_a_row_without_stats_replays_through_the_sdpa_dispatcher() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    cells = forward_cells("2,4,64,32", "2,2,64,32", "2,4,64,8", mask="2048,2048")
    cells["Output Shapes"] = '";;;2,4,64,32"'
    replay, row = replay_of("FlashAttentionScore"), kernel_row("FlashAttentionScore", cells)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    seen: list[str] = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.append(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    with Recorder():
        replay.run(*args)
    assert "aten._scaled_dot_product_flash_attention_for_cpu" in seen  # the backend SDPA picks here
    replay_on_cpu("FlashAttentionScore", cells)
    assert replay.npu_call(row, args).outputs == (0,)  # attention_out alone on an NPU too


def test_a_cpu_trace_of_sdpa_becomes_flash_attention_rows_that_replay(tmp_path: Path) -> None:
    ingest_path(_sdpa_trace(tmp_path / "trace.json"), tmp_path / "db")
    forward = {r["Input Shapes"]: r for r in csv.DictReader((tmp_path / "db" / "FlashAttentionScore.csv").open())}
    assert set(forward) == {'"2,4,64,32;2,2,64,32;2,2,64,32;;;;2048,2048;;;;;;;;"', '"2,4,64,32;2,2,64,32;2,2,64,32;;;;;;;;;;;;"'}
    for row in forward.values():
        assert row["Input Data Types"] == FORWARD[0]["Input Data Types"] and row["Output Data Types"] == FORWARD[0]["Output Data Types"]
        # SDPA returns attention_out alone: the stats slots stay empty, their dtypes as the kernel's
        assert row["Output Shapes"] == '";;;2,4,64,32"'
        outputs, _ = replay_on_cpu("FlashAttentionScore", row)
        assert tuple(outputs.shape) == (2, 4, 64, 32)
    (grad,) = csv.DictReader((tmp_path / "db" / "FlashAttentionScoreGrad.csv").open())
    assert grad["Input Shapes"] == '"2,4,64,32;2,2,64,32;2,2,64,32;2,4,64,32;2048,2048;2,4,64,8;2,4,64,8;;2,4,64,32;;;;;;"'
    assert (grad["Input Data Types"], grad["Output Data Types"]) == (GRAD[0]["Input Data Types"], GRAD[0]["Output Data Types"])
    assert grad["Output Shapes"] == '"2,4,64,32;2,2,64,32;2,2,64,32;;;"'
    replay_on_cpu("FlashAttentionScoreGrad", grad)
    masked = list(csv.DictReader((tmp_path / "db" / "aten.scaled_dot_product_attention.csv").open()))
    assert [r["Input Shapes"] for r in masked] == ['"2,4,64,32;2,4,64,32;2,4,64,32;64,64"']


# ----------------------------------------------------------------------------- CUDA (where a GPU is)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _on_cuda(kernel_type: str, cells: dict[str, str], copies: int = 1) -> None:
    replay, row = replay_of(kernel_type), kernel_row(kernel_type, cells)
    args = replay.make_inputs(row, torch.device("cuda"), torch.Generator("cuda").manual_seed(0))
    for inputs in replicate_inputs(args, copies):  # the rotate cache mode runs on copies
        verify_outputs(replay, row, replay.run(*inputs), replay.reference(*args))


@cuda
@pytest.mark.parametrize("kernel_type", ["FlashAttentionScore", "FlashAttentionScoreGrad"])
def test_the_real_rows_on_cuda_match_the_reference(kernel_type: str) -> None:
    _on_cuda(kernel_type, level2_rows(kernel_type)[0], copies=2)


@cuda
@pytest.mark.parametrize(("q", "k", "stats", "dtype", "mask"), SMALL, ids=[f"{s[0]}-{s[3]}" for s in SMALL])
def test_other_layouts_on_cuda(q: str, k: str, stats: str, dtype: str, mask: str) -> None:
    _on_cuda("FlashAttentionScore", forward_cells(q, k, stats, dtype, mask))
    _on_cuda("FlashAttentionScoreGrad", grad_cells(q, k, stats, dtype, mask), copies=2)


@cuda
def test_a_cuda_trace_of_sdpa_becomes_rows_that_replay(tmp_path: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    q = torch.randn(1, 16, 512, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k, v = (torch.randn(1, 8, 512, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True) for _ in range(2))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum().backward()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    ingest_path(tmp_path / "trace.json", tmp_path / "db")
    (forward,) = csv.DictReader((tmp_path / "db" / "FlashAttentionScore.csv").open())
    (grad,) = csv.DictReader((tmp_path / "db" / "FlashAttentionScoreGrad.csv").open())  # whichever backward kernel ran
    assert forward["Input Shapes"] == '"1,16,512,128;1,8,512,128;1,8,512,128;;;;2048,2048;;;;;;;;"'
    assert forward["Output Shapes"] == '";;;1,16,512,128"'
    assert grad["Output Shapes"] == '"1,16,512,128;1,8,512,128;1,8,512,128;;;"'
    _on_cuda("FlashAttentionScore", forward)
    _on_cuda("FlashAttentionScoreGrad", grad)
