"""Kernel replays on the real Ascend rows: build, run, shapes/dtypes, numerics, rejections.

Every distinct row of the replayed kernel types in the real ``kernel_details`` fixtures (one row
per launch there, so rows are deduplicated by their identity cells) is built on the ``meta``
device and its outputs compared with the row; the rows that fit a memory budget, plus the
smallest row of every (kernel type, dtypes) pattern, also run on the CPU and are compared with
the reference.  Kernel types the fixtures lack get rows written by hand in the same format.
"""

from __future__ import annotations

import csv
import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from perf_plugin.database.table import CsvTable
from perf_plugin.replay.base import RELATIVE_TOLERANCE, CaseBuildError, OpReplay
from perf_plugin.replay.kernels.elementwise import AddReplay
from perf_plugin.replay.kernels.matmul import MatMulReplay
from perf_plugin.replay.kernels.memory import TensorMoveReplay, derive_perm
from perf_plugin.replay.registry import get_replay
from perf_plugin.replay.tensors import KernelRow, TensorSpec, kernel_row_from_cells, random_tensor
from perf_plugin.replay.verify import (
    VerificationError,
    check_output_specs,
    relative_error,
    verify_outputs,
)
from tests.conftest import ASCEND

REPLAYED = (
    "MatMulV2", "MatMulV3", "MatMulCommon", "BatchMatMulV2", "Add", "Mul", "Muls", "Cast", "RmsNorm",
    "SwiGlu", "SoftmaxV2", "Transpose", "Slice", "GatherV2", "TensorMove", "ConcatD", "Sub", "RealDiv",
)  # fmt: skip
IDENTITY = (
    "Input Shapes", "Input Data Types", "Input Formats",
    "Output Shapes", "Output Data Types", "Output Formats",
)  # fmt: skip
KERNEL_DETAILS = ("kernel_details_level2_llm_train.csv", "kernel_details_level1.csv")

# Rows for kernel types (and patterns) the fixtures lack, in the profiler's own spelling.
HEADER = "Type," + ",".join(IDENTITY)
HAND_WRITTEN = HEADER + '''
MatMulCommon,"""136,512;512,256""",DT_BF16;DT_BF16,ND;ND,"""136,256""",DT_BF16,ND
MatMulCommon,"""512,136;256,512""",DT_BF16;DT_BF16,ND;ND,"""136,256""",DT_BF16,ND
MatMulV2,"""128,64;32,128""",FLOAT16;FLOAT16,ND;ND,"""64,32""",FLOAT16,ND
MatMulV2,"""16,256;256,64;""",DT_BF16;DT_BF16;,ND;ND;,"""16,64""",DT_BF16,ND
BatchMatMulV2,"""4,16,128;4,128,64""",DT_BF16;DT_BF16,ND;ND,"""4,16,64""",DT_BF16,ND
BatchMatMulV2,"""4,16,128;4,64,128""",DT_BF16;DT_BF16,ND;ND,"""4,16,64""",DT_BF16,ND
BatchMatMulV2,"""8,128,16;1,128,32""",FLOAT;FLOAT,ND;ND,"""8,16,32""",FLOAT,ND
BatchMatMulV2,"""2,3,16,64;64,32""",DT_BF16;DT_BF16,ND;ND,"""2,3,16,32""",DT_BF16,ND
BatchMatMulV2,"""4,16,128;4,128,64;64""",FLOAT;FLOAT;FLOAT,ND;ND;ND,"""4,16,64""",FLOAT,ND
BatchMatMulV2,"""4,16,128;128,64;64""",FLOAT;FLOAT;FLOAT,ND;ND;ND,"""4,16,64""",FLOAT,ND
SoftmaxV2,"""64,256""",DT_BF16,ND,"""64,256""",DT_BF16,ND
SoftmaxV2,"""2,8,128""",FLOAT,ND,"""2,8,128""",FLOAT,ND
SoftmaxV2,"""64,256""",DT_BF16,ND,"""64,256""",FLOAT,ND
GatherV2,"""8,32,16;5;1""",FLOAT;INT32;INT64,ND;ND;ND,"""8,5,16""",FLOAT,ND
GatherV2,"""1000,64;;1""",DT_BF16;INT64;INT64,ND;ND;ND,"""64""",DT_BF16,ND
Transpose,"""16,8,4""",DT_BF16,ND,"""4,16,8""",DT_BF16,ND
Muls,"""64,33""",INT32,ND,"""64,33""",INT32,ND
Add,"""64,128;64,128""",FLOAT;FLOAT,ND;ND,"""64,128""",DT_BF16,ND
Slice,"""6,40;2;2""",INT64;INT64;INT64,ND;ND;ND,"""2,40""",INT64,ND
ConcatD,"""3,5""",FLOAT16,ND,"""3,5""",FLOAT16,ND
Cast,"""""",INT64,ND,"""""",INT32,ND
Sub,"""512,4096;512,4096""",DT_BF16;DT_BF16,ND;ND,"""512,4096""",DT_BF16,ND
Sub,"""16,1,64;16,1,64""",FLOAT;DT_BF16,ND;ND,"""16,1,64""",FLOAT,ND
Sub,"""64,128;""",FLOAT;FLOAT,ND;ND,"""64,128""",FLOAT,ND
RealDiv,"""32,128;32,1""",FLOAT;FLOAT,ND;ND,"""32,128""",FLOAT,ND
RealDiv,"""32,128;32,128""",INT64;INT64,ND;ND,"""32,128""",FLOAT,ND
RealDiv,"""8,64;""",DT_BF16;FLOAT,ND;ND,"""8,64""",DT_BF16,ND
'''

