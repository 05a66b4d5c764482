"""GatherV2, Slice and Transpose launch the very kernel their row names on an NPU.

The portable ``run`` of these data-movement replays is a copy (``index_select``, a copy from a
sliced or permuted view), which on an NPU reaches other kernels (``index_select`` ->
aclnnIndexSelect -> GatherV3; a view copy picks its own kernel).  The NPU calls are
``F.embedding`` (aclnnEmbedding -> GatherV2, what op_mapping.yaml names), ``torch_npu.npu_slice``
and ``torch_npu.npu_transpose`` (op-plugin runs the ``Slice`` / ``Transpose`` ops on
``x;offsets;size`` / ``x;perm``, the rows' layouts).  Real rows: GatherV2 and Slice of the Level2
profile; Transpose has none public, its rows are written in the layout of msmodeling's
``README_op_microbench.md`` (``"2,3,4;3"`` DT_BF16;INT64 -> ``"2,4,3"``: x and the perm).
The torch_npu calls run here against a stand-in with the documented signatures.  The Level2
Slice rows label their 3-d input NCHW; the call hands that input over in the recorded format
(``NpuFormat``, a base-format relabel cast before timing), as the signature compares formats.
"""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from perf_plugin.replay.api_call import NpuFormat, bind_call, resolve_api, unwrap
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.registry import get_replay
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import kernel_row, level2_rows, npu_call_of, op_mapping_api, shapes


def cells(inputs: str, in_types: str, outputs: str, out_types: str) -> dict[str, str]:
    count = lambda types_: len(types_.split(";"))  # noqa: E731
    return {
        "OP State": "dynamic", "Accelerator Core": "AI_VECTOR_CORE",
        "Input Shapes": f'"{inputs}"', "Input Data Types": in_types, "Input Formats": ";".join(["ND"] * count(in_types)),
        "Output Shapes": f'"{outputs}"', "Output Data Types": out_types, "Output Formats": ";".join(["ND"] * count(out_types)),
    }  # fmt: skip


TRANSPOSE_ROWS = [
    cells("2,3,4;3", "DT_BF16;INT64", "2,4,3", "DT_BF16"),
    cells("32,4,128;3", "DT_BF16;INT64", "4,32,128", "DT_BF16"),  # tokens x heads -> heads x tokens
    cells("16,8,4", "DT_BF16", "4,16,8", "DT_BF16"),  # no perm slot
]


def stand_in_torch_npu(wrong: bool = False) -> types.ModuleType:
    module = types.ModuleType("torch_npu")

    def npu_slice(x: Any, offsets: list[int], size: list[int]) -> Any:
        start = offsets[:-1] + [offsets[-1] + (1 if wrong else 0)]  # wrong: one element further
        return x[tuple(slice(o, o + s) for o, s in zip(start, size))].clone()

    def npu_transpose(x: Any, perm: list[int], require_contiguous: bool = True) -> Any:
        out = x.permute(perm).contiguous()
        return out.roll(1, dims=0) if wrong else out  # wrong: the right shape, rows shifted

    module.npu_slice = npu_slice  # type: ignore[attr-defined]
    module.npu_transpose = npu_transpose  # type: ignore[attr-defined]
    return module


def npu_outputs(kernel_type: str, row_cells: dict[str, str], torch_npu: types.ModuleType | None = None) -> Any:
    replay = get_replay(kernel_type)
    assert replay is not None
    row = kernel_row(kernel_type, row_cells)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    call = replay.npu_call(row, args)
    assert call is not None
    function = resolve_api(call.api, lambda name: torch_npu if name == "torch_npu" else __import__(name))
    outputs = bind_call(call, function, lambda tensor, acl_format: tensor)()
    verify_outputs(replay, row, outputs, replay.reference(*args))
    return outputs


# ----------------------------------------------------------------------------- GatherV2
def test_gather_v2_real_row_calls_embedding_with_the_index_in_its_own_shape() -> None:
    (real,) = level2_rows("GatherV2")
    call = npu_call_of("GatherV2", real, device="meta")  # a 151936x1024 table: no memory on meta
    assert call.api == op_mapping_api("GatherV2") == "torch.nn.functional.embedding"
    assert shapes(call.args) == ((1, 4096), (151936, 1024)) and call.kwargs == {} and call.outputs is None
    assert call.args[0].dtype == torch.int64


