"""ReshapeAndCacheNdKernel and ScatterNdUpdate: the NPU calls, the portable cache writes, the checks.

No public row of either kernel type exists (the database CSVs of Ascend/msmodeling are Git LFS
pointers), so the rows here are written in the layout msmodeling's replay scripts parse:
``ReshapeAndCacheNdKernel_run.py`` (five inputs ``key;value;key_cache;value_cache;slot_mapping``,
slots INT32) and ``ScatterNdUpdate_run.py`` (``data;indices;updates``, indices ``[N,1]`` INT32).
The shapes are the examples of ``tools/perf_data_collection/README_op_microbench.md``
(``"1,1,64;1,1,64;16,128,1,64;16,128,1,64;1"``, ``"222592,128;3,1;3,128"``,
``"226048,128;102,1;102,128"``) plus GQA and MLA variants of the same layout.
"""

from __future__ import annotations

import csv
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from perf_plugin.backends.cpu import CpuBackend
from perf_plugin.profiling.msprof import MsprofCollector
from perf_plugin.replay.api_call import bind_call, resolve_api
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.kv_cache import ReshapeAndCacheReplay
from perf_plugin.replay.registry import get_replay
from perf_plugin.replay.verify import VerificationError, verify_outputs
from perf_plugin.run.cases import load_case_set
from perf_plugin.run.runner import CaseFailure, ReplayRunner
from tests.kernels.support import (
    kernel_row,
    meta_outputs,
    npu_call_of,
    op_mapping_api,
    replay_on_cpu,
    shapes,
)

IDENTITY = ("Input Shapes", "Input Data Types", "Input Formats", "Output Shapes", "Output Data Types", "Output Formats")


def cells(inputs: str, in_types: str, outputs: str, out_types: str) -> dict[str, str]:
    count = lambda types_: len(types_.split(";"))  # noqa: E731
    return {
        "OP State": "dynamic", "Accelerator Core": "AI_VECTOR_CORE",
        "Input Shapes": f'"{inputs}"', "Input Data Types": in_types, "Input Formats": ";".join(["ND"] * count(in_types)),
        "Output Shapes": f'"{outputs}"', "Output Data Types": out_types, "Output Formats": ";".join(["ND"] * count(out_types)),
    }  # fmt: skip


CACHE_ROWS = {
    "readme": cells("1,1,64;1,1,64;16,128,1,64;16,128,1,64;1", "DT_BF16;DT_BF16;DT_BF16;DT_BF16;INT32",
                    "16,128,1,64;16,128,1,64", "DT_BF16;DT_BF16"),
    "gqa_prefill": cells("96,8,128;96,8,128;40,128,8,128;40,128,8,128;96", "DT_BF16;DT_BF16;DT_BF16;DT_BF16;INT32",
                         "40,128,8,128;40,128,8,128", "DT_BF16;DT_BF16"),
    "mla": cells("4,1,512;4,1,64;16,128,1,512;16,128,1,64;4", "DT_BF16;DT_BF16;DT_BF16;DT_BF16;INT32",
                 "16,128,1,512;16,128,1,64", "DT_BF16;DT_BF16"),
}  # fmt: skip
SCATTER_ROWS = {
    "readme": cells("222592,128;3,1;3,128", "DT_BF16;INT32;DT_BF16", "222592,128", "DT_BF16"),
    "two_dims": cells("16,128,64;5,2;5,64", "FLOAT16;INT64;FLOAT16", "16,128,64", "FLOAT16"),
}
LARGE_SCATTER = cells("226048,128;102,1;102,128", "DT_BF16;INT32;DT_BF16", "226048,128", "DT_BF16")


def stand_in_torch_npu(shift: int = 0) -> types.ModuleType:
    """The two torch_npu entry points, on the CPU, with their documented signatures; ``shift``
    moves every write by that many slots (a wrong kernel)."""
    module = types.ModuleType("torch_npu")

    def _npu_reshape_and_cache(key: Any, value: Any, key_cache: Any, value_cache: Any, slot_indices: Any) -> None:
        slots = (slot_indices.long() + shift) % (key_cache.shape[0] * key_cache.shape[1])
        key_cache.view(-1, *key.shape[1:])[slots] = key
        value_cache.view(-1, *value.shape[1:])[slots] = value

    def npu_scatter_nd_update_(data: Any, indices: Any, updates: Any) -> Any:
        columns = [(column.long() + shift) % data.shape[d] for d, column in enumerate(indices.unbind(-1))]
        data[tuple(columns)] = updates
        return data

    module._npu_reshape_and_cache = _npu_reshape_and_cache  # type: ignore[attr-defined]
    module.npu_scatter_nd_update_ = npu_scatter_nd_update_  # type: ignore[attr-defined]
    module.npu_format_cast = lambda tensor, acl_format: tensor  # type: ignore[attr-defined]
    return module