# Numerical verification on the CPU for rows up to this many bytes (inputs + outputs); larger
# fixture rows are checked on the meta device, and numerically only if no smaller fixture row
# shares their (kernel type, dtypes) pattern.  Hand-written rows are small and all verified.
NUMERIC_BUDGET = 64 << 20

TORCH_DTYPES = {
    "DT_BF16": torch.bfloat16,
    "FLOAT": torch.float32,
    "FLOAT16": torch.float16,
    "INT64": torch.int64,
    "INT32": torch.int32,
    "BOOL": torch.bool,
}


def _cells_of(path: Path) -> list[dict[str, str]]:
    table = CsvTable.read(path)
    return [table.row_dict(i) for i in range(len(table))]


def _distinct(rows: list[dict[str, str]], origin: str) -> dict[tuple[str, ...], tuple[str, dict[str, str]]]:
    found: dict[tuple[str, ...], tuple[str, dict[str, str]]] = {}
    for cells in rows:
        if cells["Type"] in REPLAYED:
            found.setdefault((cells["Type"],) + tuple(cells[c] for c in IDENTITY), (origin, cells))
    return found


def _collect() -> list[tuple[str, str, dict[str, str]]]:
    """(origin, kernel type, cells) of every distinct row: fixtures first, then hand-written."""
    found: dict[tuple[str, ...], tuple[str, dict[str, str]]] = {}
    for name in KERNEL_DETAILS:
        for key, value in _distinct(_cells_of(ASCEND / name), name).items():
            found.setdefault(key, value)
    hand = CsvTable.parse(HAND_WRITTEN)
    for key, value in _distinct([hand.row_dict(i) for i in range(len(hand))], "hand").items():
        found.setdefault(key, value)
    return [(origin, key[0], cells) for key, (origin, cells) in found.items()]


ROWS = _collect()


def _raw_shapes(cell: str) -> list[tuple[int, ...] | None]:
    """Independent reading of a shape cell (not perf_plugin's parser)."""
    inner = cell.strip().strip('"')
    if inner == "":
        return []
    return [tuple(int(d) for d in slot.split(",")) if slot else None for slot in inner.split(";")]


ORIGIN_TAGS = {"kernel_details_level2_llm_train.csv": "L2", "kernel_details_level1.csv": "L1", "hand": "hand"}


def _row_id(origin: str, kernel_type: str, cells: dict[str, str]) -> str:
    shapes = cells["Input Shapes"].strip('"') + "->" + cells["Output Shapes"].strip('"')
    dtypes = f"{cells['Input Data Types']}->{cells['Output Data Types']}"
    return f"{ORIGIN_TAGS[origin]}:{kernel_type}:{shapes}:{dtypes}:{cells['Input Formats']}"


def _row(kernel_type: str, cells: dict[str, str]) -> KernelRow:
    return kernel_row_from_cells(kernel_type, cells)


def _pattern(kernel_type: str, cells: dict[str, str]) -> tuple[str, str, str]:
    return kernel_type, cells["Input Data Types"], cells["Output Data Types"]


def _numeric_rows() -> list[tuple[str, str, dict[str, str]]]:
    smallest: dict[tuple[str, str, str], tuple[int, int]] = {}
    for index, (origin, kernel_type, cells) in enumerate(ROWS):
        size = _row(kernel_type, cells).nbytes
        key = _pattern(kernel_type, cells)
        if origin != "hand" and (key not in smallest or size < smallest[key][0]):
            smallest[key] = (size, index)
    chosen = {index for _, index in smallest.values()}
    return [
        entry
        for index, entry in enumerate(ROWS)
        if index in chosen or entry[0] == "hand" or _row(entry[1], entry[2]).nbytes <= NUMERIC_BUDGET
    ]


NUMERIC_ROWS = _numeric_rows()


