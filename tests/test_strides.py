"""A view a model's kernel read in place is recorded with its strides and replayed as a view.

The trace is a real CPU torch.profiler trace of an add whose second input is a transposed view,
next to the same add on contiguous tensors: ingest keeps the two apart (the strides are part of
the row's signature), and the replay of the strided row reads a tensor with those strides.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.schema import INPUT_STRIDES
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.replay.registry import get_replay, signature_of
from perf_plugin.replay.tensors import kernel_row_from_cells
from tests.kernels.support import replay_on_cpu


@pytest.fixture(scope="module")
def add_rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, str]]:
    root = tmp_path_factory.mktemp("strides")
    x, y = torch.randn(8, 16), torch.randn(16, 8)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        x + y.t()
        x + y.t().contiguous()
    prof.export_chrome_trace(str(root / "trace.json"))
    ingest_path(root / "trace.json", root / "db")
    with (root / "db" / "Add.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_the_strided_call_is_a_row_of_its_own(add_rows: list[dict[str, str]]) -> None:
    assert sorted(row[INPUT_STRIDES] for row in add_rows) == ["", '"16,1;1,8"']
    strided, contiguous = sorted(add_rows, key=lambda row: row[INPUT_STRIDES], reverse=True)
    assert signature_of("Add", strided) != signature_of("Add", contiguous)


def test_the_replay_reads_a_view_with_the_recorded_strides(add_rows: list[dict[str, str]]) -> None:
    (strided,) = [row for row in add_rows if row[INPUT_STRIDES]]
    row = kernel_row_from_cells("Add", strided)
    assert [spec.strides for spec in row.inputs] == [None, (1, 8)]  # contiguous slots need none
    x, y = get_replay("Add").make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))[:2]
    assert x.is_contiguous() and y.stride() == (1, 8) and tuple(y.shape) == (8, 16)
    replay_on_cpu("Add", strided)


def test_strides_that_do_not_fit_the_shape_are_named() -> None:
    cells = {"Input Shapes": '"8,16"', "Input Data Types": "FLOAT", "Output Shapes": '"8,16"',
             "Output Data Types": "FLOAT", INPUT_STRIDES: '"1"'}
    with pytest.raises(DatabaseError, match=r"column 'Input Strides': slot 0 strides \[1\] do not match its shape"):
        kernel_row_from_cells("Add", cells)


def test_a_gemm_on_a_transposed_view_reads_it_in_place(tmp_path: Path) -> None:
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.mm(x, w.t())
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    ingest_path(tmp_path / "trace.json", tmp_path / "db")
    with (tmp_path / "db" / "MatMulV2.csv").open(newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    assert (row["Input Shapes"], row[INPUT_STRIDES]) == ('"8,16;16,16"', '"16,1;1,16"')
    replay = get_replay("MatMulV2")
    kernel_row = kernel_row_from_cells("MatMulV2", row)
    assert replay.layout(kernel_row).name == "NN"  # the strides say how B is stored: no transpose on top
    a, b = replay.make_inputs(kernel_row, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert b.stride() == (1, 16)
    replay_on_cpu("MatMulV2", row)
