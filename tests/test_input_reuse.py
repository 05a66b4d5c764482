"""Reuse distances of traced inputs: inferred producers, the row cell, and ingest writing it."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.reuse_cell import parse_reuse_cell, reuse_cell
from perf_plugin.database.schema import PROFILING_INPUT_REUSE, PROFILING_INPUT_REUSE_SPREAD, PROFILING_KERNELS
from perf_plugin.ingest.input_reuse import ONE_WAVE_ELEMENTS, reads_after_write, reuse_distances, reuse_distances_and_spreads
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.trace.mapped import MappedOp, Slot

FIXTURES = Path(__file__).parent / "fixtures"
BF16, F32 = "DT_BF16", "FLOAT"


def op(inputs: list[tuple[tuple[int, ...] | None, str]], outputs: list[tuple[tuple[int, ...], str]],
       strides: tuple[tuple[int, ...] | None, ...] = ()) -> MappedOp:
    return MappedOp("Op", tuple(Slot(s, d) for s, d in inputs), tuple(Slot(s, d) for s, d in outputs), strides)


def test_an_input_written_by_the_previous_operator_is_its_output_plus_half_its_reads_ago() -> None:
    producer = op([((1024,), F32)], [((1024,), F32)])  # reads 4096 B, writes 4096 B
    consumer = op([((1024,), F32)], [((1024,), F32)])
    assert reuse_distances([producer, consumer]) == [(math.inf,), (4096 / 2 + 4096,)]


def test_traffic_in_between_adds_to_the_distance_and_a_parameter_has_none() -> None:
    """x -> big GEMM -> add(x, weight): x's distance counts the GEMM's bytes; the weight was never
    written by a traced operator (a parameter)."""
    make_x = op([], [((512, 4096), BF16)])
    gemm = op([((512, 4096), BF16), ((4096, 4096), BF16)], [((512, 4096), BF16)])
    add = op([((1024, 1024), F32), ((64,), F32)], [((1024, 1024), F32)])
    consume = op([((512, 4096), BF16), ((9, 9), F32)], [((512, 4096), BF16)])
    distances = reuse_distances([make_x, gemm, add, consume])
    x_bytes, weight_bytes = 512 * 4096 * 2, 4096 * 4096 * 2
    # the latest bf16 output of x's element count is the GEMM's: it produced what is read
    gemm_out_written = x_bytes + (x_bytes + weight_bytes) / 2
    assert distances[3][0] == x_bytes + x_bytes + weight_bytes + x_bytes - gemm_out_written + (4 * 2**20 + 256 + 4 * 2**20)
    assert distances[3][1] == math.inf and distances[2] == (math.inf, math.inf)


def test_a_decode_gemm_writes_its_output_after_all_its_reads() -> None:
    """The vocabulary projection of a decode step streams 197 MB of weights and writes 64 KB of
    logits in one wave of tiles: the argmax after it finds them as fresh as the logits' bytes."""
    logits = (1, 32064)
    gemm = op([((1, 3072), BF16), ((32064, 3072), BF16)], [(logits, BF16)])
    argmax = op([((1, 1, 32064), BF16)], [((1, 1), "INT64")])
    assert reuse_distances([gemm, argmax])[1] == (32064 * 2,)
    # the same bytes written by an element-wise operator were written halfway through its reads
    cast = op([((1, 32064), F32)], [(logits, BF16)])
    assert reuse_distances([cast, argmax])[1] == (32064 * 4 / 2 + 32064 * 2,)


def test_a_contraction_over_several_waves_writes_a_tile_before_the_later_waves_reads() -> None:
    rows = 4 * ONE_WAVE_ELEMENTS // 1024  # four waves of output tiles
    weight = (1024, 64 * 1024)  # read 64x the bytes written: a contraction
    gemm = op([((rows, 64 * 1024), BF16), (weight, BF16)], [((rows, 1024), BF16)])
    read = (rows * 64 * 1024 + weight[0] * weight[1]) * 2
    assert reads_after_write(gemm) == read / 2 * (1 - 1 / 4)
    consumer = op([((rows, 1024), BF16)], [((rows, 1024), BF16)])
    assert reuse_distances([gemm, consumer])[1] == (read / 2 * (1 - 1 / 4) + rows * 1024 * 2,)
    assert reads_after_write(op([((rows, 1024), BF16)], [((rows, 1024), BF16)])) == rows * 1024 * 2 / 2


