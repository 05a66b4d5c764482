"""Whether a producer wrote an input into lines out of the cache: ingest's ``Profiling Input Block
Reuse Distance(B)`` (the bytes moved between the last use of the input's storage and its write),
and ``produced`` writing such an input without reading it where its bytes end inside a sector."""

from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path

import pytest
import torch

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.schema import PROFILING_INPUT_BLOCK_REUSE, PROFILING_INPUT_REUSE
from perf_plugin.ingest.execution_trace import SlotStorages, TracedTensor
from perf_plugin.ingest.input_reuse import input_reuse
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.replay.cache_modes import produce_inputs
from perf_plugin.replay.cold_inputs import CacheSplit, evicted_writes
from perf_plugin.replay.tensors import KernelRow, kernel_row_from_cells
from perf_plugin.trace.mapped import MappedOp, Slot

CUDA = Path(__file__).parent / "fixtures" / "cuda"
TRACE = CUDA / "shared_expert_trace.json"
WEIGHT = 4096 * 1024 * 2  # bytes of the (4096, 1024) bf16 weight the middle operator reads


def _op(inputs: list[tuple[int, ...]], outputs: list[tuple[int, ...]]) -> MappedOp:
    return MappedOp("Op", tuple(Slot(s, "DT_BF16") for s in inputs), tuple(Slot(s, "DT_BF16") for s in outputs))


def test_an_input_written_into_memory_unused_since_a_weight_streamed_has_that_block_distance() -> None:
    """a = A(); B(weight) -> b; c = C() into a's freed block; D(c): c's lines were last used by A."""
    ops = [_op([], [(1, 1)]), _op([(4096, 1024)], [(1, 8)]), _op([], [(1, 1)]), _op([(1, 1)], [(1, 1)])]
    storages = [SlotStorages((), (TracedTensor(7, (1, 1)),)), SlotStorages((3,), (TracedTensor(8, (1, 8)),)),
                SlotStorages((), (TracedTensor(7, (1, 1)),)), SlotStorages((7,), ())]
    reuse = input_reuse(ops, storages=storages)
    (block,) = reuse.block_reuse[3]
    assert WEIGHT < block < WEIGHT + 64
    assert reuse.distances[3][0] < 16  # the input itself was written just before


def test_a_read_of_the_block_since_is_its_last_use_and_unnamed_inputs_have_none() -> None:
    ops = [_op([], [(1, 1)]), _op([(4096, 1024)], [(1, 8)]), _op([(1, 1)], [(1, 1)]), _op([], [(1, 1)]),
           _op([(1, 1)], [(1, 1)])]
    storages = [SlotStorages((), (TracedTensor(7, (1, 1)),)), SlotStorages((3,), (TracedTensor(8, (1, 8)),)),
                SlotStorages((7,), (TracedTensor(9, (1, 1)),)), SlotStorages((), (TracedTensor(7, (1, 1)),)),
                SlotStorages((7,), ())]
    assert input_reuse(ops, storages=storages).block_reuse[4][0] < 16  # read by the third, just before
    assert all(math.isinf(d) for per_op in input_reuse(ops).block_reuse for d in per_op)  # no storages named


def _block_cells(database: Path) -> dict[tuple[str, str], str]:
    cells = {}
    for path in database.glob("*.csv"):
        with path.open(newline="") as handle:
            for row in csv.DictReader(handle):
                cells[(path.stem, row["Input Shapes"].strip('"'))] = row.get(PROFILING_INPUT_BLOCK_REUSE, "")
    return cells


def test_ingest_writes_the_block_distances_an_execution_trace_names(tmp_path: Path) -> None:
    """The fixture's shared-expert gate (H200): ``sigmoid`` reads the gate's one-element output,
    written into a block last used before the routed experts' down projections (6 MB)."""
    ingest_path(TRACE, tmp_path / "with")
    cells = _block_cells(tmp_path / "with")
    assert 2**20 < float(cells[("aten.sigmoid", "1,1")]) < 2**23
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(TRACE, alone / "run.json")  # no execution trace beside it
    ingest_path(alone / "run.json", tmp_path / "without")
    assert not any(_block_cells(tmp_path / "without").values())


def _row(blocks: str) -> KernelRow:
    cells = {"Input Shapes": '"1,1,1;1,1,8"', "Input Data Types": "FLOAT;FLOAT", "Input Formats": "ND;ND",
             "Output Shapes": '"1,1,8"', "Output Data Types": "FLOAT", "Output Formats": "ND",
             PROFILING_INPUT_REUSE: "4;4", PROFILING_INPUT_BLOCK_REUSE: blocks}
    return kernel_row_from_cells("Mul", cells)


@pytest.mark.parametrize(("blocks", "evicted"), [("9000;100", [(1, 1, 1)]), ("8000;-", [(1, 1, 1)]),
                                                  ("7999;9000", [(1, 1, 8)]), ("-;-", []), ("", [])])
def test_the_inputs_written_into_evicted_lines_are_those_0_8_of_a_cache_or_more_since_their_blocks_use(
    blocks: str, evicted: list[tuple[int, ...]]
) -> None:
    statistic, x = torch.ones(1, 1, 1), torch.ones(1, 1, 8)
    assert [tuple(t.shape) for t in evicted_writes(_row(blocks), (statistic, x), cache_bytes=10000)] == evicted


def test_a_bad_block_cell_names_its_column() -> None:
    with pytest.raises(DatabaseError, match=r"Block Reuse"):
        evicted_writes(_row("x;1"), (torch.ones(1, 1, 1), torch.ones(1, 1, 8)), cache_bytes=10000)


def test_produced_writes_an_evicted_sub_sector_input_without_reading_it_and_multiplies_the_rest() -> None:
    """Both inputs were written into evicted lines; only the 4-byte statistic ends inside a sector
    (the 32-byte row is whole sectors), so only it is copied from its clone."""
    statistic, x = torch.full((1, 1, 1), 3.0), torch.full((1, 1, 8), 2.0)
    split = CacheSplit.of(_row("9000;9000"), (statistic, x), 10000, parameters=())
    assert len(split.written_evicted) == 2
    produce = produce_inputs(lambda: None, split.rewritten((statistic, x)), split.evicted_storages())
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        produce()
    rewrites = [(e.name, e.input_shapes[0]) for e in prof.function_events
                if e.name in ("aten::mul_", "aten::copy_") and e.input_shapes[0]]  # not the scalar's own copy
    assert rewrites == [("aten::mul_", [32]), ("aten::copy_", [4])]
    assert statistic.item() == 3.0 and bool((x == 2.0).all())
    assert CacheSplit.of(_row(""), (statistic, x), 10000, parameters=()).written_evicted == ()  # no evidence


def test_a_placements_copy_keeps_which_inputs_were_written_into_evicted_lines() -> None:
    statistic, x = torch.full((1, 1, 1), 3.0), torch.full((1, 1, 8), 2.0)
    split = CacheSplit.of(_row("9000;100"), (statistic, x), 10000, parameters=())
    copy = (statistic.clone(), x.clone())
    moved = split.for_copy((statistic, x), copy)
    assert [t.data_ptr() for t in moved.written_evicted] == [copy[0].data_ptr()]
    assert [s.data_ptr() for s in moved.evicted_storages()] == [copy[0].data_ptr()]
