"""The dtype of a cat's tensor list, which the profiler does not record, from a real H100 trace.

``tests/fixtures/cuda/rope_cat_trace.json`` (see its SOURCES.md) holds two cats of bf16 tensors:
the rotate-half of a RoPE, which a ``mul`` reads next, and a KV-cache append whose result nothing
reads.  Both launched ``CatArrayBatchedCopy`` kernels on a 2-byte opaque type, and every 2-byte
tensor the trace records is BF16.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from perf_plugin.ingest.list_dtypes import cat_element_bytes
from perf_plugin.ingest.pipeline import ingest_path
from tests.kernels.support import kernel_row, replay_of, replay_on_cpu

TRACE = Path(__file__).parent / "fixtures" / "cuda" / "rope_cat_trace.json"


@pytest.fixture(scope="module")
def concat_rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    db = tmp_path_factory.mktemp("cat") / "db"
    ingest_path(TRACE, db)
    with (db / "ConcatD.csv").open(newline="") as handle:
        return {row["Output Shapes"]: row for row in csv.DictReader(handle)}


def test_a_cat_read_by_the_next_operator_gets_its_dtype(concat_rows: dict[str, dict[str, str]]) -> None:
    rope = concat_rows['"1,8,64,64"']
    assert (rope["Input Data Types"], rope["Output Data Types"]) == ("DT_BF16;DT_BF16", "DT_BF16")
    replay_on_cpu("ConcatD", rope)


def test_a_cat_nothing_reads_takes_the_one_dtype_of_its_size_in_the_trace(concat_rows: dict[str, dict[str, str]]) -> None:
    cache = concat_rows['"1,8,128,64"']
    assert (cache["Input Data Types"], cache["Output Data Types"]) == ("DT_BF16;DT_BF16", "DT_BF16")
    replay_on_cpu("ConcatD", cache)


def test_a_cat_stays_without_dtypes_where_the_trace_has_two_of_its_size(tmp_path: Path) -> None:
    """The same trace with one FLOAT16 tensor recorded elsewhere: nothing settles the unread cat."""
    document = json.loads(TRACE.read_text())
    for event in document["traceEvents"]:
        types = (event.get("args") or {}).get("Input type")
        if event.get("cat") == "cpu_op" and event.get("name") == "aten::mul" and types and "c10::BFloat16" in types:
            event["args"]["Input type"] = ["c10::Half" if t == "c10::BFloat16" else t for t in types]
            break
    else:
        raise AssertionError("the fixture has no bf16 mul")
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(document))
    ingest_path(trace, tmp_path / "db")
    with (tmp_path / "db" / "ConcatD.csv").open(newline="") as handle:
        rows = {row["Output Shapes"]: row for row in csv.DictReader(handle)}
    assert (rows['"1,8,128,64"']["Input Data Types"], rows['"1,8,128,64"']["Output Data Types"]) == (";", "")
    assert rows['"1,8,64,64"']["Output Data Types"] == "FLOAT16"  # its reader (the mul made FLOAT16) settles it


def test_only_batched_copy_kernels_of_one_element_size_say_the_size() -> None:
    two = "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 4, 64, 64>(...)"
    four = two.replace("OpaqueType<2u>", "OpaqueType<4u>")
    assert cat_element_bytes([two]) == 2 and cat_element_bytes([two, two]) == 2
    assert cat_element_bytes([two, four]) is None  # mixed: no single size
    assert cat_element_bytes(["void at::native::copy_kernel(...)"]) is None  # the mixed-dtype path


def test_a_cat_of_views_keeps_its_recorded_strides_and_replays_on_those_views(concat_rows: dict[str, dict[str, str]]) -> None:
    """The rotate-half cat reads a slice of q (strides of the un-sliced [1,8,64,64]) and a
    contiguous tensor; its kernel was the generic batched copy, while a cat of contiguous inputs
    takes the vectorized one (the other row here): the strides are what tell them apart."""
    rope = concat_rows['"1,8,64,64"']
    assert rope["Input Strides"] == '"16384,2048,32,1;32768,4096,64,1"'
    assert "CatArrayBatchedCopy<" in rope["Profiling Kernels"]
    assert "CatArrayBatchedCopy_vectorized" in concat_rows['"1,8,128,64"']["Profiling Kernels"]
    assert concat_rows['"1,8,128,64"'].get("Input Strides", "") == ""  # contiguous: nothing to record
    replay = replay_of("ConcatD")
    args = replay.make_inputs(kernel_row("ConcatD", rope), torch.device("cpu"), torch.Generator().manual_seed(0))
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    assert [t.stride() for t in tensors] == [(16384, 2048, 32, 1), (32768, 4096, 64, 1)]


# Kernels of an H200 profile of ``hf:ernie4_5_moe`` (benchmarks/model_coverage.py): the copy one
# input of ``torch.stack((x1, x2), -1)`` took (strided halves of a rotary's heads), and a Cast's
# converting copy of bf16 to float.
STACK_COPY = (
    "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda"
    "(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)"
    "#1}>(at::TensorIteratorBase&, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() "
    "const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16)#1} const&)::{lambda(int)#1}>(int, ...)"
)
CONVERTING_COPY = (
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}"
    "::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>, 4, "
    "TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, "
    "at::native::memory::StoreWithCast<1> >(int, ...)"
)


def test_a_cat_of_views_copied_input_by_input_takes_the_copies_type() -> None:
    from perf_plugin.ingest.list_dtypes import copy_dtype, resolve_cat_dtypes
    from perf_plugin.ingest.trace_attribution import OpSample
    from perf_plugin.trace.events import TraceOp
    from perf_plugin.trace.mapped import MappedOp, Slot

    assert copy_dtype([STACK_COPY, STACK_COPY]) == "DT_BF16"
    assert copy_dtype([CONVERTING_COPY]) is None and copy_dtype([STACK_COPY, CONVERTING_COPY]) is None
    assert copy_dtype([]) is None
    half = (1, 20, 512, 64, 1)
    strides = ((1310720, 65536, 128, 2, 1), (1310720, 65536, 128, 2, 1))
    cat = MappedOp("ConcatD", (Slot(half, ""), Slot(half, "")), (Slot((1, 20, 512, 64, 2), ""),), strides)
    sample = OpSample(TraceOp("aten::stack", (1, 1), 0, 10), kernels=[STACK_COPY, STACK_COPY])
    resolved = resolve_cat_dtypes(cat, sample, [])
    assert [slot.dtype for slot in (*resolved.inputs, *resolved.outputs)] == ["DT_BF16"] * 3
    cells = {
        "Input Shapes": '"1,20,512,64,1;1,20,512,64,1"', "Input Data Types": "DT_BF16;DT_BF16", "Input Formats": "ND;ND",
        "Output Shapes": '"1,20,512,64,2"', "Output Data Types": "DT_BF16", "Output Formats": "ND",
        "Input Strides": '"1310720,65536,128,2,1;1310720,65536,128,2,1"',
    }  # fmt: skip
    outputs, _ = replay_on_cpu("ConcatD", cells)
    assert tuple(outputs.shape) == (1, 20, 512, 64, 2)


def test_a_cpu_cat_takes_its_readers_dtype(tmp_path: Path) -> None:
    """A CPU profile launches no kernels: a rotary ``cat((-x2, x1), -1)`` read by the ``mul`` after
    it, and a key cache's ``cat`` read by attention, take their readers' dtype; a cat nothing
    reads takes the one dtype the trace recorded for its inputs' shape, and stays without where
    the trace recorded two."""
    from torch.profiler import ProfilerActivity, profile

    q = torch.randn(1, 4, 8, 16, dtype=torch.bfloat16)
    sin = torch.randn(1, 1, 8, 16, dtype=torch.bfloat16)
    past = torch.randn(1, 4, 24, 16, dtype=torch.bfloat16)
    mixed = torch.randn(3, 7)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        rotated = torch.cat((-q[..., 8:], q[..., :8]), dim=-1) * sin
        keys = torch.cat((past, rotated), dim=-2)
        torch.matmul(rotated, keys.transpose(-1, -2))
        torch.cat((q, q), dim=0)  # read by nothing: q's shape is recorded in bfloat16 alone
        halved = mixed.to(torch.bfloat16) * 2  # [3, 7] recorded in float32 and in bfloat16
        torch.cat((halved, halved), dim=0)  # read by nothing
    trace = tmp_path / "cpu.pt.trace.json"
    prof.export_chrome_trace(str(trace))
    ingest_path(trace, tmp_path / "db")
    with (tmp_path / "db" / "ConcatD.csv").open(newline="") as handle:
        rows = {row["Output Shapes"]: row for row in csv.DictReader(handle)}
    for shape in ('"1,4,8,16"', '"1,4,32,16"'):
        assert (rows[shape]["Input Data Types"], rows[shape]["Output Data Types"]) == ("DT_BF16;DT_BF16", "DT_BF16")
        replay_on_cpu("ConcatD", rows[shape])
    assert (rows['"2,4,8,16"']["Input Data Types"], rows['"2,4,8,16"']["Output Data Types"]) == ("DT_BF16;DT_BF16", "DT_BF16")
    assert (rows['"6,7"']["Input Data Types"], rows['"6,7"']["Output Data Types"]) == (";", "")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_cpu_cat_nothing_reads_takes_the_dtype_of_the_views_it_writes(tmp_path: Path, dtype: torch.dtype) -> None:
    """GPT-OSS's rotary ``cat((first, second), -1)`` of two [1, 4, 512, 32] halves: on the CPU a cat
    this large copies each input into a ``narrow`` view of its result, recorded as its child with
    the result's dtype; no operator in sight reads the result."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(1, 4, 512, 64, dtype=dtype)
    cos, sin = torch.randn(1, 1, 512, 32, dtype=dtype), torch.randn(1, 1, 512, 32, dtype=dtype)
    other = torch.randn(3, 5)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # with one thread (a pytest-xdist worker's) the cat copies serially, without views
    try:
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            first_half, second_half = torch.chunk(x, 2, dim=-1)
            torch.cat((first_half * cos - second_half * sin, second_half * cos + first_half * sin), dim=-1)
            for _ in range(10):  # the next operators read other tensors
                other = other * 2
    finally:
        torch.set_num_threads(threads)
    names = [event.name for event in prof.events()]
    assert names[names.index("aten::cat") + 1] == "aten::narrow"  # the premise: the cat writes through views
    trace = tmp_path / "cpu.pt.trace.json"
    prof.export_chrome_trace(str(trace))
    ingest_path(trace, tmp_path / "db")
    with (tmp_path / "db" / "ConcatD.csv").open(newline="") as handle:
        (row,) = csv.DictReader(handle)
    expected = "DT_BF16" if dtype == torch.bfloat16 else "FLOAT"
    assert (row["Input Data Types"], row["Output Data Types"]) == (f"{expected};{expected}", expected)
    replay_on_cpu("ConcatD", row)