def test_an_inputs_bytes_lie_over_the_range_its_last_user_wrote_or_read_them() -> None:
    """Logits of a vocabulary GEMV of 1.5625 waves (102400 words): its first wave's tiles have the
    last wave's weight reads after them, its last wave none, so the argmax finds them between 0
    and twice their average distance away; an element-wise producer's output spreads over half
    its reads either side; a tensor last read spreads over half its reader's reads."""
    vocab, hidden = 102400, 2048
    gemm = op([((1, hidden), BF16), ((vocab, hidden), BF16)], [((1, vocab), BF16)])
    argmax = op([((1, 1, vocab), BF16)], [((1, 1), "INT64")])
    distances, spreads = reuse_distances_and_spreads([gemm, argmax])
    assert spreads[0] == (math.inf, math.inf)
    after = reads_after_write(gemm)
    read = (hidden + vocab * hidden) * 2
    assert after == pytest.approx(read / 2 * (1 - ONE_WAVE_ELEMENTS / vocab))
    assert distances[1] == pytest.approx((after + vocab * 2,)) and spreads[1] == (after,)  # 75.7 MB: DeepSeek-V3 on an H200
    cast = op([((4096,), F32)], [((4096,), BF16)])
    first = op([((4096,), BF16)], [((4096,), F32)])
    second = op([((4096,), BF16), ((64,), F32)], [((64,), F32)])
    distances, spreads = reuse_distances_and_spreads([cast, first, second])
    assert spreads[1] == (4096 * 4 / 2,)  # the Cast's reads
    assert spreads[2][0] == 4096 * 2 / 2 and distances[2][0] == 4096 * 2 / 2 + 4096 * 4  # read by ``first``


def test_keys_built_by_copies_into_slices_of_one_buffer_are_read_whole() -> None:
    """MLA decode: ``k = new_empty(...)``, then ``k[..., :128].copy_(nope)`` and
    ``k[..., 128:].copy_(rope)``; attention reads ``k`` whole, written by the last copy."""
    strides = (1575936, 98496, 192, 1)
    in_place = '{"overload":"default","args":[{"tensor":0},{"tensor":1},false],"operator":"copy_"}'

    def copy(width: int, arguments: str) -> MappedOp:
        view = Slot((1, 16, 513, width), BF16)
        return MappedOp("aten.copy", (view, Slot((1, 16, 513, width), BF16)), (view,), (strides, None), arguments)

    attention = op([((1, 16, 1, 192), BF16), ((1, 16, 513, 192), BF16)], [((1, 16, 1, 192), BF16)])
    rope_bytes = 16 * 513 * 64 * 2
    distances = reuse_distances([copy(128, in_place), copy(64, in_place), attention])
    # the last copy read its view and its source (half of both before the write) and wrote the view
    assert distances[2] == (math.inf, 2 * rope_bytes / 2 + rope_bytes)
    # an out-of-place operator reading a strided view writes a tensor of its own
    assert reuse_distances([copy(128, ""), copy(64, ""), attention])[2] == (math.inf, math.inf)


def test_a_tensor_concatenated_with_itself_is_read_in_both_slots() -> None:
    """Rotary embedding's ``cat((freqs, freqs), -1)``: one table in both slots, not a parameter;
    an element-wise operator's second input of the same shape stays without a writer."""
    freqs = op([], [((1, 32, 1), F32)])  # a transposed view of it is read as [1,1,32]
    halves = (Slot((1, 1, 32), F32), Slot((1, 1, 32), F32))
    cat = MappedOp("ConcatD", halves, (Slot((1, 1, 64), F32),))
    assert reuse_distances([freqs, cat])[1] == (128, 128)
    add = MappedOp("Add", halves, (Slot((1, 1, 32), F32),))
    assert reuse_distances([freqs, add])[1] == (128, math.inf)


