"""Lookups by kernel family against the roofline: device peaks (``perfdb peaks``), the hull engine,
GEMMs in (M, N, K), attention by batch and lengths, grouped GEMMs by rows and expert load, and the
roofline answer when no rows surround the query."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from perf_plugin.backends.cpu import CpuBackend
from perf_plugin.cli import main as perfdb
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.table import CsvTable
from perf_plugin.lookup import Query, lookup
from perf_plugin.lookup import attention, grouped, hull, roofline
from perf_plugin.lookup.command import make_query
from perf_plugin.lookup.peaks import PEAKS_FILE, DevicePeaks, find_peaks, read_peaks, write_peaks
from perf_plugin.lookup.rows import read_rows

PEAKS = DevicePeaks("TEST_DEVICE", "cuda", {"BF16": 500.0, "FLOAT8_E4M3FN": 1000.0}, 2000.0)


def _database(tmp_path: Path, peaks: DevicePeaks | None = PEAKS) -> Path:
    db = tmp_path / "root" / "TEST_DEVICE" / "stack"
    db.mkdir(parents=True)
    if peaks is not None:
        write_peaks(tmp_path / "root" / "TEST_DEVICE" / PEAKS_FILE, peaks)  # the device's directory serves its stacks
    return db


def _gemm_csv(db: Path, rows: list[tuple[int, int, int, float]]) -> None:
    table = CsvTable.new(["Input Shapes", "Input Data Types", "Input Formats", "Output Shapes", "Output Data Types",
                          "Average Duration(us)"])
    for m, n, k, us in rows:
        table.append_row({"Input Shapes": f'"{m},{k};{n},{k}"', "Input Data Types": "DT_BF16;DT_BF16",
                          "Input Formats": "ND;ND", "Output Shapes": f'"{m},{n}"', "Output Data Types": "DT_BF16",
                          "Average Duration(us)": str(us)})
    table.write(db / "MatMulV2.csv")


def _roofline_us(m: int, n: int, k: int) -> float:
    compute = 2 * m * n * k / (500.0 * 1e6)
    memory = 2 * (m * k + n * k + m * n) / (2000.0 * 1e3)
    return max(compute, memory)


def _gemm(m: int, n: int, k: int) -> Query:
    return make_query({"Kernel Type": "MatMulV2", "Input Shapes": f"{m},{k};{n},{k}",
                       "Input Data Types": "DT_BF16;DT_BF16", "Output Data Types": "DT_BF16"})


def test_peaks_round_trip_and_are_found_above_the_database(tmp_path: Path) -> None:
    db = _database(tmp_path)
    found = find_peaks(db)
    assert found is not None and found.matmul_tflops == {"BF16": 500.0, "FLOAT8_E4M3FN": 1000.0}
    assert found.copy_gbps == 2000.0 and found.compute_us(1e12, "BF16") == pytest.approx(2000.0)
    assert found.compute_us(1e12, "FLOAT") is None  # no peak measured for it
    assert find_peaks(tmp_path / "elsewhere") is None
    assert found.compute_units is None  # a file without multiprocessors (as written before they were)
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    write_peaks(gpu / PEAKS_FILE, DevicePeaks("TEST_DEVICE", "cuda", {"BF16": 500.0}, 2000.0, {"multiprocessors": 132}))
    assert read_peaks(gpu / PEAKS_FILE).compute_units == 132
    assert read_peaks(gpu / PEAKS_FILE).cache_bytes is None  # written before the cache's size was
    (gpu / PEAKS_FILE).write_text("matmul_tflops: {BF16: 1}\ncopy_gbps: 1\nmultiprocessors: true\n")
    assert read_peaks(gpu / PEAKS_FILE).compute_units is None
    bad = tmp_path / PEAKS_FILE
    bad.write_text("matmul_tflops: {BF16: fast}\ncopy_gbps: 1\n")
    with pytest.raises(DatabaseError, match="matmul_tflops"):
        read_peaks(bad)


def test_perfdb_peaks_measures_this_device(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert perfdb(["peaks", "--database-path", str(tmp_path), "--backend", "cpu", "--sizes", "64",
                   "--copy-mib", "4", "--repeats", "2"]) == 0
    peaks = read_peaks(tmp_path / PEAKS_FILE)
    assert peaks.backend == "cpu" and set(peaks.matmul_tflops) == {"BF16", "FLOAT16", "FLOAT"}  # no FP8 on a CPU
    assert all(v > 0 for v in peaks.matmul_tflops.values()) and peaks.copy_gbps > 0
    assert peaks.compute_units is None  # a CPU's cores are no GPU's multiprocessors
    assert peaks.cache_bytes == CpuBackend().cache_bytes()  # its last-level cache, where Linux tells
    assert "GEMM TFLOP/s" in capsys.readouterr().out
    assert perfdb(["peaks", "--database-path", str(tmp_path), "--sizes", "x"]) == 2


def test_the_hull_answers_from_the_fewest_axes_and_says_where_it_measured() -> None:
    points = [hull.Point((1.0, 1.0), 10.0, (2,)), hull.Point((3.0, 1.0), 20.0, (3,)),
              hull.Point((1.0, 3.0), 30.0, (4,)), hull.Point((3.0, 3.0), 60.0, (5,))]
    ident = (lambda x: x,) * 2
    along = hull.estimate(points, (2.0, 1.0), ("a", "b"), ident)
    assert isinstance(along, hull.Estimate) and along.value == 15.0 and along.axes == ("a",)
    assert along.method == "linear in a between 1 and 3" and along.lines == (2, 3)
    inside = hull.estimate(points, (2.0, 2.0), ("a", "b"), ident)
    assert isinstance(inside, hull.Estimate) and inside.axes == ("a", "b") and len(inside.lines) == 3
    # (2, 2) is the midpoint of a diagonal of the square: half of each end of that diagonal
    assert inside.value in (pytest.approx((10.0 + 60.0) / 2), pytest.approx((20.0 + 30.0) / 2))
    assert hull.estimate(points, (2.0, 2.0), ("a", "b"), ident, max_dim=1) == \
        "outside the measured hull: a in [1, 3]; b in [1, 3]"
    assert hull.estimate(points, (4.0, 1.0), ("a", "b"), ident) == "outside the measured hull: a in [1, 3]; b in [1, 3]"
    merged = hull.merge([hull.Point((1.0,), 2.0, (2,)), hull.Point((1.0,), 4.0, (7,))])
    assert merged == [hull.Point((1.0,), 3.0, (2, 7))]


def test_a_gemm_between_rows_keeps_their_efficiency_against_the_roofline(tmp_path: Path) -> None:
    db = _database(tmp_path)
    # efficiencies 0.5 at M=1024 and 0.8 at M=4096 (N = K = 4096)
    _gemm_csv(db, [(1024, 4096, 4096, _roofline_us(1024, 4096, 4096) / 0.5),
                   (4096, 4096, 4096, _roofline_us(4096, 4096, 4096) / 0.8)])
    answer = lookup(db, _gemm(2048, 4096, 4096))
    assert answer.provenance == "interpolated" and answer.rows == (2, 3)
    assert answer.column == "GEMM efficiency against the roofline of device_peaks.yaml, linear in M between 1024 " \
                            "and 4096 (log axes, log efficiency)"
    # halfway in log M, the geometric mean of the two efficiencies
    assert answer.duration_us == pytest.approx(_roofline_us(2048, 4096, 4096) / math.sqrt(0.5 * 0.8))


def test_a_gemm_off_every_line_is_answered_inside_the_three_dimensional_hull(tmp_path: Path) -> None:
    db = _database(tmp_path)
    corners = [(m, n, k) for m in (256, 4096) for n in (1024, 8192) for k in (1024, 8192)]
    _gemm_csv(db, [(m, n, k, _roofline_us(m, n, k) / 0.7) for m, n, k in corners])
    answer = lookup(db, _gemm(1024, 2048, 4096))
    assert answer.provenance == "interpolated" and "barycentric in (M, N, K)" in answer.column
    assert answer.duration_us == pytest.approx(_roofline_us(1024, 2048, 4096) / 0.7)  # constant efficiency
    assert len(answer.rows) == 4


def test_outside_the_hull_the_nearest_efficiency_is_held_and_without_rows_the_roofline_answers(tmp_path: Path) -> None:
    db = _database(tmp_path)
    _gemm_csv(db, [(1024, 4096, 4096, 100.0), (4096, 4096, 4096, 300.0)])
    answer = lookup(db, _gemm(16384, 4096, 4096))
    assert answer.provenance == "fallback" and answer.rows == (3,)
    assert answer.reason == "outside the measured hull: M in [1024, 4096]; N in [4096, 4096]; K in [4096, 4096]"
    held = _roofline_us(4096, 4096, 4096) / 300.0
    assert answer.duration_us == pytest.approx(_roofline_us(16384, 4096, 4096) / held)
    fp8 = make_query({"Kernel Type": "MatMulV2", "Input Shapes": "16384,4096;4096,4096",
                      "Input Data Types": "FLOAT8_E4M3FN;FLOAT8_E4M3FN", "Output Data Types": "DT_BF16"})
    roofline = lookup(db, fp8)  # no FP8 rows at all: the device's peaks alone
    assert roofline.provenance == "roofline" and roofline.rows == ()
    assert roofline.reason == "fewer than two measured rows of these dtypes, layout and formats"
    assert roofline.duration_us == pytest.approx(2 * 16384 * 4096 * 4096 / (1000.0 * 1e6))  # compute-bound at 1000 TFLOP/s
    assert "compute-bound" in roofline.column
    no_peaks = _database(tmp_path / "other", peaks=None)
    _gemm_csv(no_peaks, [(1024, 4096, 4096, 100.0), (4096, 4096, 4096, 300.0)])
    assert lookup(no_peaks, fp8).provenance == "none"


def _grid(db: Path, kernel_type: str, model: str) -> None:
    assert perfdb(["grid", "--database-path", str(db), "--kernel-types", kernel_type, "--target-models", model,
                   "--rows", "100000"]) == 0


def _time_rows(path: Path, efficiency: "object", peaks: DevicePeaks) -> None:
    """Give every row the duration its roofline time over ``efficiency(row)`` makes."""
    table = CsvTable.read(path)
    table.insert_column("Average Duration(us)", len(table.header))
    for row in read_rows(path):
        value = efficiency(row)  # type: ignore[operator]
        if value is not None:
            table.set(row.line - 2, "Average Duration(us)", f"{value:.9g}")
    table.write(path)


def test_attention_is_interpolated_by_batch_and_lengths(tmp_path: Path) -> None:
    db = _database(tmp_path)
    _grid(db, "FusedInferAttentionScore", "llama-3.1-8b")
    path = db / "FusedInferAttentionScore.csv"

    def duration(row: object) -> float | None:
        plan = attention._plan("FusedInferAttentionScore", row.cells)  # type: ignore[attr-defined]
        if plan is None:
            return None
        kv = sum(plan.kv_lens) / plan.batch
        ideal = max(attention._work(plan, "BF16").flops / 500e6, attention._work(plan, "BF16").nbytes / 2000e3)
        return ideal / (0.1 * kv ** 0.3)  # efficiency a power of the KV length: its log linear in log KV length

    _time_rows(path, duration, PEAKS)
    rows = read_rows(path)
    decode = [r for r in rows if r.cells.get("avg_seq_len") == "3000" or False]
    assert not decode  # 3000 is not a grid length: the query below is unmeasured
    # a decode of 8 requests over 3000 tokens of KV each, its block table sized for 4096
    target = next(r for r in rows if r.cells.get("avg_seq_len") == "4096" and r.input_shapes[0] == (8, 32, 1, 128))
    cells = {"Kernel Type": "FusedInferAttentionScore", **target.cells, "avg_seq_len": "3000"}
    answer = lookup(db, make_query(cells))
    assert answer.provenance == "interpolated" and "linear in KV length between 2048 and 4096" in answer.column
    plan = attention._plan("FusedInferAttentionScore", dict(cells))
    assert plan is not None and plan.kv_lens == (3000,) * 8
    work = attention._work(plan, "BF16")
    expected = max(work.flops / 500e6, work.nbytes / 2000e3) / (0.1 * 3000 ** 0.3)
    assert answer.duration_us == pytest.approx(expected)
    # unequal requests nobody measured: the longest at 2.5 times the mean, between the grid's
    # "spread 4" (1.6) and "max_mean 4" rows, whose block table holds it
    skewed = next(r for r in rows if r.cells.get("Input Values Source") == "grid: kv max_mean 4"
                  and r.cells.get("avg_seq_len") == "4096" and r.input_shapes[0] == (8, 32, 1, 128))
    lengths = [10240, 3219, 3219, 3218, 3218, 3218, 3218, 3218]  # 8 x 4096 in all
    cells = {"Kernel Type": "FusedInferAttentionScore", **skewed.cells,
             "Runtime actual_seq_lengths_kv_values": ",".join(map(str, lengths))}
    answer = lookup(db, make_query(cells))
    assert answer.provenance == "interpolated" and "linear in KV spread between 1.6 and 4" in answer.column
    plan = attention._plan("FusedInferAttentionScore", dict(cells))
    assert plan is not None and plan.kv_lens == tuple(lengths)
    work = attention._work(plan, "BF16")
    assert answer.duration_us == pytest.approx(max(work.flops / 500e6, work.nbytes / 2000e3) / (0.1 * 4096 ** 0.3))


# Two rows of a grid measured on an H100 (reproduce/lookup_grid.yaml): a prefill of 4 requests,
# 32768 tokens in all, at even lengths and at the "spread 4" lengths; same shapes, other work.
_PREFILL = {
    "Input Shapes": "32768,32,128;32768,8,128;32768,8,128;;2048,2048;4;4" + ";" * 24,
    "Input Data Types": "DT_BF16;DT_BF16;DT_BF16;DT_UNDEFINED;INT8;INT64;INT64" + ";DT_UNDEFINED" * 24,
    "Input Formats": "ND;ND;ND;NULL;ND;ND;ND" + ";NULL" * 24,
    "Output Shapes": "32768,32,128;", "Output Data Types": "DT_BF16;FLOAT", "avg_seq_len": "8192",
}
_SPREAD = "13107,22937,29491,32768"


def test_a_row_of_other_lengths_never_answers_a_query_for_even_ones_exactly(tmp_path: Path) -> None:
    db = _database(tmp_path)
    columns = [*_PREFILL, "Runtime actual_seq_lengths_values", "Runtime actual_seq_lengths_kv_values",
               "Input Values Source", "Average Duration(us)"]
    table = CsvTable.new(columns)
    table.append_row({**_PREFILL, "Runtime actual_seq_lengths_values": _SPREAD,
                      "Runtime actual_seq_lengths_kv_values": _SPREAD, "Input Values Source": "grid: kv spread 4",
                      "Average Duration(us)": "64522.263"})
    table.append_row({**_PREFILL, "Input Values Source": "grid: kv even", "Average Duration(us)": ""})
    table.write(db / "FusedInferAttentionScore.csv")
    even = make_query({"Kernel Type": "FusedInferAttentionScore", **_PREFILL})
    answer = lookup(db, even)
    assert answer.provenance != "exact" and 2 not in answer.rows  # not the spread row's 64.5 ms
    spread = make_query({"Kernel Type": "FusedInferAttentionScore", **_PREFILL,
                         "Runtime actual_seq_lengths_values": _SPREAD, "Runtime actual_seq_lengths_kv_values": _SPREAD})
    assert lookup(db, spread).provenance == "exact" and lookup(db, spread).rows == (2,)
    table.set(1, "Average Duration(us)", "17458.994")  # the even lengths measured: their own row answers
    table.write(db / "FusedInferAttentionScore.csv")
    assert lookup(db, even).provenance == "exact" and lookup(db, even).rows == (3,)


# Prefills of 8 query heads over 2 KV heads measured on an H100 by the CUDA replay (the grid of
# reproduce/lookup_grid.yaml): (tokens, requests, lengths, cumulative ends or "" for even, us).
_H100_PREFILLS = [
    (256, 2, "even", "", 17.808), (256, 2, "spread 4", "205,256", 32.656), (256, 2, "max_mean 4", "255,256", 34.087),
    (1024, 2, "even", "", 34.418), (1024, 2, "spread 4", "819,1024", 78.864),
    (1024, 2, "max_mean 4", "1023,1024", 100.036), (4096, 2, "even", "", 231.599),
    (4096, 2, "spread 4", "3277,4096", 855.976), (4096, 2, "max_mean 4", "4095,4096", 1141.207),
    (16384, 2, "even", "", 3171.174), (16384, 2, "spread 4", "13107,16384", 10726.921),
    (16384, 2, "max_mean 4", "16383,16384", 16593.635), (1024, 4, "even", "", 26.28),
    (1024, 4, "spread 4", "410,717,922,1024", 48.519), (1024, 4, "max_mean 4", "1021,1022,1023,1024", 188.857),
    (4096, 4, "even", "", 137.811), (4096, 4, "max_mean 4", "4093,4094,4095,4096", 2232.413),
    (16384, 4, "even", "", 1642.318), (16384, 4, "spread 4", "6554,11469,14746,16384", 4386.943),
    (16384, 4, "max_mean 4", "16381,16382,16383,16384", 32498.053),
]


def _prefill_cells(tokens: int, requests: int, ends: str) -> dict[str, str]:
    cells = {"Input Shapes": f"{tokens},8,128;{tokens},2,128;{tokens},2,128;;2048,2048;{requests};{requests}" + ";" * 24,
             "Input Data Types": _PREFILL["Input Data Types"], "Input Formats": _PREFILL["Input Formats"],
             "Output Shapes": f"{tokens},8,128;", "Output Data Types": "DT_BF16;FLOAT",
             "avg_seq_len": str(tokens // requests)}
    if ends:
        cells |= {"Runtime actual_seq_lengths_values": ends, "Runtime actual_seq_lengths_kv_values": ends}
    return cells


def _prefill_database(tmp_path: Path, backend: str) -> Path:
    db = _database(tmp_path)
    table = CsvTable.new([*_prefill_cells(1, 1, "1"), "Input Values Source", "Average Duration(us)",
                          "MicroBench Backend"])
    for tokens, requests, source, ends, us in _H100_PREFILLS:
        table.append_row({**_prefill_cells(tokens, requests, ends), "Input Values Source": f"grid: kv {source}",
                          "Average Duration(us)": str(us), "MicroBench Backend": backend})
    table.write(db / "FusedInferAttentionScore.csv")
    return db


def test_portable_attention_rows_are_read_as_the_replay_computed_them(tmp_path: Path) -> None:
    """The CUDA replay pads uneven requests to the longest and computes the masked pairs too (a
    masked kernel), where even causal requests take one causal kernel: the lookup counts that
    work, and answers a query of uneven lengths from rows of the masked kernel only."""
    ends = "1638,2867,3686,4096"  # held out: 364.66 us measured
    query = make_query({"Kernel Type": "FusedInferAttentionScore", **_prefill_cells(4096, 4, ends)})
    plan = attention._plan("FusedInferAttentionScore", _prefill_cells(4096, 4, ends))
    assert plan is not None and plan.q_lens == (1638, 1229, 819, 410)
    assert plan.portable_kernel == "masked"
    assert attention._padded_pairs(plan) == 4 * 1638 * 1638
    even = attention._plan("FusedInferAttentionScore", _prefill_cells(4096, 4, ""))
    assert even is not None and even.portable_kernel == "causal"
    assert attention._padded_pairs(even) == 4 * (1024 * 1024 - 1024 * 1023 / 2)

    db = _prefill_database(tmp_path, "cuda")
    answer = lookup(db, query)
    assert answer.provenance in ("interpolated", "fallback") and answer.rows
    uneven = {line for line, row in enumerate(_H100_PREFILLS, start=2) if row[3]}
    assert set(answer.rows) <= uneven  # never an even (causal kernel) row
    padded = roofline.scale(attention._work(plan, "BF16", padded=True), PEAKS)
    assert answer.details["ideal"] == pytest.approx(padded)
    assert answer.duration_us is not None and abs(answer.duration_us / 364.66 - 1) < 0.1  # 27 % short counting the fused kernel's work

    # rows a fused kernel measured (an NPU's): its own work, every row of the family a candidate
    fused = lookup(_prefill_database(tmp_path / "npu", "npu"), query)
    assert fused.details["ideal"] == pytest.approx(roofline.scale(attention._work(plan, "BF16"), PEAKS))
    assert fused.details["ideal"] < answer.details["ideal"] / 2


def test_grouped_gemms_are_interpolated_by_rows_and_expert_load(tmp_path: Path) -> None:
    db = _database(tmp_path)
    _grid(db, "GroupedMatmul", "qwen3-235b-a22b")
    path = db / "GroupedMatmul.csv"

    def duration(row: object) -> float | None:
        shapes = row.input_shapes  # type: ignore[attr-defined]
        (m, k), (e, _, n) = shapes[0], shapes[1]
        sizes = grouped.group_sizes(row.cells["Input Values"].strip('"'), e, m)  # type: ignore[attr-defined]
        assert sizes is not None and sum(sizes) == m
        work = grouped._work(sizes, k, n, ("BF16", "BF16"))
        # efficiency a power of the tile excess: its log is linear in the log of that axis
        return max(work.flops / 500e6, work.nbytes / 2000e3) / (0.6 * grouped.tile_excess(sizes) ** -2)

    _time_rows(path, duration, PEAKS)
    rows = read_rows(path)
    measured = next(r for r in rows if r.cells.get("Input Values Source") == "grid: zipf 1" and r.input_shapes[0] == (2048, 4096)
                    and r.input_shapes[1] == (16, 4096, 3072))
    assert grouped.imbalance(measured.cells["Input Values"].strip('"'), 16, 2048) == pytest.approx(
        max(b - a for a, b in zip((0, *_ends(measured)), _ends(measured))) / 128)
    # a load nobody measured: one expert takes 3 times the mean of 2048 rows over 16
    sizes = [384] + [110] * 14 + [2048 - 384 - 14 * 110]
    ends = [sum(sizes[: i + 1]) for i in range(16)]
    query = make_query({"Kernel Type": "GroupedMatmul", "Input Shapes": measured.cells["Input Shapes"],
                        "Input Data Types": measured.cells["Input Data Types"],
                        "Input Values": ";;;;;;;" + ",".join(map(str, ends))})
    answer = lookup(db, query)
    assert answer.provenance == "interpolated" and answer.details["imbalance"] == pytest.approx(3.0)
    # 3 tiles for the busy expert, one for each other: 18 where 2048 rows need 16
    assert grouped.tile_excess(sizes) == pytest.approx(18 / 16)
    work = grouped._work(sizes, 4096, 3072, ("BF16", "BF16"))
    assert work.flops == 2.0 * 18 * 128 * 3072 * 4096  # the padded tiles' operations
    ideal = max(work.flops / 500e6, work.nbytes / 2000e3)
    assert answer.duration_us == pytest.approx(ideal / (0.6 * (18 / 16) ** -2))
    assert "linear in tile excess between 1.062 and 1.188" in answer.column  # two grid loads at 2048 rows


def _ends(row: object) -> list[int]:
    cell = row.cells["Input Values"].strip('"')  # type: ignore[attr-defined]
    return [int(v) for v in cell.split(";")[7].split(",")]