def _params(rows: list[tuple[str, str, dict[str, str]]]) -> list[Any]:
    return [pytest.param(t, cells, id=_row_id(origin, t, cells)) for origin, t, cells in rows]


def _outputs(result: Any) -> tuple[torch.Tensor, ...]:
    return (result,) if isinstance(result, torch.Tensor) else tuple(result)


def _expected_output_shapes(cells: dict[str, str]) -> list[tuple[int, ...]]:
    shapes = [s for s in _raw_shapes(cells["Output Shapes"]) if s is not None]
    if not shapes and cells["Output Data Types"].strip():
        return [()]  # a 0-d output: dtype without a shape
    return shapes


# ----------------------------------------------------------------------------- coverage


def test_fixture_rows_are_read_like_the_csv_module() -> None:
    for name in KERNEL_DETAILS:
        with (ASCEND / name).open(newline="") as handle:
            records = [r for r in csv.DictReader(handle) if r["Type"] in REPLAYED]
        expected = {(r["Type"],) + tuple(r[c] for c in IDENTITY) for r in records}
        assert set(_distinct(_cells_of(ASCEND / name), name)) == expected


def test_every_kernel_type_has_a_replay_and_rows() -> None:
    for kernel_type in REPLAYED:
        replay = get_replay(kernel_type)
        assert replay is not None, kernel_type
        assert kernel_type in type(replay).kernel_types
        assert any(t == kernel_type for _, t, _ in ROWS), f"no row of {kernel_type}"
    from_fixtures = {t for origin, t, _ in ROWS if origin != "hand"}
    assert from_fixtures == set(REPLAYED) - {"MatMulCommon", "BatchMatMulV2", "SoftmaxV2"}


def test_every_fixture_dtype_pattern_is_verified_numerically() -> None:
    def fixture_patterns(rows: list[tuple[str, str, dict[str, str]]]) -> set[tuple[str, str, str]]:
        return {_pattern(t, c) for origin, t, c in rows if origin != "hand"}

    assert fixture_patterns(ROWS) == fixture_patterns(NUMERIC_ROWS)
    # the rows left to the meta device are few and large
    left = [entry for entry in ROWS if entry not in NUMERIC_ROWS]
    assert all(_row(t, c).nbytes > NUMERIC_BUDGET for _, t, c in left)
    assert len(left) < len(ROWS) // 5


# ----------------------------------------------------------------------------- every row


@pytest.mark.parametrize(("kernel_type", "cells"), _params(ROWS))
def test_row_builds_and_produces_the_recorded_outputs(kernel_type: str, cells: dict[str, str]) -> None:
    replay = get_replay(kernel_type)
    assert replay is not None
    row = _row(kernel_type, cells)
    replay.check(row)
    args = replay.make_inputs(row, torch.device("meta"), None)  # type: ignore[arg-type]
    outputs = _outputs(replay.run(*args))
    check_output_specs(replay, row, outputs)
    # the same comparison, from the raw cells
    assert [tuple(o.shape) for o in outputs] == _expected_output_shapes(cells)
    out_dtypes = [t for t in cells["Output Data Types"].split(";") if t]
    assert [o.dtype for o in outputs] == [TORCH_DTYPES[t] for t in out_dtypes]


@pytest.mark.parametrize("dtype", ["FLOAT", "DT_BF16", "FLOAT16"])
def test_random_floats_are_bounded_away_from_zero_with_random_signs(dtype: str) -> None:
    spec = TensorSpec((256, 1024), dtype.removeprefix("DT_"))
    values = random_tensor(spec, "cpu", torch.Generator().manual_seed(7))
    assert values.dtype == spec.torch_dtype() and tuple(values.shape) == spec.shape
    magnitudes = values.float().abs()
    # bf16 rounds 1.5 - eps up to 1.5
    assert float(magnitudes.min()) >= 0.5 and float(magnitudes.max()) <= 1.5
    assert 0.45 < float(values.lt(0).float().mean()) < 0.55  # signs are drawn, not fixed
    assert 0.95 < float(magnitudes.mean()) < 1.05  # magnitudes spread over [0.5, 1.5)
    again = random_tensor(spec, "cpu", torch.Generator().manual_seed(7))
    assert torch.equal(values, again), "the same seed must give the same inputs"
    other = random_tensor(spec, "cpu", torch.Generator().manual_seed(8))
    assert not torch.equal(values, other)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_random_half_precision_tensor_peaks_at_one_and_a_half_times_its_bytes_on_cuda() -> None:
    # drawn in its own dtype: the tensor plus its int8 signs, no float32 copy (that held 3x)
    spec = TensorSpec((8192, 8192), "BF16")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    values = random_tensor(spec, "cuda", torch.Generator(device="cuda").manual_seed(0))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    assert spec.nbytes <= peak <= 1.5 * spec.nbytes
    assert torch.cuda.memory_allocated() - before == spec.nbytes and values.dtype == torch.bfloat16


