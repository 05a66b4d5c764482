"""The token permutation's routing, recorded in a model run and replayed: ``npu_moe_token_permute``'s
expert ids and ``npu_moe_token_unpermute``'s sorted indices reach the ``MoeTokenPermute`` and
``MoeTokenUnpermute`` rows of an Ascend profile, and the replays build exactly those.

The operators run on the CPU through torch_npu's real schemas (``tests/npu_standin.py``); the
profile is built from the real Level1 files as ``tests/test_ascend_input_values.py`` builds its
own (``linked_row``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.profiler as tp

from perf_plugin.capture import capture_input_values
from perf_plugin.database.schema import INPUT_VALUES, INPUT_VALUES_SOURCE
from perf_plugin.database.shapes import parse_shape_cell
from perf_plugin.ingest.value_sources import source_of
from perf_plugin.replay.base import CaseBuildError
from tests.kernels.support import kernel_row, replay_of
from tests.npu_standin import TORCH_NPU, standin
from tests.test_ascend_input_values import linked_row

pytestmark = pytest.mark.skipif(standin() is None, reason="a real torch_npu defines these operators")

TOKENS, HIDDEN, TOP_K = 16, 8, 2
# A skewed routing: expert 0 takes every token's first slot, experts 1-3 share the second.
IDS = torch.stack([torch.zeros(TOKENS, dtype=torch.int32), 1 + torch.arange(TOKENS, dtype=torch.int32) % 3], dim=1)
PERMUTE_CELLS = {"Type": "MoeTokenPermute", "Input Shapes": f'"{TOKENS},{HIDDEN};{TOKENS},{TOP_K}"',
                 "Input Data Types": "DT_BF16;INT32", "Input Formats": "FORMAT_ND;FORMAT_ND",
                 "Output Shapes": f'"{TOKENS * TOP_K},{HIDDEN};{TOKENS * TOP_K}"',
                 "Output Data Types": "DT_BF16;INT32", "Output Formats": "FORMAT_ND;FORMAT_ND"}
UNPERMUTE_CELLS = {"Type": "MoeTokenUnpermute",
                   "Input Shapes": f'"{TOKENS * TOP_K},{HIDDEN};{TOKENS * TOP_K};{TOKENS},{TOP_K}"',
                   "Input Data Types": "DT_BF16;INT32;DT_BF16", "Input Formats": "FORMAT_ND;FORMAT_ND;FORMAT_ND",
                   "Output Shapes": f'"{TOKENS},{HIDDEN}"', "Output Data Types": "DT_BF16", "Output Formats": "FORMAT_ND"}


def _permute_in_capture(tmp_path: Path) -> tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(capture token, tokens, permuted, sorted_indices) of one captured ``npu_moe_token_permute``."""
    tokens = torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(0)).bfloat16()
    with tp.profile(activities=[tp.ProfilerActivity.CPU], record_shapes=True):
        with capture_input_values(tmp_path / "prof" / "rank0.values.json") as capture:
            permuted, order = TORCH_NPU.npu_moe_token_permute(tokens, IDS)
    (call,) = capture.values.calls.values()
    assert call.values == {1: tuple(IDS.flatten().tolist())}
    return capture.values.token, tokens, permuted, order


def test_a_permutation_row_gets_its_calls_routing_and_the_replay_gathers_what_the_model_did(tmp_path: Path) -> None:
    token, tokens, permuted, order = _permute_in_capture(tmp_path)
    row = linked_row(tmp_path, token, PERMUTE_CELLS, "aclnnMoeTokenPermute_MoeTokenPermute_MoeTokenPermute",
                     "npu::npu_moe_token_permute")
    assert parse_shape_cell(row[INPUT_VALUES])[1] == tuple(IDS.flatten().tolist())
    assert row[INPUT_VALUES_SOURCE] == "measured"
    replay = replay_of("MoeTokenPermute")
    built_tokens, indices, k, rows = replay.make_inputs(kernel_row("MoeTokenPermute", row), torch.device("cpu"),
                                                        torch.Generator().manual_seed(0))
    assert torch.equal(indices, IDS) and (k, rows) == (TOP_K, TOKENS * TOP_K)
    # the same rows per expert and the same tokens gathered: only the drawn token values differ
    replayed, replayed_order = replay.run(tokens, indices, k, rows)
    assert torch.equal(replayed, permuted) and torch.equal(replayed_order, order)


def test_an_unpermutation_row_gets_its_calls_sorted_indices(tmp_path: Path) -> None:
    _, tokens, permuted, order = _permute_in_capture(tmp_path / "permute")
    probs = torch.full((TOKENS, TOP_K), 0.5).bfloat16()
    with tp.profile(activities=[tp.ProfilerActivity.CPU], record_shapes=True):
        with capture_input_values(tmp_path / "prof" / "rank0.values.json") as capture:
            restored = TORCH_NPU.npu_moe_token_unpermute(permuted, order, probs)
    assert torch.allclose(restored.float(), tokens.float(), atol=1e-2)
    row = linked_row(tmp_path, capture.values.token, UNPERMUTE_CELLS,
                     "aclnnMoeTokenUnpermute_MoeTokenUnpermute_MoeTokenUnpermute", "npu::npu_moe_token_unpermute")
    assert parse_shape_cell(row[INPUT_VALUES])[1] == tuple(order.tolist())
    _, built_order, _ = replay_of("MoeTokenUnpermute").make_inputs(
        kernel_row("MoeTokenUnpermute", row), torch.device("cpu"), torch.Generator().manual_seed(0))
    assert torch.equal(built_order.int(), order)


def test_without_a_capture_the_row_says_which_routing_it_replays() -> None:
    assert source_of("MoeTokenPermute", "", PERMUTE_CELLS["Input Shapes"]) == \
        "default: top-k ids drawn uniformly over 256 experts"
    row = kernel_row("MoeTokenPermute", PERMUTE_CELLS)
    _, indices, _, _ = replay_of("MoeTokenPermute").make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert indices.shape == (TOKENS, TOP_K) and all(len(set(pair)) == TOP_K for pair in indices.tolist())


@pytest.mark.parametrize(("cells", "values", "message"), [
    (PERMUTE_CELLS, '";1,2,3"', "holds 3 values, not 32"),
    (UNPERMUTE_CELLS, '";' + ",".join(["0"] * 32) + '"', "slot 1 is not a permutation of the 32 rows"),
])
def test_a_recorded_routing_that_cannot_be_the_models_is_refused(cells: dict[str, str], values: str,
                                                                 message: str) -> None:
    row = kernel_row(cells["Type"], {**cells, INPUT_VALUES: values})
    with pytest.raises(CaseBuildError, match=message):
        replay_of(cells["Type"]).make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
