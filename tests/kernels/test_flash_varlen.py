"""FlashAttentionScore in the TND layout: packed requests of unequal lengths, replayed with the lengths the row records.

Rows are written in the real Level2 slot layout (``tests/kernels/test_flash_attention.py``) with a
3-D query and ``actual_seq_qlen`` / ``actual_seq_kvlen`` ``[B]`` in slots 8 and 9, their values in
``Input Values``.  Traces come from the real ``torch_attn::_varlen_attn`` operator (what
``torch.nn.attention.varlen.varlen_attn`` calls) under the real profiler and capture; on the CPU,
where PyTorch has no kernel for it, a CPU kernel is registered for the test's duration.  The CUDA
tests run where a GPU is, on the kernel ``varlen_attn`` runs there.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from perf_plugin.capture import capture_input_values
from perf_plugin.database.schema import INPUT_VALUES, INPUT_VALUES_SOURCE
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.ingest.value_sources import source_of
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels._flash_varlen import EVEN_LENGTHS, VarlenPlan, varlen_plan, varlen_reference
from perf_plugin.replay.kernels.flash_attention import FlashAttentionScoreReplay
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import kernel_row, level2_rows, npu_call_of, replay_on_cpu
from tests.kernels.test_flash_attention import FWD_IN_TYPES


def tnd_cells(q: str, k: str, batch: int, values: str = "", dtype: str = "DT_BF16", causal: bool = True,
              stats: str = "") -> dict[str, str]:
    """A TND forward row: q;k;v;pse;drop_mask;padding_mask;atten_mask;prefix;actual_seq_qlen;actual_seq_kvlen;..."""
    mask = "2048,2048" if causal else ""
    cells = {
        "Input Shapes": f'"{q};{k};{k};;;;{mask};;{batch};{batch};;;;;"',
        "Input Data Types": FWD_IN_TYPES.format(dtype),
        "Output Shapes": f'"{stats};{stats};;{q}"',
        "Output Data Types": f"FLOAT;FLOAT;{dtype};{dtype}",
    }
    if values:
        cells[INPUT_VALUES] = values
    return cells


# A chunked prefill: three requests whose new tokens (10, 30, 56) follow 20, 20 and 24 cached ones.
CHUNKED = tnd_cells("96,8,64", "160,2,64", 3, '";;;;;;;;10,40,96;30,80,160"')
# A packed prefill of four requests, 4 to 100 tokens: the shapes of four even ones.
PACKED = tnd_cells("160,4,32", "160,4,32", 4, '";;;;;;;;4,20,60,160;4,20,60,160"', dtype="FLOAT16")


def test_a_chunked_prefill_replays_its_recorded_lengths_on_the_cpu() -> None:
    plan = varlen_plan(kernel_row("FlashAttentionScore", CHUNKED))
    assert (plan.q_lens, plan.kv_lens, plan.measured, plan.causal) == ((10, 30, 56), (30, 50, 80), True, True)
    assert (plan.heads, plan.kv_heads, plan.head_dim) == (8, 2, 64)
    out, _ = replay_on_cpu("FlashAttentionScore", CHUNKED)
    assert tuple(out.shape) == (96, 8, 64)
    replay_on_cpu("FlashAttentionScore", PACKED)


def test_without_recorded_lengths_the_tokens_are_split_evenly() -> None:
    plan = varlen_plan(kernel_row("FlashAttentionScore", tnd_cells("100,8,64", "100,2,64", 3)))
    assert (plan.q_lens, plan.kv_lens, plan.measured) == ((34, 33, 33), (34, 33, 33), False)
    assert source_of("FlashAttentionScore", "", tnd_cells("100,8,64", "100,2,64", 3)["Input Shapes"]) == \
        f"default: {EVEN_LENGTHS}"
    assert source_of("FlashAttentionScore", CHUNKED[INPUT_VALUES], CHUNKED["Input Shapes"]) == "measured"


def test_rows_of_a_layout_without_lengths_say_nothing_of_their_values() -> None:
    """The real Level2 row (SBH) has no actual_seq_qlen: no ``Input Values Source`` is written for it."""
    (row,) = level2_rows("FlashAttentionScore")
    assert source_of("FlashAttentionScore", "", row["Input Shapes"]) is None


def test_the_lengths_set_the_output_a_replay_of_even_lengths_fails_verification() -> None:
    replay, row = FlashAttentionScoreReplay(), kernel_row("FlashAttentionScore", CHUNKED)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    even = dataclasses.replace(args[6], q_lens=(32, 32, 32), kv_lens=(54, 53, 53))
    with pytest.raises(VerificationError, match="relative error"):
        verify_outputs(replay, row, replay.run(*args[:6], even, args[7]), replay.reference(*args))


def test_softmax_outputs_are_the_lse_pair_off_the_npu_and_the_true_pair_on_it() -> None:
    cells = tnd_cells("96,4,32", "96,4,32", 3, '";;;;;;;;16,48,96;16,48,96"', dtype="FLOAT16", stats="96,4,8")
    (lse, ones, out), _ = replay_on_cpu("FlashAttentionScore", cells)
    assert tuple(lse.shape) == (96, 4, 8) and torch.equal(ones, torch.ones_like(ones))
    replay, row = FlashAttentionScoreReplay(), kernel_row("FlashAttentionScore", cells)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    npu_args = (*args[:5], True, *args[6:])  # as make_inputs builds them on an NPU
    out64, peak, total = varlen_reference(*args[:3], args[6])  # what the NPU kernel computes
    npu_outputs = (peak.unsqueeze(-1).expand(96, 4, 8).float(), total.unsqueeze(-1).expand(96, 4, 8).float(), out64.half())
    verify_outputs(replay, row, npu_outputs, replay.reference(*npu_args))
    with pytest.raises(VerificationError, match="output 0"):
        verify_outputs(replay, row, replay.run(*npu_args), replay.reference(*npu_args))


def test_the_npu_call_passes_the_layout_the_cumulative_lengths_and_right_down_causal() -> None:
    call = npu_call_of("FlashAttentionScore", CHUNKED)
    assert call.api == "torch_npu.npu_fusion_attention" and call.args[3:] == (8, "TND")
    assert call.kwargs["actual_seq_qlen"] == [10, 40, 96] and call.kwargs["actual_seq_kvlen"] == [30, 80, 160]
    assert call.kwargs["sparse_mode"] == 3 and tuple(call.kwargs["atten_mask"].shape) == (2048, 2048)
    assert call.outputs == (0,)  # attention_out alone: the row records no softmax outputs
    assert npu_call_of("FlashAttentionScore", tnd_cells("96,8,64", "96,2,64", 3, causal=False)).kwargs["sparse_mode"] == 0


@pytest.mark.parametrize(
    ("cells", "reason"),
    [
        (tnd_cells("96,8,64", "96,2,64", 3, '";;;;;;;;10,40,90;10,40,96"'), r"not cumulative up to 96"),
        (tnd_cells("96,8,64", "96,2,64", 3, '";;;;;;;;40,96;40,96"'), r"holds 2 query ends for a \[3\]"),
        (tnd_cells("96,8,64", "96,2,64", 3, '";;;;;;;;10,60,96;20,40,96"'), r"request 1 has 50 query and 20 KV"),
        (tnd_cells("96,8,64", "96,2,48", 3), "does not fit query"),
        (tnd_cells("96,8,64", "96,2,64", 3, stats="3,8,96,8"), r"softmax_max \[3,8,96,8\].*\[96,8,8\]"),
        ({**tnd_cells("96,8,64", "96,2,64", 3), "Input Shapes": '"96,8,64;96,2,64;96,2,64;;;;;;3;;;;;;"'},
         r"actual_seq_qlen and actual_seq_kvlen \[B\]"),
        ({**tnd_cells("96,8,64", "96,2,64", 3), "Input Shapes": '"96,8,64;96,2,64;96,2,64;8,96,96;;;;;3;3;;;;;"'},
         r"pse \(slot 3\)"),
    ],
)  # fmt: skip
def test_rows_it_cannot_replay_are_refused_with_the_reason(cells: dict[str, str], reason: str) -> None:
    with pytest.raises(CaseBuildError, match=reason):
        FlashAttentionScoreReplay().check(kernel_row("FlashAttentionScore", cells))


# ----------------------------------------------------------------------------- traces of the real operator
def _cpu_varlen(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seq_q: torch.Tensor,
                cu_seq_k: torch.Tensor, max_q: int, max_k: int, is_causal: bool = False, *_: Any,
                **__: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A CPU kernel for ``torch_attn::_varlen_attn``: SDPA per request (causal: queries and keys
    of a request equal in number here), its (out, lse [N, T], rng state)."""
    outs = []
    for i in range(cu_seq_q.numel() - 1):
        (q0, q1), (k0, k1) = cu_seq_q[i:i + 2].tolist(), cu_seq_k[i:i + 2].tolist()
        q, k, v = (t.transpose(0, 1) for t in (query[q0:q1], key[k0:k1], value[k0:k1]))
        outs.append(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True))
    out = torch.cat([o.transpose(0, 1) for o in outs])
    return out, torch.zeros(query.shape[1], query.shape[0]), torch.zeros(2, dtype=torch.uint64)