@pytest.mark.parametrize(("kernel_type", "cells"), _params(NUMERIC_ROWS))
def test_row_matches_its_reference_on_cpu(kernel_type: str, cells: dict[str, str]) -> None:
    replay = get_replay(kernel_type)
    assert replay is not None
    row = _row(kernel_type, cells)
    generator = torch.Generator().manual_seed(1234)
    args = replay.make_inputs(row, torch.device("cpu"), generator)
    for arg in args:
        if isinstance(arg, torch.Tensor) and arg.is_floating_point():
            assert bool(arg.ne(0).all()), "inputs must never be zeros"
    outputs = _outputs(replay.run(*args))
    references = _outputs(replay.reference(*args))
    verify_outputs(replay, row, outputs, references)
    # the same judgement, computed here
    for out, ref, spec in zip(outputs, references, replay.expected_outputs(row)):
        threshold = replay.tolerance(spec)
        if threshold == 0.0 or not out.is_floating_point():
            assert torch.equal(out, ref.to(out.dtype))
        else:
            error = (out.double() - ref.double()).norm() / ref.double().norm()
            assert float(error) <= threshold


# ----------------------------------------------------------------------------- per family


def _hand_row(line: str) -> KernelRow:
    table = CsvTable.parse(HEADER + "\n" + line + "\n")
    cells = table.row_dict(0)
    return _row(cells["Type"], cells)


def _stored_shape(operand: torch.Tensor) -> tuple[int, ...] | None:
    """The shape of the contiguous buffer an operand view reads, if it is one of two layouts."""
    if operand.is_contiguous():
        return tuple(operand.shape)
    flipped = operand.transpose(-1, -2)
    return tuple(flipped.shape) if flipped.is_contiguous() else None


MATMUL_ROWS = [(t, c) for _, t, c in ROWS if t in ("MatMulV2", "MatMulV3", "MatMulCommon", "BatchMatMulV2")]


@pytest.mark.parametrize(("kernel_type", "cells"), MATMUL_ROWS)
def test_matmul_operands_keep_the_recorded_layout(kernel_type: str, cells: dict[str, str]) -> None:
    replay = get_replay(kernel_type)
    assert replay is not None
    args = replay.make_inputs(_row(kernel_type, cells), torch.device("meta"), None)  # type: ignore[arg-type]
    recorded = _raw_shapes(cells["Input Shapes"])
    assert _stored_shape(args[0]) == recorded[0]
    assert _stored_shape(args[1]) == recorded[1]


@pytest.mark.parametrize(
    ("shapes", "layout"),
    [
        ('"4096,1024;4096,1024"|"4096,4096"', "NT"),
        ('"4096,4096;4096,1024"|"4096,1024"', "NN"),  # TN fits too: A as [M,K] is preferred
        ('"512,4096;4096,4096"|"512,4096"', "NT"),  # NN fits too: B as a linear layer's [N,K] is preferred
        ('"4096,1024;4096,2048"|"1024,2048"', "TN"),
        ('"128,64;32,128"|"64,32"', "TT"),
        ('"32,4096;1000,4096;1000"|"32,1000"', "NT"),
    ],
)
def test_matmul_layout_is_deduced_from_the_shapes(shapes: str, layout: str) -> None:
    inputs, output = shapes.split("|")
    cells = dict.fromkeys(IDENTITY, "")
    count = len(inputs.strip('"').split(";"))
    cells["Input Shapes"], cells["Output Shapes"] = inputs, output
    cells["Input Data Types"], cells["Output Data Types"] = ";".join(["FLOAT"] * count), "FLOAT"
    assert MatMulReplay().layout(_row("MatMulV2", cells)).name == layout


def _brute_force_perm(source: tuple[int, ...], target: tuple[int, ...]) -> tuple[int, ...] | None:
    for perm in itertools.permutations(range(len(source))):  # lexicographic order
        if tuple(source[p] for p in perm) == target:
            return perm
    return None


TRANSPOSE_ROWS = [(t, c) for _, t, c in ROWS if t == "Transpose"]


@pytest.mark.parametrize(("kernel_type", "cells"), TRANSPOSE_ROWS)
def test_transpose_perm_is_the_lexicographically_first(kernel_type: str, cells: dict[str, str]) -> None:
    source = _raw_shapes(cells["Input Shapes"])[0]
    target = _raw_shapes(cells["Output Shapes"])[0]
    assert source is not None and target is not None
    assert derive_perm(source, target) == _brute_force_perm(source, target)