@pytest.mark.parametrize(
    "row_cells",
    [
        cells("1000,64;1,16;1", "DT_BF16;INT64;INT64", "1,16,64", "DT_BF16"),  # the real row's layout, smaller table
        cells("1000,64;;1", "DT_BF16;INT64;INT64", "64", "DT_BF16"),  # a 0-d index
        cells("50,16;2,4;1", "FLOAT;INT32;INT64", "2,4,16", "FLOAT"),
    ],
    ids=lambda c: c["Input Shapes"],
)
def test_gather_v2_embedding_call_gives_the_rows_output(row_cells: dict[str, str]) -> None:
    npu_outputs("GatherV2", row_cells)  # the real F.embedding, verified exactly


def test_gather_v2_on_another_axis_has_no_npu_call() -> None:
    row = cells("8,32,16;5;1", "FLOAT;INT32;INT64", "8,5,16", "FLOAT")
    replay = get_replay("GatherV2")
    assert replay is not None
    replay.check(kernel_row("GatherV2", row))  # portable: index_select on axis 1
    with pytest.raises(CaseBuildError, match="axis 1 of a 3-d table: no NPU API launches GatherV2.*GatherV3"):
        npu_call_of("GatherV2", row)


# ----------------------------------------------------------------------------- Slice
@pytest.mark.parametrize("row_cells", level2_rows("Slice"), ids=lambda c: c["Input Shapes"] + "->" + c["Output Shapes"])
def test_slice_real_rows_call_npu_slice_on_the_whole_input(row_cells: dict[str, str]) -> None:
    call = npu_call_of("Slice", row_cells)
    x_shape, _, _ = (tuple(int(d) for d in s.split(",")) for s in row_cells["Input Shapes"].strip('"').split(";"))
    out = [int(d) for d in row_cells["Output Shapes"].strip('"').split(",")]
    assert op_mapping_api("Slice") is None and call.api == "torch_npu.npu_slice"
    source, offsets, size = call.args
    x = unwrap(source)
    assert tuple(x.shape) == x_shape and x.is_contiguous() and offsets == [0] * len(x_shape) and size == out
    # the input in the storage format the row records (NCHW for the 3-d rows, cast before timing)
    recorded = row_cells["Input Formats"].split(";")[0]
    assert (source.format if isinstance(source, NpuFormat) else "ND") == recorded
    npu_outputs("Slice", row_cells, stand_in_torch_npu())


def test_a_slice_at_the_wrong_offset_fails_verification() -> None:
    with pytest.raises(VerificationError, match="exact match required"):
        npu_outputs("Slice", level2_rows("Slice")[0], stand_in_torch_npu(wrong=True))


# ----------------------------------------------------------------------------- Transpose
@pytest.mark.parametrize("row_cells", TRANSPOSE_ROWS, ids=lambda c: c["Input Shapes"])
def test_transpose_calls_npu_transpose_with_the_derived_perm(row_cells: dict[str, str]) -> None:
    call = npu_call_of("Transpose", row_cells)
    assert op_mapping_api("Transpose") is None and call.api == "torch_npu.npu_transpose"
    x, perm = call.args
    x_shape = tuple(int(d) for d in row_cells["Input Shapes"].strip('"').split(";")[0].split(","))
    out = tuple(int(d) for d in row_cells["Output Shapes"].strip('"').split(","))
    assert tuple(x.shape) == x_shape and x.is_contiguous() and tuple(x_shape[p] for p in perm) == out
    assert call.kwargs == {"require_contiguous": True} and call.outputs is None
    npu_outputs("Transpose", row_cells, stand_in_torch_npu())


def test_a_transpose_with_the_wrong_perm_fails_verification() -> None:
    with pytest.raises(VerificationError, match="exact match required"):
        npu_outputs("Transpose", TRANSPOSE_ROWS[1], stand_in_torch_npu(wrong=True))
