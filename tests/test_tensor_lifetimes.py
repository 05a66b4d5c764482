"""Tensor lifetimes from the allocator's events, and the producers they rule out."""

from __future__ import annotations

import math
from pathlib import Path

from perf_plugin.ingest.input_reuse import reuse_distances
from perf_plugin.ingest.tensor_lifetimes import release_times
from perf_plugin.ingest.trace_events import read_chrome_trace
from perf_plugin.trace.events import MemoryEvent, TraceOp
from perf_plugin.trace.mapped import MappedOp, Slot

FIXTURE = Path(__file__).parent / "fixtures" / "cuda" / "quantize_residual_trace.json"
BF16 = "DT_BF16"
MAIN, OTHER = (1, 1), (1, 2)
CUDA = 1


def traced(name: str, start: int, end: int, thread: tuple[int, int] = MAIN) -> TraceOp:
    return TraceOp(name, thread, start, end)


def mapped(inputs: list[tuple[int, ...]], outputs: list[tuple[int, ...]]) -> MappedOp:
    return MappedOp("Op", tuple(Slot(s, BF16) for s in inputs), tuple(Slot(s, BF16) for s in outputs))


def block(time: int, address: int, size: int, thread: tuple[int, int] = MAIN) -> MemoryEvent:
    return MemoryEvent(thread, time, address, size, CUDA)


def test_an_output_is_the_block_allocated_in_its_operator_and_released_after_it() -> None:
    """A [1,1,256] bf16 output (512 B) of the first operator, released at 500; the second
    operator's temporary (allocated and released inside it) and a block of another thread are
    not its output, and the third operator allocated nothing (in place)."""
    ops = [
        (traced("aten::mul", 0, 100), mapped([], [(1, 1, 256)])),
        (traced("aten::add", 200, 300), mapped([], [(1, 1, 300)])),  # 600 B: a block of 1024
        (traced("aten::add_", 400, 450), mapped([], [(1, 1, 256)])),
    ]
    memory = [
        block(10, 0xA000, 512), block(500, 0xA000, -512),
        block(210, 0xB000, 512), block(250, 0xB000, -512),  # a temporary of the add
        block(220, 0xC000, 512, thread=OTHER),
        block(230, 0xD000, 1024),  # held to the end of the profile
    ]
    assert release_times(ops, memory) == [(500,), (None,), (None,)]


def test_an_address_reused_after_a_release_is_a_new_block() -> None:
    ops = [(traced("a", 0, 10), mapped([], [(256,)])), (traced("b", 20, 30), mapped([], [(256,)]))]
    memory = [block(5, 0xA000, 512), block(15, 0xA000, -512), block(25, 0xA000, 512), block(40, 0xA000, -512)]
    assert release_times(ops, memory) == [(15,), (40,)]


def test_a_released_output_is_no_candidate_for_a_later_reader() -> None:
    """x is written, then a temporary of its shape that is released before the reader starts:
    the reader reads x, with the temporary's bytes in between."""
    ops = [mapped([], [(1024,)]), mapped([], [(1024,)]), mapped([(1024,)], [(1024,)])]
    starts = [0, 100, 200]
    shape_bytes = 2048
    assert reuse_distances(ops, starts, [(None,), (150,), (None,)])[2] == (2 * shape_bytes,)
    assert reuse_distances(ops, starts, [(None,), (250,), (None,)])[2] == (shape_bytes,)  # still alive
    assert reuse_distances(ops)[2] == (shape_bytes,)  # no lifetimes: the newest


def test_a_live_output_outlasts_the_released_ones_written_after_it() -> None:
    """More released outputs of its shape than the inference keeps per shape come after x."""
    ops = [mapped([], [(64,)])] + [mapped([], [(64,)]) for _ in range(12)] + [mapped([(64,)], [(64,)])]
    starts = list(range(0, 1400, 100))
    released: list[tuple[int | None, ...]] = [(None,)] + [(start + 50,) for start in starts[1:13]] + [(None,)]
    assert reuse_distances(ops, starts, released)[13] == (13 * 128,)


def test_the_real_trace_holds_the_allocators_events() -> None:
    trace = read_chrome_trace(FIXTURE)
    assert trace.memory, "profiled with profile_memory=True"
    cuda = {event.size for event in trace.memory if event.device_type == CUDA}
    # the caching allocator's blocks; the CPU's hold the Python number 448.0 wrapped as a tensor
    assert all(size % 512 == 0 for size in cuda) and any(size < 0 for size in cuda)


def test_a_trace_without_memory_events_has_none(tmp_path: Path) -> None:
    rope = Path(__file__).parent / "fixtures" / "cuda" / "rope_cat_trace.json"
    assert read_chrome_trace(rope).memory == []


def test_nothing_inferred_for_an_empty_profile() -> None:
    assert release_times([], []) == [] and reuse_distances([]) == []
    assert math.isinf(reuse_distances([mapped([(4,)], [(4,)])])[0][0])


def _reuse_cells(memory: bool) -> dict[str, str]:
    from perf_plugin.ingest.aggregate import aggregate
    from perf_plugin.ingest.torch_trace import trace_samples

    trace = read_chrome_trace(FIXTURE)
    if not memory:
        trace.memory = []
    table, _ = trace_samples(trace)
    return {row.kernel_type: row.input_reuse for row in aggregate(table.frame, table.counters)}


def test_the_residual_add_reads_the_residual_not_a_released_temporary() -> None:
    """The real trace of three quantized layers: the add's second input is the previous layer's
    sum (written before the norm, the scale, the division, the GEMM and the rescale); read
    without the allocator's events, the newest temporary of its shape stood in for it."""
    with_lifetimes, without = _reuse_cells(memory=True), _reuse_cells(memory=False)
    residual = float(with_lifetimes["Add"].split(";")[1])
    assert residual > 128 * 1024  # the layer's traffic, its 256x256 bf16 weight included
    assert float(without["Add"].split(";")[1]) < residual


def test_the_division_reads_the_scale_the_previous_kernel_wrote() -> None:
    """``x / scale`` with a 0-d float32 scale on the device: its writer (``clamp``) ran just
    before, so the scale is in the cache, not read from memory."""
    assert _reuse_cells(memory=True)["RealDiv"].split(";")[1] == "6"