def test_a_broadcast_operand_matches_only_an_output_of_its_very_shape() -> None:
    """A norm's weight [4096] times activations [1,1,4096]: the element count alone would pair
    the weight with the activation the previous operator wrote."""
    cast = op([((1, 1, 4096), F32)], [((1, 1, 4096), BF16)])
    scale = op([((4096,), BF16), ((1, 1, 4096), BF16)], [((1, 1, 4096), BF16)])
    assert reuse_distances([cast, scale])[1] == (math.inf, 4096 * 4 / 2 + 4096 * 2)
    rsqrt = op([((1, 1, 1), F32)], [((1, 1, 1), F32)])
    times = op([((1, 1, 4096), F32), ((1, 1, 1), F32)], [((1, 1, 4096), F32)])
    assert reuse_distances([rsqrt, times])[1][1] == 4 / 2 + 4  # a keepdim statistic of its very shape


def test_a_0d_device_operand_matches_the_0d_output_that_wrote_it() -> None:
    """A per-tensor quantization scale the previous kernel computed; a host scalar (an empty
    slot) is passed by value and has no writer."""
    clamp = op([((), F32)], [((), F32)])
    divide = op([((1, 4096), BF16), ((), F32)], [((1, 4096), BF16)])
    assert reuse_distances([clamp, divide])[1] == (math.inf, 4 / 2 + 4)
    by_value = op([((1, 4096), BF16), (None, F32)], [((1, 4096), BF16)])
    assert reuse_distances([clamp, by_value])[1] == (math.inf, math.inf)


def test_an_indexed_input_is_not_a_broadcast_operand() -> None:
    """``x[idx]`` of a [1,2048] view of a [1,1,2048] norm output into [8,2048] rows: the
    exact-shape rule of broadcast operands does not apply to an operator that is not element-wise."""
    norm = op([], [((1, 1, 2048), BF16)])
    index = MappedOp("Op", (Slot((1, 2048), BF16), Slot((8,), "INT64")), (Slot((8, 2048), BF16),))
    assert reuse_distances([norm, index])[1] == (4096, math.inf)


def test_a_strided_view_matches_the_latest_output_covering_its_span() -> None:
    """The second half of each head (rotary embedding's negated half) reads part of q."""
    q = op([], [((1, 32, 1, 128), BF16)])
    other = op([], [((2048,), BF16)])  # as many elements as the view: not what the view reads
    neg = op([((1, 32, 1, 64), BF16)], [((1, 32, 1, 64), BF16)], strides=((4096, 128, 4096, 1),))
    distances = reuse_distances([q, other, neg])
    assert distances[2] == (8192 + 4096,)  # q's output and the other's, not the other's alone
    contiguous = op([((1, 32, 1, 64), BF16)], [((1, 32, 1, 64), BF16)])
    assert reuse_distances([q, other, contiguous])[2] == (4096,)


def test_each_output_feeds_one_slot_newest_first() -> None:
    first = op([], [((8, 8), F32)])
    second = op([], [((8, 8), F32)])
    add = op([((8, 8), F32), ((8, 8), F32), ((8, 8), F32)], [((8, 8), F32)])
    assert reuse_distances([first, second, add])[2] == (256, 512, math.inf)


def test_of_one_producers_outputs_the_one_of_the_inputs_shape_is_taken() -> None:
    split = op([], [((4, 16), F32), ((16, 4), F32)])
    consumer = op([((4, 16), F32)], [((4, 16), F32)])
    newer = op([], [((64,), F32)])
    assert reuse_distances([split, consumer])[1] == (512,)
    assert reuse_distances([split, newer, consumer])[2] == (256,)  # the newer output wins over the shape


def test_the_cell_holds_each_slots_median_and_marks_inputs_without_producer() -> None:
    samples = [(100.0, math.inf), (300.0, math.inf), (200.0, 5.0)]
    assert reuse_cell(samples) == "200;-"
    assert parse_reuse_cell("200;-") == (200.0, math.inf)
    assert parse_reuse_cell("") == () and reuse_cell([]) == ""


@pytest.mark.parametrize("cell", ["12;x", "-5", "nan"])
def test_a_bad_cell_names_the_slot(cell: str) -> None:
    with pytest.raises(DatabaseError, match="slot"):
        parse_reuse_cell(cell)


