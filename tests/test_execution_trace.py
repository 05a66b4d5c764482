"""Execution traces beside a profile: reading them, aligning their tensors with a row's slots, and
ingest finding each input's producer by its storage instead of its shape."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from perf_plugin.capture import execution_trace_observer
from perf_plugin.cli import main as perfdb_main
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.reuse_cell import parse_reuse_cell
from perf_plugin.database.schema import PROFILING_INPUT_REUSE
from perf_plugin.ingest.execution_trace import (
    SlotStorages,
    TracedTensor,
    execution_trace_for,
    read_execution_trace,
    storages_of,
)
from perf_plugin.ingest.input_reuse import reuse_distances
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.ingest.trace_events import read_chrome_trace
from perf_plugin.trace.mapped import MappedOp, Slot

CUDA = Path(__file__).parent / "fixtures" / "cuda"
TRACE = CUDA / "shared_expert_trace.json"
BF16 = "DT_BF16"
# The weights of two routed experts of the fixture's block (gate, up, down: 512 x 1024 bf16 each).
ROUTED_WEIGHTS = 2 * 3 * 512 * 1024 * 2


def _distances(database: Path, kernel_type: str, shapes: str) -> tuple[float, ...]:
    with (database / f"{kernel_type}.csv").open(newline="") as handle:
        (row,) = [row for row in csv.DictReader(handle) if row["Input Shapes"] == shapes]
    return parse_reuse_cell(row[PROFILING_INPUT_REUSE])


def test_the_shared_experts_output_is_paired_with_its_own_writer(tmp_path: Path) -> None:
    """The gate's ``mul`` reads the shared expert's output, written before the routed experts
    streamed their weights; by shape alone it pairs with the routed sum written just before."""
    report = ingest_path(TRACE, tmp_path / "named")
    assert any("execution trace: 47 of 47" in line for line in report.lines())
    _, shared = _distances(tmp_path / "named", "Mul", '"1,1;1,1024"')
    assert shared > ROUTED_WEIGHTS
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(TRACE, alone / TRACE.name)  # the trace without its execution trace
    report = ingest_path(alone / TRACE.name, tmp_path / "inferred")
    assert not any("execution trace" in line for line in report.lines())
    _, inferred = _distances(tmp_path / "inferred", "Mul", '"1,1;1,1024"')
    assert inferred < 64 * 1024


def test_an_input_no_traced_operator_wrote_has_no_producer(tmp_path: Path) -> None:
    """The block's input was written before the profile began: by storage it has no writer,
    where the shapes paired it with an output of its shape."""
    ingest_path(TRACE, tmp_path)
    (activation, weight) = _distances(tmp_path, "MatMulV2", '"1,1024;8,1024"')  # the router
    assert math.isinf(activation) and math.isinf(weight)


def test_the_kineto_operators_carry_the_execution_traces_ids() -> None:
    trace = read_chrome_trace(TRACE)
    calls = read_execution_trace(CUDA / "shared_expert_trace.et.json")
    ids = [op.record_id for op in trace.ops]
    assert all(record_id is not None for record_id in ids) and len(set(ids)) == len(ids)
    assert all(record_id in calls for record_id in ids)


def test_a_tensor_list_is_flattened_in_argument_order(tmp_path: Path) -> None:
    """A real execution trace of ``cat`` on the CPU: the list's tensors, then none for the dim."""
    a, b = torch.randn(2, 3), torch.randn(2, 5)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 execution_trace_observer=execution_trace_observer(tmp_path / "run.json")) as prof:
        torch.cat([a, b], dim=1)
    prof.export_chrome_trace(str(tmp_path / "run.json"))
    calls = execution_trace_for(tmp_path / "run.json")
    assert calls is not None
    (op,) = [op for op in read_chrome_trace(tmp_path / "run.json").ops if op.name == "aten::cat"]
    call = calls[op.record_id]  # type: ignore[index]
    assert [t.shape for t in call.inputs] == [(2, 3), (2, 5)] and [t.shape for t in call.outputs] == [(2, 8)]
    mapped = MappedOp("ConcatD", (Slot((2, 3), "FLOAT"), Slot((2, 5), "FLOAT")), (Slot((2, 8), "FLOAT"),))
    storages = storages_of(mapped, op, calls)
    assert storages is not None and storages.inputs == tuple(t.storage for t in call.inputs)
    assert storages.written == call.outputs
    other = MappedOp("ConcatD", (Slot((3, 2), "FLOAT"), Slot((2, 5), "FLOAT")), (Slot((2, 8), "FLOAT"),))
    misaligned = storages_of(other, op, calls)  # shapes that are not the call's: no names, the inference stays
    assert misaligned is not None and misaligned.inputs == (None, None)


