"""ArgMaxV2 and Sort: the torch calls that launch them, their inputs, the checks, trace ingest.

Sort has one real row (Level2 training profile: ``"4096"`` FLOAT -> ``"4096;4096"`` FLOAT;INT32,
from ``aclnnEmbeddingDenseBackward``).  ArgMaxV2 has none; its rows are written in the layout of
Ascend/msmodeling's ``ArgMaxV2_run.py`` and ``tools/perf_data_collection/README_op_microbench.md``
(``"1,1024;"`` FLOAT;INT64 -> ``"1"`` INT32: x, the dimension as an empty slot with a dtype, the
kernel's INT32 indices), with the vocabulary sizes of greedy sampling.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.sorting import ArgMaxV2Replay, SortReplay
from perf_plugin.replay.registry import get_replay
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import aten_ops_of_run, kernel_row, level2_rows, op_mapping_api, replay_on_cpu


def cells(inputs: str, in_types: str, outputs: str, out_types: str) -> dict[str, str]:
    count = lambda types_: len(types_.split(";"))  # noqa: E731
    return {
        "OP State": "dynamic", "Accelerator Core": "AI_VECTOR_CORE",
        "Input Shapes": f'"{inputs}"', "Input Data Types": in_types, "Input Formats": ";".join(["ND"] * count(in_types)),
        "Output Shapes": f'"{outputs}"', "Output Data Types": out_types, "Output Formats": ";".join(["ND"] * count(out_types)),
    }  # fmt: skip


SORT_ROWS = level2_rows("Sort") + [
    cells("1,64", "FLOAT", "1,64;1,64", "FLOAT;INT32"),  # msmodeling README example
    cells("4,151936", "FLOAT", "4,151936;4,151936", "FLOAT;INT32"),  # top-p over a Qwen vocabulary
    cells("2,20000", "FLOAT16", "2,20000;2,20000", "FLOAT16;INT32"),  # too long for distinct halves
]
ARGMAX_ROWS = [
    cells("1,1024;", "FLOAT;INT64", "1", "INT32"),  # msmodeling README example
    cells("8,151936;", "DT_BF16;INT64", "8", "INT32"),  # greedy sampling over a vocabulary
    cells("4,32;", "INT32;INT64", "4,1", "INT32"),  # keepdim
]


def _id(row: dict[str, str]) -> str:
    return row["Input Shapes"].strip('"') + "/" + row["Input Data Types"]


# ----------------------------------------------------------------------------- Sort
@pytest.mark.parametrize("row_cells", SORT_ROWS, ids=_id)
def test_sort_runs_torch_sort_ascending_on_the_last_dim(row_cells: dict[str, str]) -> None:
    replay = get_replay("Sort")
    assert replay is not None and op_mapping_api("Sort") is None and replay.npu_api == "torch.sort"
    assert type(replay).npu_call is SortReplay.npu_call  # run itself is the NPU call (aclnnSort)
    assert aten_ops_of_run("Sort", row_cells) == ["aten.sort"]
    (values, indices), _ = replay_on_cpu("Sort", row_cells)
    assert indices.dtype == torch.int64  # what torch.sort returns; the kernel's INT32 is cast after it
    assert bool((values[..., 1:] >= values[..., :-1]).all())


def test_sort_rows_get_distinct_values_where_the_dtype_has_them() -> None:
    replay = SortReplay()
    generator = torch.Generator().manual_seed(0)
    (real,) = level2_rows("Sort")
    x, stable = replay.make_inputs(kernel_row("Sort", real), torch.device("cpu"), generator)
    assert not stable and x.unique().numel() == 4096 and bool((x != 0).all())
    x, stable = replay.make_inputs(kernel_row("Sort", SORT_ROWS[-1]), torch.device("cpu"), generator)
    assert stable  # 20000 > the 16384 distinct half-precision codes: ties, so the unique stable order


def test_sort_expects_the_apis_int64_indices_for_the_kernels_int32() -> None:
    (real,) = level2_rows("Sort")
    values, indices = SortReplay().expected_outputs(kernel_row("Sort", real))
    assert (values.dtype, indices.dtype, indices.shape) == ("FLOAT", "INT64", (4096,))


class _Descending(SortReplay):
    def run(self, x: Any, stable: bool) -> Any:
        values, indices = torch.sort(x, dim=-1, descending=True, stable=stable)
        return values, indices


def test_a_sort_in_the_wrong_order_fails_verification() -> None:
    (real,) = level2_rows("Sort")
    row = kernel_row("Sort", real)
    args = SortReplay().make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(VerificationError, match="exact match required"):
        verify_outputs(SortReplay(), row, _Descending().run(*args), SortReplay().reference(*args))


# ----------------------------------------------------------------------------- ArgMaxV2
@pytest.mark.parametrize("row_cells", ARGMAX_ROWS, ids=_id)
def test_argmax_runs_torch_argmax_over_the_reduced_dim(row_cells: dict[str, str]) -> None:
    replay = get_replay("ArgMaxV2")
    assert replay is not None and op_mapping_api("ArgMaxV2") is None and replay.npu_api == "torch.argmax"
    assert type(replay).npu_call is ArgMaxV2Replay.npu_call
    assert aten_ops_of_run("ArgMaxV2", row_cells) == ["aten.argmax"]
    out, _ = replay_on_cpu("ArgMaxV2", row_cells)
    assert out.dtype == torch.int64
    args = replay.make_inputs(kernel_row("ArgMaxV2", row_cells), torch.device("cpu"), torch.Generator().manual_seed(1))
    x, dim, keepdim = args
    assert dim == 1 and keepdim == (row_cells["Output Shapes"] == '"4,1"')
    # the planted maximum is unique in every reduced slice: no tie for the device to break
    assert bool((x == x.max(dim=dim, keepdim=True).values).sum(dim).eq(1).all())


def test_argmax_prefers_the_last_dim_when_several_fit() -> None:
    row = kernel_row("ArgMaxV2", cells("6,6;", "FLOAT;INT64", "6", "INT32"))
    args = ArgMaxV2Replay().make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert args[1:] == (1, False)


class _FirstDim(ArgMaxV2Replay):
    def run(self, x: Any, dim: int, keepdim: bool) -> Any:
        return torch.argmax(x, 0, keepdim)


def test_an_argmax_over_the_wrong_dim_fails_verification() -> None:
    row = kernel_row("ArgMaxV2", cells("6,6;", "FLOAT;INT64", "6", "INT32"))
    args = ArgMaxV2Replay().make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(VerificationError, match="exact match required"):
        verify_outputs(ArgMaxV2Replay(), row, _FirstDim().run(*args), ArgMaxV2Replay().reference(*args))


# ----------------------------------------------------------------------------- rows that cannot be built
@pytest.mark.parametrize(
    ("kernel_type", "row_cells", "reason"),
    [
        ("Sort", cells("4,8", "FLOAT", "4,8", "FLOAT"), "needs outputs values;indices"),
        ("Sort", cells("4,8", "FLOAT", "4,8;4,8", "DT_BF16;INT32"), "values \\[4,8\\] BF16 should be x's \\[4,8\\] FLOAT"),
        ("Sort", cells("4,8", "FLOAT", "4,8;4,8", "FLOAT;FLOAT"), "indices \\[4,8\\] FLOAT should be"),
        ("ArgMaxV2", cells("4,8;", "FLOAT;INT64", "3", "INT32"), "is not x \\[4,8\\] reduced over one dim"),
        ("ArgMaxV2", cells("4,8;", "FLOAT;INT64", "4", "FLOAT"), "needs one INT32/INT64 output"),
        ("ArgMaxV2", cells("4,8;2", "FLOAT;FLOAT", "4", "INT32"), "is not the dimension"),
    ],
)
def test_rows_the_replay_cannot_build_say_why(kernel_type: str, row_cells: dict[str, str], reason: str) -> None:
    replay = get_replay(kernel_type)
    assert replay is not None
    with pytest.raises(CaseBuildError, match=reason):
        replay.check(kernel_row(kernel_type, row_cells))


# ----------------------------------------------------------------------------- trace ingest
def test_a_cpu_trace_of_sort_and_argmax_becomes_their_rows(tmp_path: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    logits = torch.randn(4, 100)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.sort(logits, dim=-1)
        torch.sort(logits.to(torch.bfloat16), dim=0, stable=True)
        torch.argmax(logits, dim=-1)
    trace = tmp_path / "sampling.pt.trace.json"
    prof.export_chrome_trace(str(trace))
    rows = {(r.kernel_type, r.cells["Input Shapes"]): r.cells for r in ingest_path(trace, tmp_path / "db").rows}
    identity = ("Input Data Types", "Output Shapes", "Output Data Types")
    # the kernel sorts its last dim in FLOAT: aclnnSort moves dim 0 last and casts BF16 first
    assert [rows["Sort", '"4,100"'][c] for c in identity] == ["FLOAT", '"4,100;4,100"', "FLOAT;INT32"]
    assert [rows["Sort", '"100,4"'][c] for c in identity] == ["FLOAT", '"100,4;100,4"', "FLOAT;INT32"]
    assert [rows["ArgMaxV2", '"4,100;"'][c] for c in identity] == ["FLOAT;INT64", '"4"', "INT32"]
    for kernel_type, shapes in (("Sort", '"100,4"'), ("ArgMaxV2", '"4,100;"')):
        replay_on_cpu(kernel_type, rows[kernel_type, shapes])
    assert {p.stem for p in (tmp_path / "db").glob("*.csv")} >= {"Sort", "ArgMaxV2"}