def test_ingest_of_a_real_cuda_trace_writes_the_column_after_the_kernels(tmp_path: Path) -> None:
    """The H100 trace of the indexing fixture: every row with inputs gets one entry per input
    slot; an index_put_ into a freshly zeroed tensor finds it written just before."""
    ingest_path(FIXTURES / "cuda" / "indexing_trace.json", tmp_path)
    with (tmp_path / "aten.index_put.csv").open(newline="") as handle:
        reader = csv.DictReader(handle)
        header = list(reader.fieldnames or [])
        rows = list(reader)
    assert header.index(PROFILING_INPUT_REUSE) == header.index(PROFILING_KERNELS) + 1
    for row in rows:
        slots = row["Input Shapes"].strip('"').split(";")
        assert len(row[PROFILING_INPUT_REUSE].split(";")) == len(slots)
    written = next(r for r in rows if r["Input Shapes"] == '"64,32;48,32"')
    distances = parse_reuse_cell(written[PROFILING_INPUT_REUSE])
    assert 0 < distances[0] < 2**20 and 0 < distances[1] < 2**20
    # the range of each input's bytes, after the columns the reader already knew
    assert header.index(PROFILING_INPUT_REUSE_SPREAD) > header.index(PROFILING_INPUT_REUSE)
    for row in rows:
        spreads = parse_reuse_cell(row[PROFILING_INPUT_REUSE_SPREAD])
        for distance, spread in zip(parse_reuse_cell(row[PROFILING_INPUT_REUSE]), spreads, strict=True):
            assert math.isinf(spread) == math.isinf(distance) and (math.isinf(spread) or 0 <= spread <= distance + 1)


def test_a_cpu_trace_has_no_reuse_column(tmp_path: Path) -> None:
    ingest_path(FIXTURES / "cpu" / "indexing_trace.json", tmp_path)
    for path in tmp_path.glob("*.csv"):
        header = path.read_text().splitlines()[0]
        assert PROFILING_INPUT_REUSE not in header and PROFILING_INPUT_REUSE_SPREAD not in header


def test_a_strided_broadcast_slice_matches_the_table_it_is_part_of() -> None:
    """Half of a rotary cos table of [1,1,64] read as [1,1,1,32] (row stride 64) against q's
    [1,16,1,32] half-heads: the table's writer, not an output of the slice's own shape."""
    cos = op([], [((1, 1, 64), BF16)])
    other = op([], [((1, 1, 1, 32), BF16)])  # the slice's own shape, but not the table
    q = op([], [((1, 16, 1, 64), BF16)])
    mul = op([((1, 16, 1, 32), BF16), ((1, 1, 1, 32), BF16)], [((1, 16, 1, 32), BF16)],
             strides=((1024, 64, 1024, 2), (64, 64, 64, 1)))
    distances = reuse_distances([cos, other, q, mul])
    assert distances[3] == (2048, 128 + 64 + 2048)  # q's output; the table's, then the other two outputs
    # a table of another element count is not the slice's
    wide = op([], [((1, 1, 128), BF16)])
    assert reuse_distances([wide, q, mul])[2][1] == math.inf
    # a prefill's table of 512 positions, its half strided in two dimensions
    table = op([], [((1, 512, 64), BF16)])
    heads = op([], [((1, 16, 512, 64), BF16)])
    half = op([((1, 16, 512, 32), BF16), ((1, 1, 512, 32), BF16)], [((1, 16, 512, 32), BF16)],
              strides=((524288, 32768, 64, 2), (32768, 32768, 64, 1)))
    assert reuse_distances([table, heads, half])[2] == (2**20, 2**20 + 65536)


def test_a_broadcast_operand_chooses_before_the_slot_of_the_outputs_shape() -> None:
    """Gemma's norm ``x * (1 + w)`` in a decode step (H200 trace of ``hf:gemma3_text``): the
    ``1 + w`` of ``[2304]`` is newer than ``x`` of ``[1,1,2304]`` and has its element count; taken
    by ``x``'s slot first, it left the operand without a writer, replayed from memory (1.29x)."""
    x = op([], [((1, 1, 2304), F32)])
    one_plus_w = op([((2304,), BF16)], [((2304,), F32)])  # from the bf16 weight, no writer
    scale = op([((1, 1, 2304), F32), ((2304,), F32)], [((1, 1, 2304), F32)])
    distances = reuse_distances([x, one_plus_w, scale])
    assert distances[2] == (9216 + 4608 + 9216, 4608 / 2 + 9216)


