"""A row's calls that found their inputs in different places: the ``Profiling Input Reuse Calls(B)``
cell ingest writes, the states a replay reads from it, and the repeats that replay each state on
its share of the calls."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.reuse_calls_cell import EIGHTHS, parse_reuse_calls_cell, reuse_calls_cell
from perf_plugin.database.schema import PROFILING_INPUT_REUSE, PROFILING_INPUT_REUSE_CALLS
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.replay.cold_inputs import CacheSplit, call_states
from perf_plugin.replay.repeat_mix import in_proportion
from perf_plugin.replay.registry import get_replay
from perf_plugin.replay.tensors import KernelRow, kernel_row_from_cells
from perf_plugin.results import CaseRef
from perf_plugin.run.cases import STATUS_READY, Case

TRACE = Path(__file__).parent / "fixtures" / "cuda" / "shared_expert_trace.json"

# A decode layer's four rotary ``mul`` calls (queries and keys by ``cos`` and ``sin``), as an H200
# profile of a Granite model measured them: the queries' first call reads both operands from
# memory, the keys' calls find the tables the queries' calls just read.
ROTARY_CALLS = [(67149824.0, 100869400.0), (12288.0, 100909848.0), (33661440.0, 78208.0), (12288.0, 78208.0)]


def test_each_eighth_of_the_calls_holds_the_distance_at_its_middle() -> None:
    cell = reuse_calls_cell(ROTARY_CALLS)
    assert cell == ("12288,12288,12288,12288,33661440,33661440,67149824,67149824;"
                    "78208,78208,78208,78208,100869400,100869400,100909848,100909848")
    assert parse_reuse_calls_cell(cell)[1] == (78208.0,) * 4 + (100869400.0,) * 2 + (100909848.0,) * 2


def test_calls_that_agree_write_no_cell_and_a_slot_that_agrees_is_one_token() -> None:
    assert reuse_calls_cell([(100.0, math.inf)] * 5) == ""
    assert reuse_calls_cell([(100.0, math.inf), (100.0, 5.0), (100.0, math.inf)]) == "100;5,5,5,-,-,-,-,-"
    assert parse_reuse_calls_cell("100;-") == ((100.0,) * EIGHTHS, (math.inf,) * EIGHTHS)
    assert parse_reuse_calls_cell("") == ()


def test_a_call_of_fewer_slots_counts_its_missing_slots_as_no_producer() -> None:
    assert reuse_calls_cell([(1.0, 2.0), (1.0,)]) == "1;2,2,2,2,-,-,-,-"


@pytest.mark.parametrize(("cell", "named"), [("1,2,3;4", "slot 0"), ("4;x", "slot 1"), ("4;-1", "slot 1")])
def test_a_bad_cell_names_its_slot(cell: str, named: str) -> None:
    with pytest.raises(DatabaseError, match=named):
        parse_reuse_calls_cell(cell)


def test_ingest_of_a_real_trace_writes_the_calls_of_a_row_whose_inputs_moved(tmp_path: Path) -> None:
    """The fixture's MoE block (H200): of the three ``[1,1024] + [1,1024]`` adds, one reads an
    operand written just before and two one written before the routed experts streamed theirs."""
    ingest_path(TRACE, tmp_path)
    with (tmp_path / "Add.csv").open(newline="") as handle:
        (row,) = [r for r in csv.DictReader(handle) if r["Input Shapes"].strip('"') == "1,1024;1,1024"]
    first, second = parse_reuse_calls_cell(row[PROFILING_INPUT_REUSE_CALLS])
    assert row["Profiling Count"] == "3"
    assert sum(d < 65536 for d in first) == 3 and sum(d > 2**20 for d in first) == 5  # 1 call of 3, 2 of 3
    assert len(set(second)) == 1 and str(int(second[0])) == row[PROFILING_INPUT_REUSE].split(";")[1]


def _rotary_row(cells: dict[str, str]) -> KernelRow:
    base = {"Input Shapes": '"1,32,1,128;1,1,1,128"', "Input Data Types": "DT_BF16;DT_BF16",
            "Input Formats": "ND;ND", "Output Shapes": '"1,32,1,128"', "Output Data Types": "DT_BF16",
            "Output Formats": "ND"}
    return kernel_row_from_cells("Mul", {**base, **cells})


def test_the_states_of_a_rows_calls_and_their_shares() -> None:
    row = _rotary_row({PROFILING_INPUT_REUSE: "12288;78208", PROFILING_INPUT_REUSE_CALLS: reuse_calls_cell(ROTARY_CALLS)})
    states = dict(call_states(row, cache_bytes=60_000_000))  # 48 MB kept
    assert states == {(1.0, 1.0): 0.5, (1.0, 0.0): 0.25, (0.0, 0.0): 0.25}


def test_a_row_without_the_cell_or_with_one_of_another_layout_has_its_medians_state() -> None:
    row = _rotary_row({PROFILING_INPUT_REUSE: "12288;78208"})
    assert call_states(row, cache_bytes=60_000_000) == [((1.0, 1.0), 1.0)]
    other_layout = _rotary_row({PROFILING_INPUT_REUSE: "12288;78208", PROFILING_INPUT_REUSE_CALLS: "1;2;3"})
    assert call_states(other_layout, cache_bytes=60_000_000) == [((1.0, 1.0), 1.0)]


def test_a_bad_calls_cell_names_its_column() -> None:
    row = _rotary_row({PROFILING_INPUT_REUSE: "12288;78208", PROFILING_INPUT_REUSE_CALLS: "12288;x"})
    with pytest.raises(DatabaseError, match=r"Profiling Input Reuse Calls\(B\).*slot 1"):
        call_states(row, cache_bytes=60_000_000)


def test_steps_in_proportion_interleave_by_weight() -> None:
    ran: list[str] = []
    step = in_proportion([(lambda: ran.append("a"), 0.75), (lambda: ran.append("b"), 0.25)])
    assert step is not None
    for _ in range(8):
        step()
    assert ran == ["a", "a", "b", "a"] * 2
    only = lambda: None  # noqa: E731
    assert in_proportion([(only, 1.0)]) is only
    with pytest.raises(ValueError):
        in_proportion([(only, 1.0), (None, 0.0)])


def test_the_runners_repeats_rewrite_each_input_on_the_calls_that_found_it_cached() -> None:
    """Of eight repeats, the first input is rewritten on the six the model's calls found it
    cached (three of four within 0.8 of the 10 kB cache), the second on the four."""
    from tests.test_cache_modes import _runner

    calls = [(9000.0, 9000.0), (10.0, 9000.0), (5000.0, 10.0), (10.0, 10.0)]
    row = _rotary_row({PROFILING_INPUT_REUSE: "10;10", PROFILING_INPUT_REUSE_CALLS: reuse_calls_cell(calls)})
    q, table = torch.ones(1, 32, 1, 128, dtype=torch.bfloat16), torch.ones(1, 1, 1, 128, dtype=torch.bfloat16)
    assert len(CacheSplit.mixture(row, (q, table), 10000, parameters=())) == 3
    replay = get_replay("Mul")
    assert replay is not None
    case = Case(CaseRef("rotary", "Mul", "Mul.csv", 2, "Mul"), STATUS_READY, row=row, profiled_us=3.0)
    before, _ = _runner("produced", 10000)._repeat_steps(case, replay, (q, table), "produced", seed=0)
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        for _ in range(8):
            before()
    rewritten = [tuple(e.input_shapes[0]) for e in prof.function_events if e.name == "aten::mul_"]
    assert rewritten.count((32 * 128 * 2,)) == 6 and rewritten.count((128 * 2,)) == 4
