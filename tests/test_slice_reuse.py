"""Reads of one part of a tensor do not bring its other parts into the cache: a loop over slices
of a tensor written before it (a Mamba scan's step ``i`` of ``[1, channels, steps, state]``) reads
each step's slice from where the tensor's write left it, where the execution trace gives the views'
offsets (``perf_plugin.ingest.written_tensors.part_view``)."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from perf_plugin.capture import execution_trace_observer
from perf_plugin.ingest.execution_trace import SlotStorages, TracedTensor, read_execution_trace, storages_of
from perf_plugin.ingest.input_reuse import input_reuse
from perf_plugin.ingest.trace_events import read_chrome_trace
from perf_plugin.trace.mapped import MappedOp, Slot

F32 = "FLOAT"
CHANNELS, STEPS, STATE = 64, 8, 16
WHOLE = (1, CHANNELS, STEPS, STATE)
SLICE = (1, CHANNELS, STATE)
SLICE_STRIDES = (CHANNELS * STEPS * STATE, STEPS * STATE, 1)  # dA[:, :, i] of WHOLE
WEIGHT = (4096, 4096)  # 64 MB of traffic between the write and the loop


def _ops(steps: list[int], state: int = STATE) -> tuple[list[MappedOp], list[SlotStorages]]:
    """exp -> A (storage 5); a GEMV streaming a weight; then one mul per step reading A[:, :, i]."""
    whole = (1, CHANNELS, STEPS, state)
    view, strides = (1, CHANNELS, state), (CHANNELS * STEPS * state, STEPS * state, 1)
    ops = [MappedOp("Exp", (Slot(whole, F32),), (Slot(whole, F32),)),
           MappedOp("MatMul", (Slot((1, 4096), F32), Slot(WEIGHT, F32)), (Slot((1, 4096), F32),))]
    storages = [SlotStorages((None,), (TracedTensor(5, whole),)), SlotStorages((None, None), ())]
    for step in steps:
        ops.append(MappedOp("Mul", (Slot(view, F32),), (Slot(view, F32),), (strides,)))
        storages.append(SlotStorages((5,), (), (step * state,)))
    return ops, storages


def test_each_step_reads_its_slice_from_where_the_write_left_it() -> None:
    ops, storages = _ops([0, 1, 2])
    distances = input_reuse(ops, storages=storages).distances
    weight_bytes = 4096 * 4096 * 4
    assert all(distances[k][0] > weight_bytes for k in (2, 3, 4))  # never the previous step's read
    assert distances[3][0] > distances[2][0]  # the write recedes


def test_without_the_offsets_the_previous_steps_read_counts() -> None:
    ops, storages = _ops([0, 1, 2])
    bare = [SlotStorages(s.inputs, s.written) for s in storages]
    distances = input_reuse(ops, storages=bare).distances
    assert distances[3][0] < 64 * 1024  # the previous mul's read and write, a few kilobytes


def test_a_slice_read_again_is_found_where_its_last_read_left_it() -> None:
    ops, storages = _ops([0, 1, 0])
    distances = input_reuse(ops, storages=storages).distances
    assert distances[4][0] < 64 * 1024 < distances[3][0]


def test_runs_shorter_than_a_sector_share_their_sectors_and_count_as_reads_of_the_whole() -> None:
    ops, storages = _ops([0, 1, 2], state=4)  # 16-byte runs
    distances = input_reuse(ops, storages=storages).distances
    assert distances[3][0] < 64 * 1024


def test_a_read_of_the_whole_tensor_refreshes_every_slice() -> None:
    ops, storages = _ops([0, 1])
    ops.insert(3, MappedOp("Sum", (Slot(WHOLE, F32),), (Slot((1,), F32),)))
    storages.insert(3, SlotStorages((5,), (), (0,)))
    distances = input_reuse(ops, storages=storages).distances
    assert distances[4][0] < CHANNELS * STEPS * STATE * 4  # the sum's read, not the write
    assert not math.isinf(distances[4][0])


def test_the_execution_trace_gives_each_steps_offset(tmp_path: Path) -> None:
    """A real CPU profile of a scan over slices: the views' offsets, in elements, step by the state size."""
    whole, state = torch.rand(*WHOLE), torch.zeros(*SLICE)
    trace = tmp_path / "scan.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 execution_trace_observer=execution_trace_observer(trace)) as prof:
        for step in range(3):
            state = whole[:, :, step] * state
    prof.export_chrome_trace(str(trace))
    calls = read_execution_trace(tmp_path / "scan.et.json")
    muls = [op for op in read_chrome_trace(trace).ops if op.name == "aten::mul"]
    mapped = MappedOp("Mul", (Slot(SLICE, F32), Slot(SLICE, F32)), (Slot(SLICE, F32),), (SLICE_STRIDES, None))
    found = [storages_of(mapped, op, calls) for op in muls]
    assert [s.offsets[0] for s in found if s is not None] == [0, STATE, 2 * STATE]
    assert len({s.inputs[0] for s in found if s is not None}) == 1  # one storage
