"""Placements of a case's inputs cycled through the repeats of the modes with a step per repeat."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import perf_plugin.run.runner as runner_module
from perf_plugin.replay.placements import PlacementCycle, matching_tensors, placed_copies, placement_count
from perf_plugin.results import CaseRef
from perf_plugin.run.cases import STATUS_READY, Case
from perf_plugin.run.runner import ReplayRunner
from tests.test_cache_modes import SmallCacheCpu, _row_with_reuse


@pytest.mark.parametrize(
    ("wanted", "input_bytes", "free", "expected"),
    [
        (3, 100, 10_000, 3),  # room for every copy
        (3, 1000, 4000, 2),  # a quarter of the free memory holds one copy
        (3, 1000, 3000, 1),  # and here none
        (3, 100, None, 1),  # free memory unknown: the inputs as built
        (1, 100, 10_000, 1),
        (3, 0, 10_000, 1),  # no tensors to place
    ],
)
def test_placement_count_keeps_the_copies_within_a_quarter_of_free_memory(
    wanted: int, input_bytes: int, free: int | None, expected: int
) -> None:
    assert placement_count(wanted, input_bytes, free) == expected


def test_placed_copies_have_storage_of_their_own_and_equal_values() -> None:
    base = torch.arange(12, dtype=torch.float32)
    args = (base.reshape(3, 4), base.reshape(3, 4).t(), 2.0)
    sets = placed_copies(args, 3)
    assert sets[0] is args
    pointers = {tensor.untyped_storage().data_ptr() for s in sets for tensor in s[:2]}
    assert len(pointers) == 5  # the two original inputs share one storage; each copy's tensors have their own
    for copy in sets[1:]:
        assert torch.equal(copy[0], args[0]) and torch.equal(copy[1], args[1]) and copy[2] == 2.0
        assert copy[1].stride() == args[1].stride()


def test_matching_tensors_picks_the_same_positions_in_a_copy() -> None:
    weight, x = torch.ones(4), torch.zeros(2)
    args = (x, [weight, 3])
    copy = placed_copies(args, 2)[1]
    assert matching_tensors((weight,), args, copy) == (copy[1][0],)
    assert matching_tensors((), args, copy) == ()
    transposed = (x, weight.view(2, 2).t())  # a view of the chosen tensor's storage counts too
    assert matching_tensors((weight,), transposed, placed_copies(transposed, 2)[1])[0].shape == (2, 2)


def test_the_step_before_each_repeat_moves_to_the_next_set_and_runs_its_own_step() -> None:
    events: list[str] = []
    cycle = PlacementCycle([("a",), ("b",), ("c",)])
    run_once = cycle.call(lambda name: events.append(f"run {name}"))
    before = cycle.steps([lambda: events.append("step a"), None, lambda: events.append("step c")])
    run_once()  # a warm-up: on the current set
    for _ in range(4):
        before()
        run_once()
    assert events == ["run a", "run b", "step c", "run c", "step a", "run a", "run b"]
    with pytest.raises(ValueError, match="2 steps for 3 input sets"):
        cycle.steps([None, None])


class SteppingCollector:
    """Runs each repeat as the CUDA collector does with a step per repeat: the step, then the call."""

    kind = "in-process"

    def measure(self, ref: CaseRef, run_once: Any, repeats: int, before_repeat: Any = None) -> None:
        for _ in range(repeats):
            before_repeat()
            run_once()


def test_produced_repeats_cycle_placements_each_rewritten_before_its_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The norm row's weight slot was read from memory in the model (no producer): each step
    rewrites the activation of the placement the next call reads, never the weight, and the
    calls cycle through three placements."""
    calls: list[tuple[int, int]] = []
    rewrites: list[list[int]] = []

    def recording_launcher(backend: Any, replay: Any, row: Any, args: tuple[Any, ...]) -> tuple[Any, tuple[Any, ...]]:
        def run(weight: torch.Tensor, x: torch.Tensor) -> Any:
            calls.append((weight.data_ptr(), x.data_ptr()))
            return replay.run(weight, x)

        return run, args

    def recording_produce(evict: Any, storages: list[torch.Tensor], written_evicted: Any = ()) -> Any:
        return lambda: rewrites.append([storage.data_ptr() for storage in storages])

    monkeypatch.setattr(runner_module, "case_launcher", recording_launcher)
    monkeypatch.setattr(runner_module, "produce_inputs", recording_produce)
    runner = ReplayRunner(SmallCacheCpu(1 << 20), collector=SteppingCollector(), repeat_count=6, warmup_count=0,  # type: ignore[arg-type]
                          cache_mode="produced", input_placements=3)
    runner.run(Case(CaseRef("norm", "Mul", "Mul.csv", 2, "Mul"), STATUS_READY, row=_row_with_reuse("-;8192"), profiled_us=5.0))
    timed = calls[1:]  # the first call is the verified one
    assert len(timed) == 6 and len(set(timed)) == 3
    assert timed[:3] == timed[3:]  # a cycle of three
    assert [rewritten for rewritten in rewrites] == [[x] for _, x in timed]  # the activation of the call that follows


def test_one_placement_where_the_mode_has_no_step_or_the_call_is_bound() -> None:
    runner = ReplayRunner(SmallCacheCpu(1 << 20), collector=None, repeat_count=2, warmup_count=0,  # type: ignore[arg-type]
                          cache_mode="produced", input_placements=3)
    args = (torch.ones(8), torch.ones(8))
    assert runner._placements(args, args, "rotate") is None
    assert runner._placements(args, args, "warm") is None
    assert runner._placements(args, (), "produced") is None  # an NPU API call bound to its inputs
    cycle = runner._placements(args, args, "cold")
    assert cycle is not None and len(cycle.input_sets) == 3
    runner.input_placements = 1
    assert runner._placements(args, args, "produced") is None