def test_transpose_with_repeated_dims_picks_the_documented_perm() -> None:
    assert derive_perm((1, 6, 6, 8192), (8192, 1, 6, 6)) == (3, 0, 1, 2)
    assert derive_perm((2, 2, 2), (2, 2, 2)) == (0, 1, 2)
    assert derive_perm((3, 4), (4, 4)) is None


def test_transpose_output_is_the_permuted_input() -> None:
    row = _hand_row('Transpose,"""16,8,4""",DT_BF16,ND,"""4,16,8""",DT_BF16,ND')
    replay = get_replay("Transpose")
    assert replay is not None
    view, out = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    base = view.permute(1, 2, 0)  # undo (2,0,1): the buffer the kernel reads
    assert base.is_contiguous() and tuple(base.shape) == (16, 8, 4)
    result = replay.run(view, out)
    assert result.is_contiguous()
    assert torch.equal(result, base.permute(2, 0, 1))


def test_slice_reads_from_offset_zero_and_copies() -> None:
    row = _hand_row('Slice,"""6,40;2;2""",INT64;INT64;INT64,ND;ND;ND,"""2,40""",INT64,ND')
    replay = get_replay("Slice")
    assert replay is not None
    view, out = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert view.storage_offset() == 0 and tuple(view.shape) == (2, 40)
    result = replay.run(view, out)
    assert result.data_ptr() != view.data_ptr()  # a real copy, even for a leading-dim slice
    assert torch.equal(result, view)


def test_gather_matches_embedding_and_advanced_indexing() -> None:
    replay = get_replay("GatherV2")
    assert replay is not None
    row = _hand_row('GatherV2,"""8,32,16;5;1""",FLOAT;INT32;INT64,ND;ND;ND,"""8,5,16""",FLOAT,ND')
    x, indices, axis, _ = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert axis == 1 and indices.dtype == torch.int32
    assert int(indices.min()) >= 0 and int(indices.max()) < 32
    assert torch.equal(replay.run(x, indices, axis, (8, 5, 16)), x[:, indices.long(), :])

    row = _hand_row('GatherV2,"""1000,64;;1""",DT_BF16;INT64;INT64,ND;ND;ND,"""64""",DT_BF16,ND')
    x, indices, axis, shape = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert axis == 0 and shape == (64,) and indices.numel() == 1
    expected = torch.nn.functional.embedding(indices.reshape(()), x)  # a 0-d index picks one row
    assert torch.equal(replay.run(x, indices, axis, shape), expected)

    cells = next(c for _, t, c in ROWS if t == "GatherV2" and c["Input Shapes"].startswith('"151936'))
    args = replay.make_inputs(_row("GatherV2", cells), torch.device("meta"), None)  # type: ignore[arg-type]
    assert args[2] == 0 and tuple(args[1].shape) == (4096,)


def test_concat_axis_and_values() -> None:
    replay = get_replay("ConcatD")
    assert replay is not None
    cells = next(c for _, t, c in ROWS if t == "ConcatD" and c["Input Shapes"].startswith('"4096,1,8,256'))
    row = _row("ConcatD", cells)
    assert replay.make_inputs(row, torch.device("meta"), None)[0] == 3  # type: ignore[arg-type]
    small = _hand_row('ConcatD,"""2,3;2,5""",FLOAT;FLOAT,ND;ND,"""2,8""",FLOAT,ND')
    axis, a, b = replay.make_inputs(small, torch.device("cpu"), torch.Generator().manual_seed(0))
    out = replay.run(axis, a, b)
    assert axis == 1 and torch.equal(out[:, :3], a) and torch.equal(out[:, 3:], b)


def test_rms_norm_matches_torch_rms_norm_and_reports_rstd() -> None:
    replay = get_replay("RmsNorm")
    assert replay is not None
    cells = next(c for _, t, c in ROWS if t == "RmsNorm" and c["Input Shapes"].startswith('"4096,1,8,128'))
    row = _row("RmsNorm", cells)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    y, rstd = replay.run(*args)
    x, gamma = args[0].double(), args[1].double()
    expected = torch.nn.functional.rms_norm(x, [128], gamma, eps=1e-6)
    assert relative_error(y, expected) <= RELATIVE_TOLERANCE["BF16"]
    expected_rstd = 1.0 / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert tuple(rstd.shape) == (4096, 1, 8, 1) and rstd.dtype == torch.float32
    assert relative_error(rstd, expected_rstd) <= RELATIVE_TOLERANCE["FLOAT"]


def test_swiglu_is_silu_of_the_first_half_times_the_second() -> None:
    replay = get_replay("SwiGlu")
    assert replay is not None
    row = _hand_row('SwiGlu,"""6,64""",FLOAT,ND,"""3,64""",FLOAT,ND')
    x, dim = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert dim == 0
    a, b = x[:3].double(), x[3:].double()
    assert relative_error(replay.run(x, dim), a / (1 + torch.exp(-a)) * b) <= 1e-6