def test_an_operand_matches_its_table_written_without_the_dimensions_of_1() -> None:
    """A rotary ``cos`` written as ``[1,1,128]`` and read unsqueezed as ``[1,1,1,128]`` against
    q's ``[1,8,1,128]``; a weight of ``[128]`` is still not an activation of ``[1,1,128]``."""
    cos = op([], [((1, 1, 128), BF16)])
    q = op([], [((1, 8, 1, 128), BF16)])
    mul = op([((1, 8, 1, 128), BF16), ((1, 1, 1, 128), BF16)], [((1, 8, 1, 128), BF16)])
    assert reuse_distances([cos, q, mul])[2] == (2048, 256 + 2048)
    weight_times = op([((1, 1, 128), BF16), ((128,), BF16)], [((1, 1, 128), BF16)])
    assert reuse_distances([cos, weight_times])[1] == (256, math.inf)


def test_a_tensor_converted_once_is_no_candidate_for_a_second_conversion_to_that_dtype() -> None:
    """Gemma's decode norm (H200 trace of ``hf:gemma3_text``): ``x.float()`` of the projection's
    ``[1,2304]`` output, then ``weight.float()`` of the ``[2304]`` weight, which no traced operator
    wrote; by element count it had paired with ``x``."""
    projection = op([((1, 9216), BF16), ((2304, 9216), BF16)], [((1, 2304), BF16)])
    x_float = MappedOp("Cast", (Slot((1, 1, 2304), BF16),), (Slot((1, 1, 2304), F32),))
    weight_float = MappedOp("Cast", (Slot((2304,), BF16),), (Slot((2304,), F32),))
    distances = reuse_distances([projection, x_float, weight_float])
    assert distances[1] == (4608,) and distances[2] == (math.inf,)
    # converted to another dtype, it still is
    x_half = MappedOp("Cast", (Slot((2304,), BF16),), (Slot((2304,), "FLOAT16"),))
    assert reuse_distances([projection, x_float, x_half])[2] != (math.inf,)
    # and an operator other than a conversion still reads it
    scale = op([((2304,), BF16)], [((2304,), BF16)])
    assert reuse_distances([projection, x_float, scale])[2] != (math.inf,)


def _decode_grouped_gemm(ends: tuple[int, ...] | None) -> MappedOp:
    """A decode step's grouped GEMM: 2 rows over 8 experts' [4096, 28672] weights, the groups'
    cumulative end rows as an input-value capture records them (or none recorded)."""
    inputs = (Slot((2, 4096), BF16), Slot((8, 4096, 28672), BF16), *(Slot(None, "") for _ in range(5)),
              Slot((8,), "INT64"))
    values = (None,) * 7 + (ends,) if ends is not None else ()
    return MappedOp("GroupedMatmul", inputs, (Slot((2, 28672), BF16),), values=values)


@pytest.mark.parametrize(("ends", "experts_read"), [((0, 1, 1, 1, 2, 2, 2, 2), 2), ((1, 2, 2, 2, 2, 2, 2, 2), 2),
                                                     ((0, 0, 0, 0, 0, 0, 0, 2), 1), (None, 8)])
def test_a_grouped_gemm_reads_the_weights_of_the_experts_its_groups_routed_rows_to(
    ends: tuple[int, ...] | None, experts_read: int
) -> None:
    """The residual written before the MoE layer is as far from its next reader as the experts
    the step read: 2 of 8 (117 MB each), not the layer's 940 MB, where the groups are recorded."""
    expert = 4096 * 28672 * 2
    residual = op([], [((1, 1, 4096), BF16)])
    consume = op([((1, 1, 4096), BF16)], [((1, 1, 4096), BF16)])
    distance = reuse_distances([residual, _decode_grouped_gemm(ends), consume])[2][0]
    assert experts_read * expert < distance < experts_read * expert + 2**20
