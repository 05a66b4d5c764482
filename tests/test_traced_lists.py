"""Tensor lists the profile leaves out (past 30 tensors) or records without dtypes, completed from
the execution trace beside it: real CPU profiles of ``torch.stack`` and ``torch.cat``."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from perf_plugin.capture import execution_trace_observer
from perf_plugin.ingest.aggregate import AggregatedRow
from perf_plugin.ingest.execution_trace import TracedCall, TracedList, read_execution_trace
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.ingest.trace_events import read_chrome_trace
from perf_plugin.ingest.traced_lists import complete_tensor_lists, has_lists_to_complete
from perf_plugin.trace.args import tensor_list_arg
from perf_plugin.trace.events import TraceOp

STACKED = 40  # past the profiler's 30


def _profile(tmp_path: Path) -> Path:
    """``stack`` of 40 bf16 rows (the list left out) and ``cat`` of two bf16 blocks (recorded)."""
    rows = [torch.randn(1, 16, dtype=torch.bfloat16) for _ in range(STACKED)]
    a, b = torch.randn(2, 3, dtype=torch.bfloat16), torch.randn(2, 5, dtype=torch.bfloat16)
    trace = tmp_path / "run.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 execution_trace_observer=execution_trace_observer(trace)) as prof:
        torch.stack(rows, dim=-1)
        torch.cat([a, b], dim=1)
    prof.export_chrome_trace(str(trace))
    return trace


def _op(trace: Path, name: str) -> TraceOp:
    """The profiled call ``name``, not the one ``stack`` makes of its unsqueezed rows."""
    (op,) = [op for op in read_chrome_trace(trace).ops if op.name == name and op.dims[0] != []
             or name == "aten::stack" == op.name]
    return op


def _concat_rows(trace: Path) -> dict[str, AggregatedRow]:
    report = ingest_path(trace, None)
    return {row.cells["Input Shapes"]: row for row in report.rows if row.kernel_type == "ConcatD"}


def test_the_profile_leaves_out_a_list_of_more_than_30_tensors(tmp_path: Path) -> None:
    trace = _profile(tmp_path)
    stack, cat = _op(trace, "aten::stack"), _op(trace, "aten::cat")
    assert stack.types[0] == "TensorList" and stack.dims[0] == []
    assert cat.dims[0] == [[2, 3], [2, 5]] and not cat.list_dtypes
    assert has_lists_to_complete([stack]) and has_lists_to_complete([cat])  # cat's dtypes are not recorded
    cat.list_dtypes[0] = ("DT_BF16", "DT_BF16")
    assert not has_lists_to_complete([cat])


def test_the_execution_trace_records_the_whole_list_with_its_dtypes(tmp_path: Path) -> None:
    trace = _profile(tmp_path)
    calls = read_execution_trace(tmp_path / "run.et.json")
    stacked = calls[_op(trace, "aten::stack").record_id].lists[0]  # type: ignore[index]
    assert stacked.shapes == ((1, 16),) * STACKED and stacked.strides == ((16, 1),) * STACKED
    assert stacked.dtypes == ("c10::BFloat16",) * STACKED
    assert set(calls[_op(trace, "aten::cat").record_id].lists) == {0}  # type: ignore[index]


def test_ingest_replays_the_left_out_list_from_the_execution_trace(tmp_path: Path) -> None:
    trace = _profile(tmp_path)
    rows = _concat_rows(trace)
    stacked = '"' + ";".join(["1,16,1"] * STACKED) + '"'  # stack's rows, viewed as cat reads them
    assert stacked in rows, list(rows)
    assert rows[stacked].cells["Input Data Types"] == ";".join(["DT_BF16"] * STACKED)
    assert rows[stacked].cells["Output Shapes"] == f'"1,16,{STACKED}"'


def test_without_the_execution_trace_the_left_out_list_has_no_arguments(tmp_path: Path) -> None:
    trace = _profile(tmp_path)
    (tmp_path / "run.et.json").unlink()
    report = ingest_path(trace, None)
    assert not any(row.cells["Input Shapes"].count(";") == STACKED - 1 for row in report.rows)


def test_a_recorded_list_takes_its_dtypes_where_the_shapes_agree(tmp_path: Path) -> None:
    trace = _profile(tmp_path)
    calls = read_execution_trace(tmp_path / "run.et.json")
    cat = _op(trace, "aten::cat")
    assert complete_tensor_lists([cat], calls) == 0  # nothing left out
    assert [t.dtype for t in tensor_list_arg(cat, 0) or []] == ["DT_BF16", "DT_BF16"]
    other = TraceOp("aten::cat", (1, 1), 0, 1, record_id=7, dims=[[[2, 3], [2, 4]], []], types=["TensorList", "Scalar"])
    differing = {7: TracedCall((), (), {0: TracedList(((2, 3), (2, 5)), None, ("float", "float"))})}
    assert complete_tensor_lists([other], differing) == 0 and not other.list_dtypes


def test_a_list_of_other_than_tensors_is_not_taken(tmp_path: Path) -> None:
    """``index``'s optional tensors (``GenericList[Tensor(long int),None]``) name no list of tensors."""
    document = {"schema": "1.1.1-chakra.0.0.4", "nodes": [{
        "id": 2, "name": "aten::index", "ctrl_deps": 1, "attrs": [{"name": "rf_id", "type": "uint64", "value": 3}],
        "inputs": {"values": [[1, 1, 0, 8, 4, "cpu"], [[2, 2, 0, 2, 8, "cpu"], None]],
                   "shapes": [[2, 4], [[2], []]], "types": ["Tensor(float)", "GenericList[Tensor(long int),None]"],
                   "strides": [[4, 1], [[1], []]]},
        "outputs": {"values": [[3, 3, 0, 2, 4, "cpu"]], "shapes": [[2]], "types": ["Tensor(float)"], "strides": [[1]]},
    }]}
    path = tmp_path / "run.et.json"
    path.write_text(json.dumps(document))
    assert read_execution_trace(path)[3].lists == {}