SINGLE_CAT_TRACE = Path(__file__).parent / "fixtures" / "cuda" / "single_cat_trace.json"


def _single_cat_rows(trace: Path, db: Path) -> dict[str, dict[str, str]]:
    ingest_path(trace, db)
    with (db / "ConcatD.csv").open(newline="") as handle:
        return {row["Input Shapes"]: row for row in csv.DictReader(handle)}


def test_a_cuda_cat_of_one_tensor_copied_by_memcpy_takes_the_dtype_of_the_views_it_writes(tmp_path: Path) -> None:
    """``tests/fixtures/cuda/single_cat_trace.json`` (H200, see its SOURCES.md): a cat of one bf16
    and one float32 tensor, each copied by a ``Memcpy DtoD`` that names no element type, and a
    two-tensor cat by a batched copy."""
    rows = _single_cat_rows(SINGLE_CAT_TRACE, tmp_path / "db")
    one_bf16, one_float = rows['"1,32,1,128"'], rows['"1,8,1,64"']
    assert one_bf16["Profiling Kernels"].startswith("Memcpy DtoD (Device -> Device)=")
    assert (one_bf16["Input Data Types"], one_bf16["Output Data Types"]) == ("DT_BF16", "DT_BF16")
    assert (one_float["Input Data Types"], one_float["Output Data Types"]) == ("FLOAT", "FLOAT")
    assert rows['"1,32,1,128;1,32,1,128"']["Input Data Types"] == "DT_BF16;DT_BF16"
    outputs, _ = replay_on_cpu("ConcatD", one_float)
    assert outputs.dtype == torch.float32 and tuple(outputs.shape) == (1, 8, 1, 64)