def npu_outputs(kernel_type: str, row_cells: dict[str, str], torch_npu: types.ModuleType) -> None:
    """Build the NPU call, bind it to the stand-in and verify what it returns against the reference."""
    replay = get_replay(kernel_type)
    assert replay is not None
    row = kernel_row(kernel_type, row_cells)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    call = replay.npu_call(row, args)
    assert call is not None
    function = resolve_api(call.api, lambda name: torch_npu if name == "torch_npu" else __import__(name))
    outputs = bind_call(call, function, lambda tensor, acl_format: tensor)()
    verify_outputs(replay, row, outputs, replay.reference(*args))


# ----------------------------------------------------------------------------- ReshapeAndCacheNdKernel
@pytest.mark.parametrize("name", CACHE_ROWS)
def test_reshape_and_cache_calls_the_atb_api_with_vllm_ascends_keywords(name: str) -> None:
    row_cells = CACHE_ROWS[name]
    call = npu_call_of("ReshapeAndCacheNdKernel", row_cells)
    assert call.api == op_mapping_api("ReshapeAndCacheNdKernel") == "atb._npu_reshape_and_cache"
    assert call.args == () and list(call.kwargs) == ["key", "value", "key_cache", "value_cache", "slot_indices"]
    slots_cell = row_cells["Input Shapes"].strip('"').split(";")
    assert [",".join(map(str, shapes(call.kwargs[k]))) for k in call.kwargs] == slots_cell
    slots = call.kwargs["slot_indices"]
    capacity = call.kwargs["key_cache"].shape[0] * call.kwargs["key_cache"].shape[1]
    assert slots.dtype == torch.int32 and len(set(slots.tolist())) == len(slots) and 0 <= int(slots.min()) <= int(slots.max()) < capacity
    # the API returns nothing: the row's outputs are the two caches it wrote
    key_cache, value_cache = call.select(None)
    assert key_cache is call.kwargs["key_cache"] and value_cache is call.kwargs["value_cache"]


@pytest.mark.parametrize("name", CACHE_ROWS)
def test_reshape_and_cache_portable_writes_match_the_reference(name: str) -> None:
    (key_cache, value_cache), _ = replay_on_cpu("ReshapeAndCacheNdKernel", CACHE_ROWS[name])
    written = (key_cache != 2.0).flatten(2).any(-1).sum()  # slots no longer holding the sentinel
    assert int(written) == int(CACHE_ROWS[name]["Input Shapes"].strip('"').split(";")[-1])


@pytest.mark.parametrize("name", CACHE_ROWS)
def test_reshape_and_cache_stand_in_npu_call_verifies(name: str) -> None:
    npu_outputs("ReshapeAndCacheNdKernel", CACHE_ROWS[name], stand_in_torch_npu())


def test_a_kernel_writing_the_wrong_slots_fails_verification() -> None:
    with pytest.raises(VerificationError, match="exact match required"):
        npu_outputs("ReshapeAndCacheNdKernel", CACHE_ROWS["gqa_prefill"], stand_in_torch_npu(shift=1))


class _StrayWrite(ReshapeAndCacheReplay):
    """Writes the right slots, and one more: the reference rebuilds the caches from the sentinel
    instead of reading the ones the run wrote, so it notices."""

    def run(self, key: Any, value: Any, key_cache: Any, value_cache: Any, slot_indices: Any) -> Any:
        super().run(key, value, key_cache, value_cache, slot_indices)
        key_cache.view(-1)[-1] = 0
        return key_cache, value_cache


def test_a_write_outside_the_slots_fails_verification() -> None:
    replay = _StrayWrite()
    row = kernel_row("ReshapeAndCacheNdKernel", CACHE_ROWS["readme"])
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    outputs = replay.run(*args)
    with pytest.raises(VerificationError, match="output 0 .* 1 of 131072 elements differ"):
        verify_outputs(replay, row, outputs, ReshapeAndCacheReplay().reference(*args))