def test_the_execution_trace_beside_a_trace_without_device_activity_is_not_read(tmp_path: Path) -> None:
    """A CPU trace's rows have no reuse distances to name; its execution trace (as large as the
    trace) is left unread, and a damaged one does not stop the ingest."""
    shutil.copy(Path(__file__).parent / "fixtures" / "cpu" / "scalar_operand_trace.json", tmp_path / "run.json")
    (tmp_path / "run.et.json").write_text("{")
    report = ingest_path(tmp_path / "run.json", None)
    assert report.rows
    with pytest.raises(DatabaseError, match="not an execution trace"):  # given explicitly, it is read
        ingest_path(tmp_path / "run.json", None, execution_trace=tmp_path / "run.et.json")


def test_no_execution_trace_beside_a_trace_is_none(tmp_path: Path) -> None:
    assert execution_trace_for(tmp_path / "run.json") is None


@pytest.mark.parametrize(("text", "reason"), [
    ("{", "not an execution trace"),
    ('{"schema": "x"}', "no list of nodes"),
    ('{"nodes": [{"id": 7, "attrs": [{"name": "rf_id", "value": 3}], "inputs": {}}]}', "node 7"),
])
def test_a_bad_execution_trace_is_one_error_naming_the_file(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "run.et.json"
    path.write_text(text)
    with pytest.raises(DatabaseError) as error:
        read_execution_trace(path)
    assert reason in str(error.value) and error.value.path == path


def _op(inputs: list[tuple[int, ...]], outputs: list[tuple[int, ...]]) -> MappedOp:
    return MappedOp("Op", tuple(Slot(s, BF16) for s in inputs), tuple(Slot(s, BF16) for s in outputs))


def test_a_named_input_takes_its_storages_latest_writer_not_the_newest_output_of_its_shape() -> None:
    """shared = A(x); routed = B(y, big weight); mul(shared): by shape the mul would read ``routed``."""
    ops = [_op([(1, 64)], [(1, 1024)]), _op([(1, 1024), (4096, 1024)], [(1, 1024)]), _op([(1, 1024)], [(1, 1024)])]
    shared, routed = TracedTensor(11, (1, 1024)), TracedTensor(12, (1, 1024))
    storages = [SlotStorages((None,), (shared,)), SlotStorages((10, None), (routed,)), SlotStorages((11,), ())]
    by_storage = reuse_distances(ops, storages=storages)[2][0]
    by_shape = reuse_distances(ops)[2][0]
    assert by_storage > 4096 * 1024 * 2 > 10 * by_shape


def test_a_named_input_no_operator_wrote_has_no_producer_and_an_unnamed_one_keeps_the_inference() -> None:
    ops = [_op([], [(1, 1024)]), _op([(1, 1024)], [(1, 1024)])]
    never_written = [SlotStorages((), (TracedTensor(1, (1, 1024)),)), SlotStorages((99,), ())]
    assert math.isinf(reuse_distances(ops, storages=never_written)[1][0])
    unnamed = [SlotStorages((), (TracedTensor(1, (1, 1024)),)), SlotStorages((None,), ())]
    assert reuse_distances(ops, storages=unnamed) == reuse_distances(ops)


def test_a_storage_written_by_an_output_no_slot_has_is_still_found() -> None:
    """An operator whose mapped outputs do not show a tensor it wrote (an in-place ``self``)."""
    ops = [_op([(8,)], [(8,)]), _op([(1024,)], [(1024,)]), _op([(16,)], [(16,)])]
    storages = [SlotStorages((None,), (TracedTensor(5, (8,)), TracedTensor(6, (16,)))), SlotStorages((None,), ()),
                SlotStorages((6,), ())]
    assert reuse_distances(ops, storages=storages)[2][0] < math.inf


def test_the_fixture_is_an_execution_trace_of_pytorchs_schema() -> None:
    document = json.loads((CUDA / "shared_expert_trace.et.json").read_text())
    assert document["schema"].startswith("1.") and "chakra" in document["schema"]


def test_perfdb_ingest_takes_an_execution_trace_from_elsewhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(TRACE, alone / "run.json")
    code = perfdb_main(["ingest", "--profiling-path", str(alone / "run.json"), "--database-path", str(tmp_path / "db"),
                        "--execution-trace", str(CUDA / "shared_expert_trace.et.json")])
    assert code == 0 and "execution trace: 47 of 47" in capsys.readouterr().out
    _, shared = _distances(tmp_path / "db", "Mul", '"1,1;1,1024"')
    assert shared > ROUTED_WEIGHTS


def test_an_execution_trace_for_a_profile_of_several_traces_is_refused(tmp_path: Path) -> None:
    for name in ("a.pt.trace.json", "b.pt.trace.json"):
        shutil.copy(TRACE, tmp_path / name)
    with pytest.raises(DatabaseError, match="belongs to one PyTorch trace"):
        ingest_path(tmp_path, None, execution_trace=CUDA / "shared_expert_trace.et.json")
