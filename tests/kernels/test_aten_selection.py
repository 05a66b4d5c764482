"""``aten.topk`` / ``aten.sort`` rows from real traces are verified as every correct kernel agrees:
a top-k's values in any order (``sorted=False``), any of several tied indices."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from perf_plugin.ingest.pipeline import ingest_profiler
from perf_plugin.replay.kernels.aten_selection import AtenSelectionReplay
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import kernel_row, replay_of, replay_on_cpu


def traced_rows(tmp_path: Path, call: object, kernel_type: str) -> list[dict[str, str]]:
    """The rows a real CPU profile of ``call`` gives ``kernel_type``."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        call()  # type: ignore[operator]
    ingest_profiler(prof, tmp_path / "db")
    with (tmp_path / "db" / f"{kernel_type}.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def grouped_scores() -> torch.Tensor:
    # DeepSeek-V3's group selection: top-k of group scores, unsorted; BF16 scores tie often
    return torch.rand(64, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)


@pytest.mark.parametrize("sorted_", [False, True])
def test_a_traced_topk_replays_and_passes_whatever_the_order(tmp_path: Path, sorted_: bool) -> None:
    scores = grouped_scores()
    (row,) = traced_rows(tmp_path, lambda: torch.topk(scores, k=3, dim=-1, sorted=sorted_), "aten.topk")
    assert isinstance(replay_of("aten.topk"), AtenSelectionReplay)
    replay_on_cpu("aten.topk", row)


def _case(tmp_path: Path) -> tuple[AtenSelectionReplay, object, tuple[object, ...]]:
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 0.5, 3.0]], dtype=torch.bfloat16)
    (cells,) = traced_rows(tmp_path, lambda: torch.topk(x, k=2, sorted=False), "aten.topk")
    replay, row = AtenSelectionReplay(), kernel_row("aten.topk", cells)
    name, overload, template, tensors, device = replay.make_inputs(row, torch.device("cpu"), torch.Generator())
    return replay, row, (name, overload, template, (x,), device)


def test_ties_and_any_order_pass_and_wrong_selections_fail(tmp_path: Path) -> None:
    replay, row, args = _case(tmp_path)
    reference = replay.reference(*args)
    three = torch.tensor([[3.0, 3.0]], dtype=torch.bfloat16)
    # other tied positions, in another order: right
    verify_outputs(replay, row, (three, torch.tensor([[5, 1]])), reference, args)
    verify_outputs(replay, row, (three, torch.tensor([[2, 5]])), reference, args)
    # positionally, the same right answer would have failed
    with pytest.raises(VerificationError):
        verify_outputs(replay, row, (three, torch.tensor([[5, 1]])), (three, torch.tensor([[1, 2]])))
    with pytest.raises(VerificationError, match="repeats"):
        verify_outputs(replay, row, (three, torch.tensor([[1, 1]])), reference, args)
    with pytest.raises(VerificationError):  # an index whose value is not among the top 2
        verify_outputs(replay, row, (three, torch.tensor([[1, 3]])), reference, args)
    with pytest.raises(VerificationError):  # wrong values
        verify_outputs(replay, row, (torch.tensor([[3.0, 2.0]], dtype=torch.bfloat16), torch.tensor([[1, 2]])),
                       reference, args)
    with pytest.raises(VerificationError, match="do not address"):
        verify_outputs(replay, row, (three, torch.tensor([[1, 9]])), reference, args)


def test_a_traced_sort_with_ties_passes(tmp_path: Path) -> None:
    experts = torch.randint(0, 4, (128,), generator=torch.Generator().manual_seed(0))  # token-expert ids: all ties
    (row,) = traced_rows(tmp_path, lambda: torch.sort(experts), "Sort")
    replay_on_cpu("Sort", row)