def test_the_runner_launches_the_api_for_verification_warmup_and_repeats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On an NPU backend the case runs the API every time, and its outputs (the caches it wrote)
    are what the runner verifies."""

    class StandInNpu(CpuBackend):
        name = "npu"
        launches_named_apis = True

    module = stand_in_torch_npu()
    calls: list[int] = []
    write = module._npu_reshape_and_cache

    def counted(*args: Any, **kwargs: Any) -> None:
        calls.append(1)
        write(*args, **kwargs)

    module._npu_reshape_and_cache = counted  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    columns = ("OP State", "Accelerator Core") + IDENTITY
    with (tmp_path / "ReshapeAndCacheNdKernel.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerow([CACHE_ROWS["mla"][c] for c in columns])
    (case,) = [c for c in load_case_set(tmp_path, get_replay, named_apis=True).cases if c.runnable]
    backend = StandInNpu()
    ReplayRunner(backend, MsprofCollector(backend, record_dir=tmp_path / "record"), 3, 2).run(case)
    assert len(calls) == 1 + 2 + 3  # verification, warm-up, repeats
    module._npu_reshape_and_cache = stand_in_torch_npu(shift=5)._npu_reshape_and_cache  # type: ignore[attr-defined]
    with pytest.raises(CaseFailure, match="exact match required"):
        ReplayRunner(backend, MsprofCollector(backend, record_dir=tmp_path / "again"), 3, 2).run(case)


# ----------------------------------------------------------------------------- ScatterNdUpdate
@pytest.mark.parametrize("name", SCATTER_ROWS)
def test_scatter_nd_update_calls_the_in_place_api(name: str) -> None:
    row_cells = SCATTER_ROWS[name]
    assert op_mapping_api("ScatterNdUpdate") is None
    call = npu_call_of("ScatterNdUpdate", row_cells)
    assert call.api == "torch_npu.npu_scatter_nd_update_" and call.kwargs == {} and call.outputs is None
    data, indices, updates = call.args
    assert ";".join(",".join(map(str, t.shape)) for t in call.args) == row_cells["Input Shapes"].strip('"')
    depth = indices.shape[-1]
    rows = {tuple(r) for r in indices.reshape(-1, depth).tolist()}
    assert len(rows) == indices.reshape(-1, depth).shape[0]  # distinct: the result does not depend on write order
    assert all(0 <= r[d] < data.shape[d] for r in rows for d in range(depth))


@pytest.mark.parametrize("name", SCATTER_ROWS)
def test_scatter_nd_update_portable_and_stand_in_npu_calls_verify(name: str) -> None:
    replay_on_cpu("ScatterNdUpdate", SCATTER_ROWS[name])
    npu_outputs("ScatterNdUpdate", SCATTER_ROWS[name], stand_in_torch_npu())


def test_the_indexer_cache_row_builds_on_meta_and_a_shorter_table_verifies() -> None:
    """226048x128 BF16 (58 MB) runs on meta; its numerics on a table of the same layout, 2048 rows."""
    assert tuple(meta_outputs("ScatterNdUpdate", LARGE_SCATTER).shape) == (226048, 128)
    replay_on_cpu("ScatterNdUpdate", dict(LARGE_SCATTER, **{"Input Shapes": '"2048,128;102,1;102,128"', "Output Shapes": '"2048,128"'}))


def test_a_scatter_into_the_wrong_rows_fails_verification() -> None:
    with pytest.raises(VerificationError, match="exact match required"):
        npu_outputs("ScatterNdUpdate", SCATTER_ROWS["two_dims"], stand_in_torch_npu(shift=1))


# ----------------------------------------------------------------------------- rows that cannot be built
@pytest.mark.parametrize(
    ("kernel_type", "row_cells", "reason"),
    [
        ("ReshapeAndCacheNdKernel", cells("4,1,64;4,1,64;1,2,1,64;1,2,1,64;4", "DT_BF16;DT_BF16;DT_BF16;DT_BF16;INT32",
                                          "1,2,1,64;1,2,1,64", "DT_BF16;DT_BF16"), "do not fit the 2 slots"),
        ("ReshapeAndCacheNdKernel", cells("4,1,64;4,1,64;16,128,2,64;16,128,1,64;4", "DT_BF16;DT_BF16;DT_BF16;DT_BF16;INT32",
                                          "16,128,2,64;16,128,1,64", "DT_BF16;DT_BF16"), "key_cache \\[16,128,2,64\\]"),
        ("ReshapeAndCacheNdKernel", cells("4,1,64;4,1,64;16,128,1,64;16,128,1,64;4", "DT_BF16;DT_BF16;DT_BF16;DT_BF16;FLOAT",
                                          "16,128,1,64;16,128,1,64", "DT_BF16;DT_BF16"), "slot_indices dtype FLOAT"),
        ("ReshapeAndCacheNdKernel", cells("4,1,64;4,1,64;16,128,1,64;16,128,1,64;4", "DT_BF16;DT_BF16;DT_BF16;DT_BF16;INT32",
                                          "16,128,1,64", "DT_BF16"), "outputs should be the updated key_cache;value_cache"),
        ("ScatterNdUpdate", cells("100,128;3,1;3,64", "DT_BF16;INT32;DT_BF16", "100,128", "DT_BF16"), "updates \\[3,64\\] should be \\[3,128\\]"),
        ("ScatterNdUpdate", cells("2,128;3,1;3,128", "DT_BF16;INT32;DT_BF16", "2,128", "DT_BF16"), "rows would repeat"),
        ("ScatterNdUpdate", cells("100,128;3,1;3,128", "DT_BF16;FLOAT;DT_BF16", "100,128", "DT_BF16"), "indices dtype FLOAT"),
    ],
)
def test_rows_the_replay_cannot_build_say_why(kernel_type: str, row_cells: dict[str, str], reason: str) -> None:
    replay = get_replay(kernel_type)
    assert replay is not None
    with pytest.raises(CaseBuildError, match=reason):
        replay.check(kernel_row(kernel_type, row_cells))


def test_nz_caches_are_not_replayed() -> None:
    row_cells = dict(CACHE_ROWS["readme"], **{"Input Formats": "ND;ND;FRACTAL_NZ;FRACTAL_NZ;ND"})
    with pytest.raises(CaseBuildError, match="FRACTAL_NZ"):
        ReshapeAndCacheReplay().check(kernel_row("ReshapeAndCacheNdKernel", row_cells))