def test_cast_reference_is_the_float64_value_rounded_to_the_target() -> None:
    replay = get_replay("Cast")
    assert replay is not None
    cells = next(c for _, t, c in ROWS if t == "Cast" and c["Input Shapes"] == '"1024"')
    row = _row("Cast", cells)
    x, dtype = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    reference = replay.reference(x, dtype)
    assert reference.dtype == torch.bfloat16
    assert torch.equal(replay.run(x, dtype), reference)
    assert relative_error(reference, x.double()) > 0  # it really is rounded, not the float64 value


def test_scalar_slots_are_zero_dim_tensors() -> None:
    replay = get_replay("Add")
    assert replay is not None
    cells = next(c for _, t, c in ROWS if t == "Add" and c["Input Data Types"] == "INT64;INT64")
    row = _row("Add", cells)
    x, y = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert x.dim() == 0 and y.dim() == 0 and x.dtype == torch.int64
    out = replay.run(x, y)
    assert out.dim() == 0 and int(out) == int(x) + int(y)
    # a one-input op: the empty shape cell parses as no slot, its dtype cell still names one
    cast = get_replay("Cast")
    assert cast is not None
    row = _hand_row('Cast,"""""",INT64,ND,"""""",INT32,ND')
    assert row.inputs == () and cast.expected_outputs(row)[0].shape == ()
    x, dtype = cast.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert x.dim() == 0 and x.dtype == torch.int64 and cast.run(x, dtype).dtype == torch.int32


def test_muls_scalar_is_nonzero_and_drawn_from_the_case_seed() -> None:
    replay = get_replay("Muls")
    assert replay is not None
    cells = next(c for _, t, c in ROWS if t == "Muls")
    row = _row("Muls", cells)
    first = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(7))[1]
    again = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(7))[1]
    other = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(8))[1]
    assert isinstance(first, float) and 0.5 <= abs(first) <= 1.5
    assert first == again and first != other


# ----------------------------------------------------------------------------- rejections

REJECTED = [
    ('MatMulV2,"""32,64;48,16""",FLOAT;FLOAT,ND;ND,"""32,16""",FLOAT,ND', "no layout"),
    ('MatMulV3,"""32,64""",FLOAT,ND,"""32,16""",FLOAT,ND', "two operand slots"),
    ('MatMulV2,"""32,64;64,16""",DT_BF16;DT_BF16,ND;ND,"""32,16""",FLOAT,ND', "output dtype FLOAT differs"),
    ('MatMulV2,"""32,64;64,16;32""",FLOAT;FLOAT;FLOAT,ND;ND;ND,"""32,16""",FLOAT,ND', "bias [32] does not"),
    ('MatMulV2,"""32,64;64,16""",INT8;INT8,ND;ND,"""32,16""",INT32,ND', "only floating-point"),
    ('MatMulV2,"""2,32,64;64,16""",FLOAT;FLOAT,ND;ND,"""2,32,16""",FLOAT,ND', "must be 2-D"),
    ('BatchMatMulV2,"""4,16,128;3,128,64""",FLOAT;FLOAT,ND;ND,"""4,16,64""",FLOAT,ND', "batch dims"),
    ('Add,"""4,5;4,6""",FLOAT;FLOAT,ND;ND,"""4,6""",FLOAT,ND', "do not broadcast"),
    ('Add,"""4,1;1,6""",FLOAT;FLOAT,ND;ND,"""4,1""",FLOAT,ND', "broadcast to [4,6]"),
    ('Mul,"""4,6;4,6""",FLOAT;FLOAT,ND;ND,"""4,6""",INT32,ND', "not floating"),
    ('Mul,"""4,6;""",FLOAT;,ND;,"""4,6""",FLOAT,ND', "no data type"),
    ('Add,"""4,6""",FLOAT,ND,"""4,6""",FLOAT,ND', "2 input slot"),
    ('Cast,"""4,6""",FLOAT,ND,"""4,6""",FLOAT,ND', "nothing to convert"),
    ('Cast,"""4,6""",FLOAT,ND,"""6,4""",DT_BF16,ND', "differs from the input"),
    ('Muls,"""4,6""",FLOAT,ND,"""4,6""",DT_BF16,ND', "output dtype"),
    ('RmsNorm,"""16,64;32""",DT_BF16;DT_BF16,ND;ND,"""16,64;16,1""",DT_BF16;FLOAT,ND;ND', "trailing dims"),
    ('RmsNorm,"""16,64;64""",DT_BF16;DT_BF16,ND;ND,"""16,64;16""",DT_BF16;FLOAT,ND;ND', "should be [16,1]"),
    ('RmsNorm,"""16,64;64""",DT_BF16;DT_BF16,ND;ND,"""16,64;16,1""",DT_BF16;DT_BF16,ND;ND', "rstd dtype"),
    ('RmsNorm,"""16,64""",DT_BF16,ND,"""16,64""",DT_BF16,ND', "x;gamma"),
    ('SwiGlu,"""16,7""",DT_BF16,ND,"""16,3""",DT_BF16,ND', "halved along one dimension"),
    ('SwiGlu,"""16,8""",DT_BF16,ND,"""16,4""",FLOAT,ND', "output dtype"),
    ('SoftmaxV2,"""16,8""",FLOAT,ND,"""16,4""",FLOAT,ND', "differs from the input"),
    ('SoftmaxV2,"""16,8""",FLOAT,ND,"""16,8""",DT_BF16,ND', "not producible"),
    ('Transpose,"""2,3;2""",FLOAT;INT64,ND;ND,"""3,3""",FLOAT,ND', "not a permutation"),
    ('Transpose,"""2,3;3""",FLOAT;INT64,ND;ND,"""3,2""",FLOAT,ND', "perm (input slot 1)"),
    ('Slice,"""4,2;2;2""",FLOAT;INT64;INT64,ND;ND;ND,"""4,3""",FLOAT,ND', "does not fit"),
    ('Slice,"""4,2;3;2""",FLOAT;INT64;INT64,ND;ND;ND,"""4,1""",FLOAT,ND', "offsets (input slot 1)"),
    ('GatherV2,"""100,8;4;1""",FLOAT;INT64;INT64,ND;ND;ND,"""5,8""",FLOAT,ND', "no axis"),
    ('GatherV2,"""100,8;4;1""",FLOAT;FLOAT;INT64,ND;ND;ND,"""4,8""",FLOAT,ND', "not INT32/INT64"),
    ('TensorMove,"""4,6""",FLOAT,ND,"""4,6""",DT_BF16,ND', "output dtype"),
    ('TensorMove,"""4,6""",FLOAT,ND,"""4,7""",FLOAT,ND', "differs from the input"),
    ('ConcatD,"""4,6;4,6""",FLOAT;FLOAT,ND;ND,"""4,13""",FLOAT,ND', "do not concatenate"),
    ('ConcatD,"""4,6;4,6""",FLOAT;DT_BF16,ND;ND,"""4,12""",FLOAT,ND', "mixed dtypes"),
]


