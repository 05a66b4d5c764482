"""Index, MaskedFill, PadV3 and NonZero: the NPU calls, the portable paths, the checks, trace ingest.

NonZero has a real row (Level2 training profile, ``aclnnNonzeroV2``: ``"4"`` BOOL -> ``"1"``
INT64).  Index, MaskedFill and PadV3 have no public row; theirs are written in the layout of
Ascend/msmodeling's replay scripts and ``tools/perf_data_collection/README_op_microbench.md``:
``Index`` ``"1;1;1;1"`` INT32;INT64;INT64;INT64 -> ``"1"`` INT32 (x, indexed_sizes,
indexed_strides, one index; ``Index_run.py`` reads ``source;1;2;index_len``), ``MaskedFill``
``"2;2;"`` INT32;BOOL;INT32 -> ``"2"`` (x, mask, the 0-d value), ``PadV3`` ``"1,1;4;"``
DT_BF16;INT32;DT_BF16 -> ``"8,1"`` (x, paddings, the 0-d constant), and serving-sized rows of
the same layouts (the rotary cos/sin cache ``[163840,64]`` op_mapping.yaml names for Index).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.replay.api_call import bind_call, resolve_api
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels.indexing import IndexReplay, MaskedFillReplay, NonZeroReplay, PadV3Replay
from perf_plugin.replay.registry import get_replay
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import aten_ops_of_run, kernel_row, level2_rows, npu_call_of, op_mapping_api, replay_on_cpu


def cells(inputs: str, in_types: str, outputs: str, out_types: str) -> dict[str, str]:
    count = lambda types_: len(types_.split(";"))  # noqa: E731
    return {
        "OP State": "dynamic", "Accelerator Core": "AI_VECTOR_CORE",
        "Input Shapes": f'"{inputs}"', "Input Data Types": in_types, "Input Formats": ";".join(["ND"] * count(in_types)),
        "Output Shapes": f'"{outputs}"', "Output Data Types": out_types, "Output Formats": ";".join(["ND"] * count(out_types)),
    }  # fmt: skip


INDEX_ROWS = [
    cells("1;1;1;1", "INT32;INT64;INT64;INT64", "1", "INT32"),
    cells("163840,64;1;2;32", "DT_BF16;INT64;INT64;INT64", "32,64", "DT_BF16"),  # cos/sin cache rows
    cells("8,16,4;2;3;5", "FLOAT;INT64;INT64;INT32", "8,5,4", "FLOAT"),  # x[:, idx]
    cells("8,16,4;3;2;5;5", "FLOAT;INT64;INT64;INT64;INT64", "5,16", "FLOAT"),  # x[i, :, j]: result dims first
]
MASKED_FILL_ROWS = [
    cells("2;2;", "INT32;BOOL;INT32", "2", "INT32"),
    cells("4,151936;4,151936;", "FLOAT;BOOL;FLOAT", "4,151936", "FLOAT"),  # logits masked in place
    cells("4,32,32;32,32;", "DT_BF16;BOOL;DT_BF16", "4,32,32", "DT_BF16"),  # a causal mask, broadcast
]
PAD_ROWS = [
    cells("1,1;4;", "DT_BF16;INT32;DT_BF16", "8,1", "DT_BF16"),
    cells("3,7168;4;", "DT_BF16;INT32;DT_BF16", "8,7168", "DT_BF16"),  # a decode batch padded to a graph size
]


def _id(row: dict[str, str]) -> str:
    return row["Input Shapes"].strip('"') + "/" + row["Input Data Types"]


def torch_call_outputs(kernel_type: str, row_cells: dict[str, str]) -> tuple[Any, Any]:
    """The NPU call bound to the torch API it names, made on the CPU, verified against the reference."""
    replay = get_replay(kernel_type)
    assert replay is not None
    row = kernel_row(kernel_type, row_cells)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    call = replay.npu_call(row, args)
    assert call is not None
    outputs = bind_call(call, resolve_api(call.api), lambda tensor, acl_format: tensor)()
    reference = replay.reference(*args)
    verify_outputs(replay, row, outputs, reference)
    return outputs, reference


# ----------------------------------------------------------------------------- Index
@pytest.mark.parametrize("row_cells", INDEX_ROWS, ids=_id)
def test_index_calls_aten_index_with_the_row_index_tensors(row_cells: dict[str, str]) -> None:
    assert op_mapping_api("Index") is None
    call = npu_call_of("Index", row_cells)
    assert call.api == "torch.ops.aten.index.Tensor" and call.outputs is None
    x, indices = call.args
    slots = row_cells["Input Shapes"].strip('"').split(";")
    defined = [t for t in indices if t is not None]
    assert ",".join(map(str, x.shape)) == slots[0] and len(indices) == int(slots[1])
    assert [",".join(map(str, t.shape)) for t in defined] == slots[3:]
    assert [str(t.dtype).removeprefix("torch.").upper() for t in defined] == row_cells["Input Data Types"].split(";")[3:]
    assert aten_ops_of_run("Index", row_cells) == ["aten.index"]
    torch_call_outputs("Index", row_cells)  # the very call, through torch on the CPU
    replay_on_cpu("Index", row_cells)


def test_index_places_separated_indices_first() -> None:
    x, indices = IndexReplay().make_inputs(kernel_row("Index", INDEX_ROWS[3]), torch.device("cpu"), torch.Generator())
    assert [t is None for t in indices] == [False, True, False]


class _ShiftedIndex(IndexReplay):
    def run(self, x: Any, indices: Any) -> Any:
        return super().run(x, [None if t is None else (t + 1) % x.shape[0] for t in indices])


def test_an_index_of_the_wrong_rows_fails_verification() -> None:
    row = kernel_row("Index", INDEX_ROWS[1])
    args = IndexReplay().make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(VerificationError, match="exact match required"):
        verify_outputs(IndexReplay(), row, _ShiftedIndex().run(*args), IndexReplay().reference(*args))


# ----------------------------------------------------------------------------- MaskedFill
@pytest.mark.parametrize("row_cells", MASKED_FILL_ROWS, ids=_id)
def test_masked_fill_runs_the_in_place_fill_it_names(row_cells: dict[str, str]) -> None:
    replay = get_replay("MaskedFill")
    assert replay is not None and replay.npu_api == "torch.Tensor.masked_fill_"
    assert type(replay).npu_call is MaskedFillReplay.npu_call  # run is the NPU call
    assert aten_ops_of_run("MaskedFill", row_cells) == ["aten.masked_fill_"]
    out, _ = replay_on_cpu("MaskedFill", row_cells)
    assert bool((out == 0).any()) and bool((out != 0).any())


class _FillEverything(MaskedFillReplay):
    def run(self, x: Any, mask: Any, value: float, original: Any) -> Any:
        return x.fill_(value)


def test_a_fill_outside_the_mask_fails_verification() -> None:
    """The fill writes its input, so a run that filled everything would leave nothing to tell
    from a reference computed on that input: the reference reads the untouched copy."""
    row = kernel_row("MaskedFill", MASKED_FILL_ROWS[2])
    args = MaskedFillReplay().make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    outputs = _FillEverything().run(*args)
    with pytest.raises(VerificationError, match="exact match required"):
        verify_outputs(MaskedFillReplay(), row, outputs, MaskedFillReplay().reference(*args))


# ----------------------------------------------------------------------------- PadV3
@pytest.mark.parametrize("row_cells", PAD_ROWS, ids=_id)
def test_pad_runs_constant_pad_nd_at_the_end_of_each_dim(row_cells: dict[str, str]) -> None:
    replay = get_replay("PadV3")
    assert replay is not None and replay.npu_api == "torch.constant_pad_nd"
    assert type(replay).npu_call is PadV3Replay.npu_call
    assert aten_ops_of_run("PadV3", row_cells) == ["aten.constant_pad_nd"]
    out, _ = replay_on_cpu("PadV3", row_cells)
    x, widths, value = replay.make_inputs(kernel_row("PadV3", row_cells), torch.device("cpu"), torch.Generator().manual_seed(0))
    assert len(widths) == 2 * x.dim() and widths[0::2] == [0] * x.dim()
    assert torch.equal(out[: x.shape[0], : x.shape[1]], x) and bool((out[x.shape[0] :] == value).all())


class _PadInFront(PadV3Replay):
    def run(self, x: Any, widths: list[int], value: float) -> Any:
        return torch.constant_pad_nd(x, [w for pair in zip(widths[1::2], widths[0::2]) for w in pair], value)


def test_padding_the_wrong_side_fails_verification() -> None:
    row = kernel_row("PadV3", PAD_ROWS[1])
    args = PadV3Replay().make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(VerificationError, match="exact match required"):
        verify_outputs(PadV3Replay(), row, _PadInFront().run(*args), PadV3Replay().reference(*args))


# ----------------------------------------------------------------------------- NonZero
def test_nonzero_real_row_gets_exactly_the_recorded_count_of_nonzeros() -> None:
    """``"4"`` BOOL -> ``"1"``: the output size is the data's nonzero count, so the input holds
    exactly one True at a random place; torch.where(x) (aclnnNonzeroV2) then gives ``[1]``."""
    (row_cells,) = level2_rows("NonZero")
    call = npu_call_of("NonZero", row_cells)
    assert op_mapping_api("NonZero") is None
    assert call.api == "torch.where" and call.outputs == (0,)
    (x,) = call.args
    assert x.dtype == torch.bool and x.shape == (4,) and int(x.sum()) == 1
    out, _ = torch_call_outputs("NonZero", row_cells)
    assert out.shape == (1,) and out.dtype == torch.int64 and bool(x[out].all())
    assert aten_ops_of_run("NonZero", row_cells)[0] == "aten.nonzero"
    replay_on_cpu("NonZero", row_cells)


@pytest.mark.parametrize("dtype", ["BOOL", "FLOAT", "INT32"])
def test_nonzero_of_other_dtypes_and_counts(dtype: str) -> None:
    torch_call_outputs("NonZero", cells("4096", dtype, "1000", "INT64"))


class _FirstElements(NonZeroReplay):
    def run(self, x: Any) -> Any:
        return torch.arange(int((x != 0).sum()))


def test_nonzero_at_the_wrong_places_fails_verification() -> None:
    row = kernel_row("NonZero", cells("4096", "BOOL", "10", "INT64"))
    args = NonZeroReplay().make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    with pytest.raises(VerificationError, match="exact match required"):
        verify_outputs(NonZeroReplay(), row, _FirstElements().run(*args), NonZeroReplay().reference(*args))


# ----------------------------------------------------------------------------- rows that cannot be built
@pytest.mark.parametrize(
    ("kernel_type", "row_cells", "reason"),
    [
        ("Index", cells("8,16;1;2;5", "FLOAT;INT64;INT64;FLOAT", "5,16", "FLOAT"), "INT32/INT64"),
        ("Index", cells("8,16;1;3;5", "FLOAT;INT64;INT64;INT64", "5,16", "FLOAT"), "indexed_strides \\[3\\] should be \\[2\\]"),
        ("Index", cells("8,16;1;2;5", "FLOAT;INT64;INT64;INT64", "5,8", "FLOAT"), "no placement of 1 index tensor"),
        ("Index", cells("8,16;3;2;5", "FLOAT;INT64;INT64;INT64", "5,16", "FLOAT"), "indexed_sizes \\[3\\] should be"),
        ("MaskedFill", cells("4,8;4,8;", "FLOAT;FLOAT;FLOAT", "4,8", "FLOAT"), "should be BOOL"),
        ("MaskedFill", cells("4,8;3,8;", "FLOAT;BOOL;FLOAT", "4,8", "FLOAT"), "broadcast to x \\[4,8\\]"),
        ("PadV3", cells("4,8;4;", "FLOAT;INT32;FLOAT", "2,8", "FLOAT"), "does not contain x \\[4,8\\]"),
        ("PadV3", cells("4,8;3;", "FLOAT;INT32;FLOAT", "6,8", "FLOAT"), "paddings \\[3\\] INT32 should be \\[4\\]"),
        ("NonZero", cells("4", "BOOL", "5", "INT64"), "N <= 4 nonzero"),
        ("NonZero", cells("4,4", "BOOL", "2,3", "INT64"), "only 1-d inputs are replayed"),
    ],
)
def test_rows_the_replay_cannot_build_say_why(kernel_type: str, row_cells: dict[str, str], reason: str) -> None:
    replay = get_replay(kernel_type)
    assert replay is not None
    with pytest.raises(CaseBuildError, match=reason):
        replay.check(kernel_row(kernel_type, row_cells))


# ----------------------------------------------------------------------------- trace ingest
def test_a_cpu_trace_of_masked_fill_and_pad_becomes_their_rows(tmp_path: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    scores = torch.randn(4, 16, 16, dtype=torch.bfloat16)
    causal = torch.ones(16, 16, dtype=torch.bool).triu(1)
    logits = torch.randn(4, 100)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        scores.masked_fill(causal, float("-inf"))
        logits.masked_fill_(logits < 0, 0.0)
        torch.nn.functional.pad(logits, (0, 3, 0, 4))
        torch.nn.functional.pad(logits, (1, 1), mode="reflect")  # not PadV3's constant mode
    trace = tmp_path / "serving.pt.trace.json"
    prof.export_chrome_trace(str(trace))
    rows = {(r.kernel_type, r.cells["Input Shapes"]): r.cells for r in ingest_path(trace, tmp_path / "db").rows}
    identity = ("Input Data Types", "Output Shapes", "Output Data Types")
    # the out-of-place form (clone, then fill: two kernels) is not the in-place fill MaskedFill names
    out_of_place = rows["aten.masked_fill", '"4,16,16;16,16"']
    assert [out_of_place[c] for c in identity] == ["DT_BF16;BOOL", '"4,16,16"', "DT_BF16"]
    assert ("MaskedFill", '"4,16,16;16,16;"') not in rows
    assert [rows["MaskedFill", '"4,100;4,100;"'][c] for c in identity] == ["FLOAT;BOOL;FLOAT", '"4,100"', "FLOAT"]
    assert [rows["PadV3", '"4,100;4;"'][c] for c in identity] == ["FLOAT;INT32;FLOAT", '"8,103"', "FLOAT"]
    assert [k for k, _ in rows].count("PadV3") == 1
    for key in (("aten.masked_fill", '"4,16,16;16,16"'), ("MaskedFill", '"4,100;4,100;"'), ("PadV3", '"4,100;4;"')):
        replay_on_cpu(key[0], rows[key])


def test_index_and_nonzero_declare_no_trace_operators() -> None:
    """The profiler records no dims for ``index``'s list of optional index tensors, and
    ``nonzero``'s output size is data: neither trace gives the row's layout."""
    assert not IndexReplay.trace_ops and not NonZeroReplay.trace_ops
