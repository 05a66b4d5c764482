"""What every kernel replay's tests use: real rows, the real op_mapping files, the harness's own path.

* ``level2_rows(kernel_type)``: the distinct rows (identity cells) of a kernel type in the real
  Ascend Level2 profile (``tests/fixtures/ascend/kernel_details_level2_llm_train.csv``).
* ``fixture_rows(name)``: the rows of another real fixture file (``db_row_*.csv``).
* ``op_mapping_api(kernel_type)``: the ``microbench_api`` the real op_mapping.yaml files name.
* ``replay_on_cpu(kernel_type, cells)``: the harness's own path on the CPU (``make_inputs``,
  ``run``, ``reference``, ``verify_outputs``); raises VerificationError on a mismatch.
* ``npu_call_of(kernel_type, cells)``: the ``ApiCall`` the replay would make on an NPU, built on
  the CPU from the row, checking that torch_npu was not imported for it.
* ``meta_outputs(kernel_type, cells)``: the replay's outputs built on the ``meta`` device (no
  memory, no arithmetic), for checking shapes and dtypes of rows too large to run here.
"""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path
from typing import Any

import torch
import yaml

from perf_plugin.database.table import CsvTable
from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import OpReplay
from perf_plugin.replay.registry import get_replay
from perf_plugin.replay.tensors import KernelRow, kernel_row_from_cells
from perf_plugin.replay.verify import check_output_specs, verify_outputs

ASCEND = Path(__file__).parents[1] / "fixtures" / "ascend"
LEVEL2 = ASCEND / "kernel_details_level2_llm_train.csv"
OP_MAPPINGS = (
    ASCEND / "op_mapping_vllm0.18.0_torch2.9.0_cann8.5.yaml",
    ASCEND / "op_mapping_vllm0.13.0_torch2.8.0_cann8.3.yaml",
)
IDENTITY = (
    "OP State", "Accelerator Core", "Input Shapes", "Input Data Types", "Input Formats",
    "Output Shapes", "Output Data Types", "Output Formats",
)  # fmt: skip


@cache
def _table(path: Path) -> CsvTable:
    return CsvTable.read(path)


def fixture_rows(name: str, kernel_type: str | None = None, type_column: str = "Type") -> list[dict[str, str]]:
    """Distinct rows of a real fixture file (by identity cells), optionally of one kernel type."""
    table = _table(ASCEND / name)
    seen: set[tuple[str, ...]] = set()
    rows = []
    for index in range(len(table)):
        cells = table.row_dict(index)
        if kernel_type is not None and cells.get(type_column) != kernel_type:
            continue
        key = tuple(cells.get(column, "") for column in IDENTITY)
        if key not in seen:
            seen.add(key)
            rows.append(cells)
    return rows


def level2_rows(kernel_type: str) -> list[dict[str, str]]:
    return fixture_rows(LEVEL2.name, kernel_type)


@cache
def _op_mapping_apis() -> dict[str, str]:
    apis: dict[str, str] = {}
    for path in OP_MAPPINGS:  # the newer file first: its entry wins
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        for kernel_type, entry in (document.get("torch_npu_reference") or {}).items():
            if isinstance(entry, dict) and entry.get("microbench_api"):
                apis.setdefault(str(kernel_type), str(entry["microbench_api"]))
    return apis


def op_mapping_api(kernel_type: str) -> str | None:
    """The API the real op_mapping.yaml files name for a kernel type (the newer file first)."""
    return _op_mapping_apis().get(kernel_type)


def replay_of(kernel_type: str) -> OpReplay:
    replay = get_replay(kernel_type)
    assert replay is not None, f"no replay for {kernel_type}"
    return replay


def kernel_row(kernel_type: str, cells: dict[str, str]) -> KernelRow:
    return kernel_row_from_cells(kernel_type, cells)


def replay_on_cpu(kernel_type: str, cells: dict[str, str], seed: int = 0) -> tuple[Any, Any]:
    """The harness's path on the CPU; returns (outputs, reference) after verifying them."""
    replay = replay_of(kernel_type)
    row = kernel_row(kernel_type, cells)
    replay.check(row)
    generator = torch.Generator().manual_seed(seed)
    args = replay.make_inputs(row, torch.device("cpu"), generator)
    outputs = replay.run(*args)
    reference = replay.reference(*args)
    verify_outputs(replay, row, outputs, reference, args)
    return outputs, reference


def meta_outputs(kernel_type: str, cells: dict[str, str]) -> Any:
    """The replay's outputs on the ``meta`` device, checked against the row's output specs."""
    replay = replay_of(kernel_type)
    row = kernel_row(kernel_type, cells)
    replay.check(row)
    args = replay.make_inputs(row, torch.device("meta"), None)  # type: ignore[arg-type]
    outputs = replay.run(*args)
    check_output_specs(replay, row, outputs)
    return outputs


def npu_call_of(kernel_type: str, cells: dict[str, str], device: str = "cpu") -> ApiCall:
    """The call the replay makes on an NPU, built from the row without importing torch_npu."""
    imported_before = "torch_npu" in sys.modules
    replay = replay_of(kernel_type)
    row = kernel_row(kernel_type, cells)
    replay.check(row)
    generator = torch.Generator().manual_seed(0) if device == "cpu" else None
    args = replay.make_inputs(row, torch.device(device), generator)  # type: ignore[arg-type]
    call = replay.npu_call(row, args)
    assert call is not None, f"{kernel_type}: run is the NPU call; npu_call_of is for replays that name an API"
    assert imported_before or "torch_npu" not in sys.modules, "building the call imported torch_npu"
    return call


def shapes(value: Any) -> Any:
    """Tensor shapes (as tuples) in the structure of ``value``; other values as they are."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if isinstance(value, (list, tuple)):
        return type(value)(shapes(v) for v in value)
    if isinstance(value, dict):
        return {k: shapes(v) for k, v in value.items()}
    if hasattr(value, "tensor") and hasattr(value, "format"):  # NpuFormat
        return (shapes(value.tensor), value.format)
    return value


# The aten operator a plain torch API dispatches to, where its name does not say it.
_ATEN_OF_API = {
    "torch.Tensor.to": "aten._to_copy",
    "torch.softmax": "aten._softmax",
    "torch.Tensor.copy_": "aten.copy_",
    "torch.nn.functional.embedding": "aten.embedding",
}


def aten_op_of_api(api: str) -> str:
    """``torch.add`` -> ``aten.add``: the operator whose NPU implementation the API reaches."""
    return _ATEN_OF_API.get(api, "aten." + api.rsplit(".", 1)[-1])


def aten_ops_of_run(kernel_type: str, cells: dict[str, str]) -> list[str]:
    """The aten operators (``aten.add``) the replay's ``run`` dispatches on the CPU, in order."""
    from torch.utils._python_dispatch import TorchDispatchMode

    replay = replay_of(kernel_type)
    row = kernel_row(kernel_type, cells)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    seen: list[str] = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.append(str(func.overloadpacket).replace("aten::", "aten."))
            return func(*args, **(kwargs or {}))

    with Recorder():
        replay.run(*args)
    return seen