def test_an_optimizers_foreach_update_of_every_parameter_takes_its_lists(tmp_path: Path) -> None:
    """AdamW's ``_foreach_`` step over 40 parameters, each list past the profiler's 30."""
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(20)])
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    model(torch.randn(4, 16)).sum().backward()
    trace = tmp_path / "run.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 execution_trace_observer=execution_trace_observer(trace)) as prof:
        optimizer.step()
    prof.export_chrome_trace(str(trace))
    parameters = ";".join(["16,16", "16"] * 20)
    rows = {(row.kernel_type, row.cells["Input Shapes"]) for row in ingest_path(trace, None).rows}
    assert ("aten._foreach_sqrt", f'"{parameters}"') in rows, sorted(rows)
    addcdiv = [shapes for kind, shapes in rows if kind == "aten._foreach_addcdiv"]
    assert [shapes.count(";") + 1 for shapes in addcdiv] == [120]  # three lists of the 40 parameters' shapes
    assert addcdiv[0].startswith(f'"{parameters};') and addcdiv[0].endswith(f';{parameters}"')


def test_a_cat_nothing_reads_takes_its_dtypes_from_the_execution_trace(tmp_path: Path) -> None:
    """A CPU profile of a lone ``cat`` of two bf16 blocks (as ``glm_moe_dsa``'s sparse-attention
    indexer makes them): no kernels, no reader and no output dtype to infer the list's dtypes
    from, so only the execution trace gives them; it is read for the CPU trace's list too."""
    a, b = torch.randn(1, 64, 1, 32, dtype=torch.bfloat16), torch.randn(1, 64, 1, 32, dtype=torch.bfloat16)
    trace = tmp_path / "run.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 execution_trace_observer=execution_trace_observer(trace)) as prof:
        torch.cat([a, b], dim=-1)
    prof.export_chrome_trace(str(trace))
    row = _concat_rows(trace)['"1,64,1,32;1,64,1,32"']
    assert (row.cells["Input Data Types"], row.cells["Output Data Types"]) == ("DT_BF16;DT_BF16", "DT_BF16")