REJECTED_IDS = [f"{line.split(',')[0]}:{reason}" for line, reason in REJECTED]


@pytest.mark.parametrize(("line", "reason"), REJECTED, ids=REJECTED_IDS)
def test_inconsistent_rows_are_rejected_with_their_reason(line: str, reason: str) -> None:
    row = _hand_row(line)
    replay = get_replay(row.kernel_type)
    assert replay is not None
    with pytest.raises(CaseBuildError) as info:
        replay.check(row)
    assert reason in str(info.value)
    assert row.kernel_type in str(info.value)
    with pytest.raises(CaseBuildError):  # make_inputs never builds what check rejects
        replay.make_inputs(row, torch.device("meta"), None)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- verification


class _AddsOne(AddReplay):
    kernel_types = ()

    def run(self, *args: Any) -> torch.Tensor:
        return super().run(*args) + 1


class _ForgetsToCopy(TensorMoveReplay):
    kernel_types = ()

    def run(self, source: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out


class _TransposedWeight(MatMulReplay):
    """Reads B transposed from the layout the replay built it in."""

    kernel_types = ()

    def run(self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return a.mm(b.t())


def _run_pair(replay: OpReplay, reference: OpReplay, row: KernelRow) -> tuple[Any, Any]:
    args = reference.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    return replay.run(*args), reference.reference(*args)


def test_a_wrong_elementwise_op_fails_verification() -> None:
    row = _hand_row('Add,"""64,128;64,128""",FLOAT;FLOAT,ND;ND,"""64,128""",FLOAT,ND')
    outputs, references = _run_pair(_AddsOne(), AddReplay(), row)
    with pytest.raises(VerificationError) as info:
        verify_outputs(AddReplay(), row, outputs, references)
    message = str(info.value)
    assert "Add output 0 (FLOAT)" in message and "exceeds the threshold 1.0e-04" in message


def test_an_unwritten_output_fails_exact_verification() -> None:
    row = _hand_row('TensorMove,"""64,128""",DT_BF16,ND,"""64,128""",DT_BF16,ND')
    outputs, references = _run_pair(_ForgetsToCopy(), TensorMoveReplay(), row)
    with pytest.raises(VerificationError, match="exact match required"):
        verify_outputs(TensorMoveReplay(), row, outputs, references)


def test_a_wrong_layout_fails_verification() -> None:
    row = _hand_row('MatMulV2,"""64,32;32,32""",FLOAT;FLOAT,ND;ND,"""64,32""",FLOAT,ND')
    assert MatMulReplay().layout(row).name == "NT"  # square B: a linear layer's [N,K]
    outputs, references = _run_pair(_TransposedWeight(), MatMulReplay(), row)
    with pytest.raises(VerificationError, match="relative error"):
        verify_outputs(MatMulReplay(), row, outputs, references)


def test_wrong_shape_dtype_or_count_fails_verification() -> None:
    replay = AddReplay()
    row = _hand_row('Add,"""4,6;4,6""",FLOAT;FLOAT,ND;ND,"""4,6""",FLOAT,ND')
    good = torch.ones(4, 6)
    with pytest.raises(VerificationError, match=r"shape \[6, 4\] differs from the row's \[4, 6\]"):
        verify_outputs(replay, row, torch.ones(6, 4), torch.ones(6, 4))
    with pytest.raises(VerificationError, match="dtype torch.float64 differs from the row's FLOAT"):
        verify_outputs(replay, row, good.double(), good.double())
    with pytest.raises(VerificationError, match="produced 2 output"):
        verify_outputs(replay, row, (good, good), (good, good))
    verify_outputs(replay, row, good, good.double())


def test_nan_never_passes() -> None:
    replay = AddReplay()
    row = _hand_row('Add,"""4,6;4,6""",FLOAT;FLOAT,ND;ND,"""4,6""",FLOAT,ND')
    out = torch.ones(4, 6)
    out[1, 2] = math.nan
    assert relative_error(out, torch.ones(4, 6)) == math.inf
    assert relative_error(torch.ones(3), torch.full((3,), math.inf)) == math.inf
    with pytest.raises(VerificationError, match="relative error inf"):
        verify_outputs(replay, row, out, torch.ones(4, 6))


def test_an_infinity_passes_only_where_the_reference_has_the_same_one() -> None:
    ref = torch.tensor([1.0, -math.inf, 2.0, math.inf])
    assert relative_error(torch.tensor([1.0, -math.inf, 2.0, math.inf]), ref) == 0.0
    assert relative_error(torch.tensor([1.1, -math.inf, 2.0, math.inf]), ref) == pytest.approx(0.1 / math.sqrt(5))
    assert relative_error(torch.tensor([1.0, math.inf, 2.0, math.inf]), ref) == math.inf  # the sign differs
    assert relative_error(torch.tensor([1.0, -1e30, 2.0, math.inf]), ref) == math.inf  # finite where ref is not
    assert relative_error(torch.tensor([1.0, -math.inf, math.nan, math.inf]), ref) == math.inf


def test_relative_error_values() -> None:
    ref = torch.tensor([3.0, 4.0])
    assert relative_error(torch.tensor([3.0, 4.5]), ref) == pytest.approx(0.1)
    assert relative_error(torch.zeros(2), torch.zeros(2)) == 0.0
    assert relative_error(torch.ones(2), torch.zeros(2)) == math.inf
    assert relative_error(torch.ones(2), torch.ones(3)) == math.inf
    big = torch.arange(1, 5_000_001, dtype=torch.float32)  # spans several reduction chunks
    shifted = big.clone()
    shifted[-1] += 1.0
    assert relative_error(shifted, big) == pytest.approx(1.0 / float(big.double().norm()), rel=1e-9)


def test_integer_outputs_are_compared_exactly() -> None:
    replay = get_replay("Cast")
    assert replay is not None
    cells = next(c for _, t, c in ROWS if t == "Cast" and c["Input Data Types"] == "INT64")
    row = _row("Cast", cells)
    x, dtype = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    out = replay.run(x, dtype)
    verify_outputs(replay, row, out, replay.reference(x, dtype))
    off_by_one = out.clone()
    off_by_one.view(-1)[0] += 1
    with pytest.raises(VerificationError, match="1 of 4096 elements differ"):
        verify_outputs(replay, row, off_by_one, replay.reference(x, dtype))


def test_other_spellings_of_a_float_dtype_share_its_tolerance() -> None:
    from perf_plugin.replay.base import RELATIVE_TOLERANCE
    from perf_plugin.replay.registry import get_replay
    from perf_plugin.replay.tensors import TensorSpec

    replay = get_replay("Add")
    assert replay is not None
    assert replay.tolerance(TensorSpec((4,), "BFLOAT16")) == RELATIVE_TOLERANCE["BF16"]
    assert replay.tolerance(TensorSpec((4,), "FP16")) == RELATIVE_TOLERANCE["FLOAT16"]
    assert replay.tolerance(TensorSpec((4,), "FP32")) == RELATIVE_TOLERANCE["FLOAT"]
    assert replay.tolerance(TensorSpec((4,), "INT64")) == 0.0
