"""EmbeddingDenseGradV2 and ApplyAdamWV2: the real Level2 rows, the API that launches each on an NPU
(``torch.ops.aten.embedding_dense_backward`` on the unsorted ids; ``torch._fused_adamw_``, which is
also ``run``), float64 references, rows they cannot build, and a CPU torch.profiler trace ingested
into an EmbeddingDenseGradV2 row.

The 78M-element ApplyAdamWV2 row (1.2 GB of state) is checked with ``meta_outputs``; its layout's
numerics are the other six real rows, which run in full.  The real EmbeddingDenseGradV2 row is
checked with ``meta_outputs`` and its numerics with the same row at a smaller vocabulary (see the
test: verifying its 155M output elements costs 7 s of CPU time).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.training import (
    ADAMW,
    ADAMW_STEP,
    PADDING_IDX,
    ApplyAdamWV2Replay,
    EmbeddingDenseGradV2Replay,
)
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

(EMBEDDING,) = level2_rows("EmbeddingDenseGradV2")
ADAM = level2_rows("ApplyAdamWV2")
LARGE_ADAM = '"77791232;77791232;77791232;77791232;1"'


def cells(shapes: str, dtypes: str, out_shapes: str, out_dtypes: str) -> dict[str, str]:
    return {
        "Input Shapes": shapes, "Input Data Types": dtypes, "Input Formats": "ND",
        "Output Shapes": out_shapes, "Output Data Types": out_dtypes, "Output Formats": "ND",
    }  # fmt: skip


# ----------------------------------------------------------------------------- EmbeddingDenseGradV2
def test_embedding_backward_calls_aten_with_the_unsorted_ids_and_num_weights() -> None:
    assert op_mapping_api("EmbeddingDenseGradV2") is None
    call = npu_call_of("EmbeddingDenseGradV2", EMBEDDING)
    assert call.api == "torch.ops.aten.embedding_dense_backward" and call.outputs is None
    grad, indices, num_weights, padding_idx, scale = call.args
    assert (tuple(grad.shape), tuple(indices.shape), indices.dtype) == ((1, 4096, 1024), (1, 4096), torch.int32)
    assert (num_weights, padding_idx, scale) == (151936, PADDING_IDX, False) and not call.kwargs


def test_the_kernel_inputs_are_the_sorted_ids_and_their_positions() -> None:
    replay = replay_of("EmbeddingDenseGradV2")
    row = kernel_row("EmbeddingDenseGradV2", EMBEDDING)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    grad, ids, pos, num_weights, indices = args
    assert shapes((ids, pos)) == ((4096,), (4096,)) and ids.dtype == pos.dtype == torch.int32
    assert bool((ids[1:] >= ids[:-1]).all())  # ascending, as aclnn's Sort hands them over
    assert torch.equal(indices.reshape(-1)[pos.long()], ids)  # pos_idx: where each sorted id came from
    assert 0 <= int(ids.min()) and int(ids.max()) < num_weights == 151936


def test_the_real_embedding_row_builds_its_output() -> None:
    out = meta_outputs("EmbeddingDenseGradV2", EMBEDDING)
    assert (tuple(out.shape), out.dtype) == ((151936, 1024), torch.float32)


def test_the_embedding_layout_replays_and_verifies_on_the_cpu() -> None:
    # The real row with a vocabulary of 8192 instead of 151936: the same 4096 tokens of 1024
    # values (more of them share a row), and an output 19x smaller.  The real row runs the same
    # way on the CPU (1 s) but the harness's float64 comparison of its 155M output elements
    # takes 7 s of CPU time.
    reduced = dict(EMBEDDING, **{"Output Shapes": '"8192,1024"'})
    out, ref = replay_on_cpu("EmbeddingDenseGradV2", reduced)
    assert out.shape == (8192, 1024) and out.dtype == torch.float32
    touched = int((ref.abs().sum(1) > 0).sum())
    assert 2500 < touched < 4096  # ids collide: some rows accumulate several tokens


@pytest.mark.parametrize(
    ("shapes", "dtypes", "out", "message"),
    [
        ('"1,4096,1024;4096"', "FLOAT;INT32", '"151936,1024"', "needs input slots grad;sort_indices;pos_idx"),
        ('"1,4096,1024;4096;2048"', "FLOAT;INT32;INT32", '"151936,1024"', r"pos_idx \[2048\] INT32 should be \[4096\]"),
        ('"1,4096,1024;4096;4096"', "FLOAT;FLOAT;INT32", '"151936,1024"', "sort_indices .* FLOAT should be"),
        ('"1,4096,1024;4096;4096"', "FLOAT;INT32;INT32", '"151936,512"', r"should be \[num_weights,1024\]"),
    ],
)
def test_embedding_rows_it_cannot_build_name_the_slot(shapes: str, dtypes: str, out: str, message: str) -> None:
    row = kernel_row("EmbeddingDenseGradV2", cells(shapes, dtypes, out, "FLOAT"))
    with pytest.raises(CaseBuildError, match=message):
        replay_of("EmbeddingDenseGradV2").check(row)


class IgnoresPositions(EmbeddingDenseGradV2Replay):
    """Adds the gradient rows in sorted order without mapping them back to their tokens."""

    def run(
        self, grad: torch.Tensor, ids: torch.Tensor, pos: torch.Tensor, num_weights: int, indices: torch.Tensor
    ) -> torch.Tensor:
        rows = grad.reshape(-1, grad.shape[-1])
        return rows.new_zeros((num_weights, rows.shape[1])).index_add_(0, ids, rows)


def test_embedding_verification_bites_when_positions_are_ignored() -> None:
    wrong = IgnoresPositions()
    row = kernel_row("EmbeddingDenseGradV2", cells('"2,64,16;128;128"', "FLOAT;INT32;INT32", '"300,16"', "FLOAT"))
    args = wrong.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    replay_on_cpu("EmbeddingDenseGradV2", cells('"2,64,16;128;128"', "FLOAT;INT32;INT32", '"300,16"', "FLOAT"))
    with pytest.raises(VerificationError, match="relative error"):
        verify_outputs(wrong, row, wrong.run(*args), wrong.reference(*args))


def test_a_cpu_trace_of_embedding_backward_becomes_the_real_layout(tmp_path: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    from perf_plugin.ingest.pipeline import ingest_path

    table = torch.nn.Embedding(500, 32)
    tokens = torch.randint(0, 500, (1, 64))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(2):
            table(tokens).sum().backward()
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    ingest_path(trace, tmp_path / "db")
    (row,) = list(csv.DictReader((tmp_path / "db" / "EmbeddingDenseGradV2.csv").open()))
    assert (row["Input Shapes"], row["Input Data Types"]) == ('"1,64,32;64;64"', "FLOAT;INT32;INT32")
    assert (row["Output Shapes"], row["Output Data Types"]) == ('"500,32"', "FLOAT")
    replay_on_cpu("EmbeddingDenseGradV2", row)


# ----------------------------------------------------------------------------- ApplyAdamWV2
def test_adamw_is_the_fused_adamw_call_on_var_m_v_grad_step() -> None:
    replay = replay_of("ApplyAdamWV2")
    small = ADAM[-1]
    assert op_mapping_api("ApplyAdamWV2") is None and replay.npu_api == "torch._fused_adamw_"
    row = kernel_row("ApplyAdamWV2", small)
    var, m, v, grad, step, initial = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert shapes((var, m, v, grad, step)) == ((128,), (128,), (128,), (128,), (1,))
    assert step.dtype == torch.int64 and int(step) == ADAMW_STEP and bool((v >= 0).all())
    assert replay.npu_call(row, ()) is None and aten_ops_of_run("ApplyAdamWV2", small) == ["aten._fused_adamw_"]
    assert (ADAMW.lr, ADAMW.beta1, ADAMW.beta2, ADAMW.eps, ADAMW.weight_decay) == (1e-3, 0.9, 0.999, 1e-8, 1e-2)
    assert [tuple(s.shape or ()) for s in replay.expected_outputs(row)] == [(128,)] * 3  # var, m, v; profile: N/A


@pytest.mark.parametrize("row", [c for c in ADAM if c["Input Shapes"] != LARGE_ADAM], ids=lambda c: c["Input Shapes"])
def test_real_adamw_rows_update_in_place_and_match_float64(row: dict[str, str]) -> None:
    (var, m, v), (ref_var, _, _) = replay_on_cpu("ApplyAdamWV2", row)
    assert var.dtype == torch.float32 and ref_var.dtype == torch.float32


def test_the_largest_adamw_row_builds_its_three_outputs() -> None:
    (row,) = [c for c in ADAM if c["Input Shapes"] == LARGE_ADAM]
    assert shapes(meta_outputs("ApplyAdamWV2", row)) == ((77791232,),) * 3


def test_the_update_moves_var_m_and_v() -> None:
    replay = replay_of("ApplyAdamWV2")
    row = kernel_row("ApplyAdamWV2", ADAM[-1])
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    before = [t.clone() for t in args[:3]]
    after = replay.run(*args)
    assert all(a is b for a, b in zip(after, args[:3]))  # in place
    assert all(not torch.equal(a, b) for a, b in zip(after, before))


@pytest.mark.parametrize(
    ("shapes", "dtypes", "message"),
    [
        ('"128;128;128;128"', "FLOAT;FLOAT;FLOAT;FLOAT", "needs input slots var;m;v;grad;step"),
        ('"128;128;64;128;1"', "FLOAT;FLOAT;FLOAT;FLOAT;INT64", r"v \[64\] FLOAT differs from var \[128\]"),
        ('"128;128;128;128;2"', "FLOAT;FLOAT;FLOAT;FLOAT;INT64", r"step \[2\] INT64 should hold one"),
        ('"128;128;128;128;1"', "INT32;INT32;INT32;INT32;INT64", "var dtype INT32 is not floating"),
    ],
)
def test_adamw_rows_it_cannot_build_name_the_slot(shapes: str, dtypes: str, message: str) -> None:
    row = kernel_row("ApplyAdamWV2", cells(shapes, dtypes, "N/A", "N/A"))  # in place: no outputs recorded
    with pytest.raises(CaseBuildError, match=message):
        replay_of("ApplyAdamWV2").check(row)


class NoBiasCorrection(ApplyAdamWV2Replay):
    """Plain Adam moments without bias correction: the step is ``lr * m / (sqrt(v) + eps)``."""

    def run(
        self, var: torch.Tensor, m: torch.Tensor, v: torch.Tensor, grad: torch.Tensor,
        step: torch.Tensor, initial: tuple[torch.Tensor, ...],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        m.mul_(ADAMW.beta1).add_(grad, alpha=1 - ADAMW.beta1)
        v.mul_(ADAMW.beta2).addcmul_(grad, grad, value=1 - ADAMW.beta2)
        var.mul_(1 - ADAMW.lr * ADAMW.weight_decay).sub_(ADAMW.lr * m / (v.sqrt() + ADAMW.eps))
        return var, m, v


def test_adamw_verification_bites_without_bias_correction() -> None:
    wrong = NoBiasCorrection()
    row = kernel_row("ApplyAdamWV2", ADAM[-1])
    args = wrong.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(VerificationError, match="output 0 .* relative error"):
        verify_outputs(wrong, row, wrong.run(*args), wrong.reference(*args))