def test_a_memcpy_cat_without_typed_views_takes_its_readers_dtype(tmp_path: Path) -> None:
    """The same trace with the dtypes of the cats' own children (``narrow``/``slice`` views of the
    result) removed: the bf16 cat's ``transpose`` reads it next, the float cat's ``to`` reads it."""
    document = json.loads(SINGLE_CAT_TRACE.read_text())
    for event in document["traceEvents"]:
        if event.get("cat") == "cpu_op" and event.get("name") in ("aten::narrow", "aten::slice", "aten::as_strided"):
            event["args"]["Input type"] = ["" for _ in event["args"].get("Input type", [])]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(document))
    rows = _single_cat_rows(trace, tmp_path / "db")
    assert rows['"1,32,1,128"']["Output Data Types"] == "DT_BF16"
    assert rows['"1,8,1,64"']["Output Data Types"] == "FLOAT"


def test_a_memcpy_cat_with_nothing_to_settle_it_stays_without_dtypes(tmp_path: Path) -> None:
    """Neither typed views nor a typed reader: the row says it cannot be replayed, not a guess."""
    document = json.loads(SINGLE_CAT_TRACE.read_text())
    for event in document["traceEvents"]:
        if event.get("cat") == "cpu_op" and event.get("name") not in ("aten::cat",):
            event.setdefault("args", {})["Input type"] = ["" for _ in event.get("args", {}).get("Input type", [])]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(document))
    rows = _single_cat_rows(trace, tmp_path / "db")
    assert (rows['"1,8,1,64"']["Input Data Types"], rows['"1,8,1,64"']["Output Data Types"]) == ("", "")
