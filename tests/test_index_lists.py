"""Indexing's indices, which the profiler does not record, recovered from real traces.

``tests/fixtures/cpu/indexing_trace.json`` (see its SOURCES.md) is a real torch.profiler trace of
``x[idx]``, ``x[:, idx]``, ``cube[a, b]``, a non-adjacent ``cube[a, :, b]``, a boolean mask and
``index_put_`` with and without accumulation.  Ingest turns the recoverable ones into
``aten.index`` / ``aten.index_put`` rows that replay with indices of the recorded shapes, drawn
over the indexed dimension.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.ingest.trace_attribution import build_tree
from perf_plugin.ingest.trace_events import read_chrome_trace
from perf_plugin.replay.aten_call import build_arguments, parse_arguments, slots_used
from perf_plugin.trace.events import TraceOp
from perf_plugin.trace.index_lists import recover_indices
from tests.kernels.support import kernel_row, replay_of, replay_on_cpu

FIXTURES = Path(__file__).parent / "fixtures"
CPU_TRACE = FIXTURES / "cpu" / "indexing_trace.json"
CUDA_TRACE = FIXTURES / "cuda" / "indexing_trace.json"


def _indexing_ops(trace: Path) -> list[TraceOp]:
    roots = build_tree(read_chrome_trace(trace).ops)
    return [op for op in roots if op.name in ("aten::index", "aten::index_put_")]


def _described(indices: list | None) -> list | None:
    return None if indices is None else [None if t is None else (t.shape, t.dtype) for t in indices]


def test_indices_are_recovered_where_the_callees_determine_them() -> None:
    found = [(op.name, _described(recover_indices(op))) for op in _indexing_ops(CPU_TRACE)]
    assert found == [
        ("aten::index", [((48,), "INT64")]),  # x[idx]
        ("aten::index", [None, ((10,), "INT64")]),  # x[:, idx]
        ("aten::index", [((5,), "INT64"), ((5,), "INT64")]),  # cube[a, b]
        ("aten::index", None),  # cube[a, :, b]: the tensor is permuted first
        ("aten::index", [((64,), "BOOL")]),  # x[mask]: the mask, whose nonzero callee counted 27
        ("aten::index_put_", [((48,), "INT64")]),  # accumulate=True
        ("aten::index_put_", [((64,), "INT64")]),  # inverse[order] = arange
    ]


def test_on_cuda_the_same_indices_are_recovered_except_an_accumulating_write() -> None:
    """On CUDA an accumulating ``index_put_`` sorts a linear index instead (its callees are
    bounds checks and index arithmetic, no restride): not recovered."""
    found = [(op.name, _described(recover_indices(op))) for op in _indexing_ops(CUDA_TRACE)]
    assert found == [
        ("aten::index", [((48,), "INT64")]),
        ("aten::index", [None, ((10,), "INT64")]),
        ("aten::index", [((5,), "INT64"), ((5,), "INT64")]),
        ("aten::index", None),
        ("aten::index", [((64,), "BOOL")]),
        ("aten::index_put_", None),
        ("aten::index_put_", [((64,), "INT64")]),
    ]


def test_a_restride_no_placement_of_the_indices_explains_is_not_recovered() -> None:
    op = _indexing_ops(CPU_TRACE)[0]
    restride = next(child for child in op.children if child.name == "aten::as_strided")
    restride.concrete = ["", "[48, 32]", "[32, 1]", ""]  # no zero-stride block for the index
    assert recover_indices(op) is None


@pytest.fixture(scope="module")
def indexing_rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, str]]]:
    db = tmp_path_factory.mktemp("indexing") / "db"
    ingest_path(CPU_TRACE, db)
    rows: dict[str, list[dict[str, str]]] = {}
    for name in ("aten.index", "aten.index_put"):
        with (db / f"{name}.csv").open(newline="") as handle:
            rows[name] = list(csv.DictReader(handle))
    return rows


def test_ingest_writes_the_index_tensors_as_input_slots_of_the_call(indexing_rows: dict[str, list[dict[str, str]]]) -> None:
    by_inputs = {row["Input Shapes"]: row for row in indexing_rows["aten.index"]}
    leading = by_inputs['"64,32;10"']
    assert leading["Input Data Types"] == "DT_BF16;INT64"
    assert leading["Output Shapes"] == '"64,10"'
    assert parse_arguments(leading["Op Arguments"]) == ("Tensor", ({"tensor": 0}, {"tensors": [None, 1]}))
    assert by_inputs['"16,8,4;5;5"']["Output Shapes"] == '"5,4"'
    # a mask's result has as many rows as the mask selected: the shape its callees recorded
    masked = by_inputs['"64,32;64"']
    assert (masked["Input Data Types"], masked["Output Shapes"]) == ("DT_BF16;BOOL", '"27,32"')
    # the unrecoverable one (non-adjacent indices) keeps its measurement and no arguments
    assert sum(1 for row in indexing_rows["aten.index"] if not row["Op Arguments"]) == 1
    accumulating = indexing_rows["aten.index_put"][0]
    assert accumulating["Input Shapes"] == '"64,32;48;48,32"'
    assert parse_arguments(accumulating["Op Arguments"])[1][3] is True


def test_every_recovered_row_replays_and_verifies_on_the_cpu(indexing_rows: dict[str, list[dict[str, str]]]) -> None:
    replayed = 0
    for kernel_type, rows in indexing_rows.items():
        for cells in rows:
            if cells["Op Arguments"]:
                replay_on_cpu(kernel_type, cells)
                replayed += 1
    assert replayed == 6  # three gathers, a masked gather, two writes


def test_indices_address_the_whole_indexed_dimension(indexing_rows: dict[str, list[dict[str, str]]]) -> None:
    """Not only the first rows of the tensor (a gather's cache behaviour depends on its span)."""
    cells = next(row for row in indexing_rows["aten.index"] if row["Input Shapes"] == '"64,32;48"')
    replay = replay_of("aten.index")
    _, _, _, tensors, _ = replay.make_inputs(kernel_row("aten.index", cells), torch.device("cpu"), torch.Generator().manual_seed(0))
    indices = tensors[1]
    assert indices.dtype == torch.int64 and indices.shape == (48,)
    assert int(indices.min()) >= 0 and int(indices.max()) < 64
    assert int(indices.max()) >= 32  # drawn over all 64 rows, not below the smallest dimension (32)


def test_a_mask_selects_as_many_elements_as_the_model_s_did(indexing_rows: dict[str, list[dict[str, str]]]) -> None:
    cells = next(row for row in indexing_rows["aten.index"] if row["Input Data Types"] == "DT_BF16;BOOL")
    replay = replay_of("aten.index")
    for seed in (0, 1):
        args = replay.make_inputs(kernel_row("aten.index", cells), torch.device("cpu"), torch.Generator().manual_seed(seed))
        mask = args[3][1]
        assert mask.dtype == torch.bool and int(mask.sum()) == 27
        assert tuple(replay.run(*args).shape) == (27, 32)


def test_indices_written_without_accumulation_are_distinct(indexing_rows: dict[str, list[dict[str, str]]]) -> None:
    """Repeated indices in a non-accumulating write leave whichever write lands last: no
    reference could check that, so the replay draws them without repetition."""
    cells = next(row for row in indexing_rows["aten.index_put"] if "false" in row["Op Arguments"])
    replay = replay_of("aten.index_put")
    args = replay.make_inputs(kernel_row("aten.index_put", cells), torch.device("cpu"), torch.Generator().manual_seed(1))
    indices = args[3][1]
    assert sorted(indices.tolist()) == list(range(64))


def test_none_entries_of_a_tensor_list_pass_through_as_none() -> None:
    template = ({"tensor": 0}, {"tensors": [None, 1]})
    assert slots_used(template) == [0, 1]
    positional, _ = build_arguments(template, ["x", "i"])
    assert positional == ["x", [None, "i"]]


def test_a_write_the_model_made_in_place_is_replayed_in_place(indexing_rows: dict[str, list[dict[str, str]]]) -> None:
    """``inverse[order] = arange`` ran ``index_put_``: replaying the out-of-place ``index_put``
    would add a copy kernel the model never ran.  Writing twice leaves what writing once does,
    so the first call's output still checks against a reference computed after it."""
    writes = {parse_arguments(row["Op Arguments"])[1][3]: row for row in indexing_rows["aten.index_put"]}
    assert '"operator":"index_put_"' in writes[False]["Op Arguments"]
    replay = replay_of("aten.index_put")
    args = replay.make_inputs(kernel_row("aten.index_put", writes[False]), torch.device("cpu"), torch.Generator().manual_seed(0))
    assert args[0] == "index_put_"
    assert replay.run(*args).data_ptr() == args[3][0].data_ptr()  # written into the input itself
    replay_on_cpu("aten.index_put", writes[False])
    # an accumulating write adds again at every repeat: it stays out of place
    args = replay.make_inputs(kernel_row("aten.index_put", writes[True]), torch.device("cpu"), torch.Generator().manual_seed(0))
    assert args[0] == "index_put"
    assert replay.run(*args).data_ptr() != args[3][0].data_ptr()
