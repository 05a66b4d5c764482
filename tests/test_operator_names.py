"""Kernel types of operators without a replay of their own keep a name ``torch.ops.aten`` knows:
a Python operator's (``aten::__and__``, the causal-and-padding mask of ``transformers``' MoE
models) keeps its underscores, an in-place operator's trailing ``_`` goes; ``torch.concat``
(PhiMoE's router) and ``torch.stack`` (ERNIE's rotary interleave) are the ``cat`` they call."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from perf_plugin.ingest.aten_mapping import does_work, sanitise_operator_name  # noqa: E402
from perf_plugin.trace.events import TraceOp  # noqa: E402
from perf_plugin.ingest.pipeline import ingest_path  # noqa: E402
from tests.kernels.support import replay_on_cpu  # noqa: E402


def test_names() -> None:
    assert sanitise_operator_name("aten::__and__") == "aten.__and__"
    assert sanitise_operator_name("aten::__or__") == "aten.__or__"
    assert sanitise_operator_name("aten::masked_fill_") == "aten.masked_fill"
    assert sanitise_operator_name("aten::add_") == "aten.add"
    assert sanitise_operator_name("vllm::rms_norm") == "vllm.rms_norm"
    assert sanitise_operator_name("::odd name_") == "odd_name"


def test_a_traced_mask_and_replays(tmp_path: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    causal = torch.ones(1, 1, 64, 64, dtype=torch.bool).tril()
    padding = torch.rand(1, 1, 64, 64) > 0.1
    scores = torch.randn(1, 1, 64, 64)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        mask = causal & padding
        either = causal | padding
        scores.clamp_(min=-1.0)
    trace = tmp_path / "mask.pt.trace.json"
    prof.export_chrome_trace(str(trace))
    rows = {row.kernel_type: row for row in ingest_path(trace, None).rows}
    assert {"aten.__and__", "aten.__or__", "aten.clamp"} <= set(rows)
    for kernel_type in ("aten.__and__", "aten.__or__"):
        outputs, _ = replay_on_cpu(kernel_type, dict(rows[kernel_type].cells))
        assert tuple(outputs.shape) == (1, 1, 64, 64) and outputs.dtype == torch.bool
    clamped, _ = replay_on_cpu("aten.clamp", dict(rows["aten.clamp"].cells))  # the in-place call, replayed
    assert tuple(clamped.shape) == (1, 1, 64, 64) and mask.shape == either.shape


def test_concat_and_stack_are_the_cat_they_call(tmp_path: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    a, b = torch.randn(512, 1), torch.randn(512, 1)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.concat([a, b], dim=-1)
        torch.concatenate([a, b], dim=0)
        torch.stack([a, b], dim=-1)  # a cat of the inputs unsqueezed
    trace = tmp_path / "concat.pt.trace.json"
    prof.export_chrome_trace(str(trace))
    rows = ingest_path(trace, None).rows
    assert sorted((row.kernel_type, row.cells["Input Shapes"], row.cells["Output Shapes"]) for row in rows) == [
        ("ConcatD", '"512,1,1;512,1,1"', '"512,1,2"'),
        ("ConcatD", '"512,1;512,1"', '"1024,1"'),
        ("ConcatD", '"512,1;512,1"', '"512,2"'),
    ]


@pytest.mark.parametrize("name", ["aten::empty_like", "aten::new_empty", "aten::new_empty_strided"])
def test_an_allocation_is_no_row(name: str) -> None:
    """Its output holds whatever the memory held: a CPU trace of the DeepSeek-V3-style model of
    ``benchmarks/model_coverage.py`` timed ``new_empty``, and its replay failed verification on
    the garbage (relative error inf)."""
    assert not does_work(TraceOp(name, (1, 1), 0, 10), [TraceOp("aten::empty", (1, 1), 1, 2)])
    assert does_work(TraceOp("aten::new_zeros", (1, 1), 0, 10), [TraceOp("aten::zero_", (1, 1), 1, 2)])