@pytest.fixture
def varlen_on_cpu() -> Iterator[Any]:
    """``torch.ops.torch_attn._varlen_attn`` with a CPU kernel for the test's duration."""
    import torch.nn.attention.varlen  # noqa: F401  (registers torch_attn::_varlen_attn)

    with torch.library._scoped_library("torch_attn", "IMPL") as library:
        library.impl("_varlen_attn", _cpu_varlen, "CPU")
        yield torch.ops.torch_attn._varlen_attn


def _profile(path: Path, calls: Any, capture: bool = True) -> Path:
    from contextlib import nullcontext

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        with capture_input_values(path.with_name(path.stem + ".values.json")) if capture else nullcontext():
            calls()
    prof.export_chrome_trace(str(path))
    return path


def _rows(db: Path, kernel_type: str = "FlashAttentionScore") -> list[dict[str, str]]:
    with (db / f"{kernel_type}.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_a_varlen_call_becomes_a_tnd_row_with_its_lengths_and_replays_them(tmp_path: Path, varlen_on_cpu: Any) -> None:
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(96, 8, 64, generator=generator).bfloat16()
    k, v = (torch.randn(96, 2, 64, generator=generator).bfloat16() for _ in range(2))
    skewed, even = torch.tensor([0, 10, 40, 96], dtype=torch.int32), torch.tensor([0, 32, 64, 96], dtype=torch.int32)

    def calls() -> None:
        # causal as torch 2.13's varlen_attn passes it (is_causal and the window (-1, 0)), then not causal
        # (the ten arguments every release's schema has; torch 2.13 adds enable_gqa, seqused_k ...)
        varlen_on_cpu(q, k, v, skewed, skewed, 56, 56, True, None, [-1, 0])
        varlen_on_cpu(q, k, v, even, even, 32, 32, False, None, [-1, -1])

    ingest_path(_profile(tmp_path / "trace.json", calls), tmp_path / "db")
    rows = {r[INPUT_VALUES]: r for r in _rows(tmp_path / "db")}
    assert set(rows) == {'";;;;;;;;10,40,96;10,40,96"', '";;;;;;;;32,64,96;32,64,96"'}
    causal, plain = rows['";;;;;;;;10,40,96;10,40,96"'], rows['";;;;;;;;32,64,96;32,64,96"']
    assert causal["Input Shapes"] == '"96,8,64;96,2,64;96,2,64;;;;2048,2048;;3;3;;;;;"'
    assert plain["Input Shapes"] == '"96,8,64;96,2,64;96,2,64;;;;;;3;3;;;;;"'
    assert causal["Output Shapes"] == '";;;96,8,64"' and causal[INPUT_VALUES_SOURCE] == "measured"
    plan = varlen_plan(kernel_row("FlashAttentionScore", causal))
    assert (plan.q_lens, plan.causal, plan.measured) == ((10, 30, 56), True, True)
    for row in rows.values():
        replay_on_cpu("FlashAttentionScore", row)


def test_without_the_capture_the_row_says_it_replays_even_lengths(tmp_path: Path, varlen_on_cpu: Any) -> None:
    q = torch.randn(64, 4, 32).bfloat16()
    cu = torch.tensor([0, 8, 64], dtype=torch.int32)
    trace = _profile(tmp_path / "trace.json", lambda: varlen_on_cpu(q, q, q, cu, cu, 56, 56, True), capture=False)
    result = ingest_path(trace, tmp_path / "db")
    (row,) = _rows(tmp_path / "db")
    assert not row.get(INPUT_VALUES) and row[INPUT_VALUES_SOURCE] == f"default: {EVEN_LENGTHS}"
    assert f"FlashAttentionScore: 1 row(s) replay {EVEN_LENGTHS}" in "\n".join(result.lines())


def test_paged_varlen_calls_keep_their_operators_row(tmp_path: Path, varlen_on_cpu: Any) -> None:
    """A block table makes it another kernel (paged KV): not a TND FlashAttentionScore row."""
    if "block_table" not in str(varlen_on_cpu.default._schema):
        pytest.skip("this torch's varlen attention takes no block table")
    q = torch.randn(16, 4, 32).bfloat16()
    cache = torch.randn(4, 16, 4, 32).bfloat16()
    cu, table, used = (torch.tensor(v, dtype=torch.int32) for v in ([0, 8, 16], [[0, 1], [2, 3]], [20, 30]))

    def paged_call() -> None:
        try:
            varlen_on_cpu(q, cache, cache, cu, None, 8, 32, True, None, [-1, 0], False, used, table, None)
        except Exception:  # the test's CPU kernel does not page; the trace holds the call either way
            pass

    ingest_path(_profile(tmp_path / "trace.json", paged_call), tmp_path / "db")
    assert not (tmp_path / "db" / "FlashAttentionScore.csv").exists()
    (row,) = _rows(tmp_path / "db", "torch_attn._varlen_attn")
    assert row["Input Shapes"].startswith('"16,4,32;4,16,4,32;4,16,4,32;3;')


# ----------------------------------------------------------------------------- CUDA (where a GPU is)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _on_cuda(cells: dict[str, str]) -> tuple[Any, VarlenPlan]:
    replay, row = FlashAttentionScoreReplay(), kernel_row("FlashAttentionScore", cells)
    args = replay.make_inputs(row, torch.device("cuda"), torch.Generator("cuda").manual_seed(0))
    outputs = replay.run(*args)
    verify_outputs(replay, row, outputs, replay.reference(*args))
    return outputs, args[6]


@cuda
def test_on_cuda_the_rows_run_the_varlen_flash_kernel() -> None:
    from torch.profiler import ProfilerActivity, profile

    replay, row = FlashAttentionScoreReplay(), kernel_row("FlashAttentionScore", CHUNKED)
    args = replay.make_inputs(row, torch.device("cuda"), torch.Generator("cuda").manual_seed(0))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        replay.run(*args)
        torch.cuda.synchronize()
    operators = [(e.name, e.input_shapes) for e in prof.events() if e.name == "aten::_flash_attention_forward"]
    assert operators and operators[0][1][3] == [4]  # the cumulative offsets [0, 10, 40, 96]
    kernels = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    assert len(kernels) == 1 and "flash" in kernels[0].lower(), kernels  # one launch: the varlen kernel
    _on_cuda(CHUNKED)
    _on_cuda(PACKED)
    (lse, ones, _), _ = _on_cuda(tnd_cells("96,4,32", "96,4,32", 3, '";;;;;;;;16,48,96;16,48,96"', dtype="FLOAT16",
                                           stats="96,4,8"))
    assert tuple(lse.shape) == (96, 4, 8)


@cuda
def test_a_cuda_trace_of_varlen_attn_becomes_a_row_with_its_lengths(tmp_path: Path) -> None:
    import inspect

    from torch.nn.attention.varlen import varlen_attn
    from torch.profiler import ProfilerActivity, profile

    q = torch.randn(384, 8, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(384, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cu = torch.tensor([0, 32, 96, 384], dtype=torch.int32, device="cuda")
    parameters = inspect.signature(varlen_attn).parameters  # the releases spell causal and GQA differently
    causal = {"is_causal": True} if "is_causal" in parameters else {"window_size": (-1, 0)}
    if "enable_gqa" in parameters:
        causal["enable_gqa"] = True
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        with capture_input_values(tmp_path / "trace.values.json"):
            varlen_attn(q, k, v, cu, cu, 288, 288, **causal)
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    ingest_path(tmp_path / "trace.json", tmp_path / "db")
    (row,) = _rows(tmp_path / "db")
    assert row[INPUT_VALUES] == '";;;;;;;;32,96,384;32,96,384"'
    assert row["Input Shapes"] == '"384,8,64;384,2,64;384,2,64;;;;2048,2048;;3;3;;;;;"'
    _on_cuda(row)
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert any(e.get("name") == "torch_attn::_varlen_attn" for e in events)


def test_the_reference_in_chunks_of_queries_equals_it_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefill's references are taken a few query rows at a time: the chunks agree with one pass."""
    import perf_plugin.replay.kernels._flash_varlen as varlen

    replay, row = FlashAttentionScoreReplay(), kernel_row("FlashAttentionScore", CHUNKED)
    q, k, v = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))[:3]
    plan = varlen_plan(row)
    whole = varlen_reference(q, k, v, plan)
    monkeypatch.setattr(varlen, "_SCORES_CHUNK", 8 * 80 * 3)  # 3 query rows of the longest request per step
    chunked = varlen_reference(q, k, v, plan)
    for a, b in zip(whole, chunked):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)
