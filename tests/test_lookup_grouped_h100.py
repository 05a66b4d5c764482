"""Grouped GEMM lookups on rows the CUDA replay measured on an H100 (``torch._grouped_mm``): one
family of Qwen3-235B-A22B's expert GEMMs (8 experts, ``[M,4096] x [8,4096,3072]``) over six
expert loads and 20 counts of rows per expert, with the device's peaks (source:
``tests/fixtures/cuda/SOURCES.md``)."""

from __future__ import annotations

import math
import shutil
import statistics
from pathlib import Path

import pytest

from perf_plugin.database.table import CsvTable
from perf_plugin.lookup import grouped, lookup
from perf_plugin.lookup.command import make_query
from perf_plugin.lookup.peaks import PEAKS_FILE, read_peaks
from perf_plugin.lookup.rows import MeasuredRow, read_rows
from tests.held_out import write_without

FIXTURE = Path(__file__).parent / "fixtures" / "cuda" / "h100_grouped_gemm"


def _shape(row: MeasuredRow) -> tuple[int, int, int]:
    (m, _), (e, _, n) = row.input_shapes[0], row.input_shapes[1]  # type: ignore[misc]
    return m, e, n


def _query(row: MeasuredRow):  # type: ignore[no-untyped-def]
    return make_query({"Kernel Type": "GroupedMatmul", "Input Shapes": row.cells["Input Shapes"],
                       "Input Data Types": row.cells["Input Data Types"],
                       "Input Values": row.cells["Input Values"].strip('"')})


def test_the_tiling_rule_names_the_kernel_each_row_ran() -> None:
    """The rows name the kernel ran (CUTLASS grouped GEMM kernels): 64 x 128 ping-pong up to 128 rows
    per expert, 128 x 256 cooperative above, as ``cutlass_tiling`` says."""
    rows = read_rows(FIXTURE / "GroupedMatmul.csv")
    assert len(rows) == 119
    for row in rows:
        tiling = grouped.cutlass_tiling(*_shape(row))
        kernel = row.cells["MicroBench Kernels"]
        assert ("Pingpong" in kernel) == (tiling.m == 64) and ("Cooperative" in kernel) == (tiling.m == 128), row.line


def test_the_waves_of_a_balanced_split() -> None:
    # 8192 rows over 8 experts: 8 tiles of 128 rows each, 4 clusters of two, 12 tiles of 256 along N
    sizes = [1024] * 8
    tiling = grouped.cutlass_tiling(8192, 8, 3072)
    work = grouped._work(sizes, 4096, 3072, ("BF16", "BF16"), tiling, units=132)
    waves = math.ceil(8 * 4 * 12 / 66)
    assert waves == 6
    assert work.flops == 2.0 * waves * 132 * 128 * 256 * 4096
    # each expert's weight once; the output of six whole waves of 128 x 256 tiles
    assert work.nbytes == 2 * (8192 * 4096 + 8 * 4096 * 3072 + waves * 132 * 128 * 256)
    # one expert takes every row: one expert's weight, the same tiles
    alone = grouped._work([8192] + [0] * 7, 4096, 3072, ("BF16", "BF16"), tiling, units=132)
    assert alone.nbytes == 2 * (8192 * 4096 + 4096 * 3072 + waves * 132 * 128 * 256)
    # without the device's multiprocessors, each tile streams its expert's weight
    streamed = grouped._work(sizes, 4096, 3072, ("BF16", "BF16"), tiling)
    assert streamed.nbytes == 2 * (8192 * 4096 + 64 * 4096 * 3072 + 8192 * 3072)
    # 100 rows per expert: each tile of 128 rows writes its output whole
    partial = grouped._work([100] * 8, 4096, 3072, ("BF16", "BF16"), tiling)
    assert partial.nbytes == 2 * (800 * 4096 + 8 * 4096 * 3072 + 8 * 128 * 3072)


def test_held_out_rows_are_answered_from_rows_of_their_own_kernel(tmp_path: Path) -> None:
    """Every fourth row held out in turn and asked of the rest: the answer is made of rows that ran
    the same kernel.  This family is among the grid's hardest (its skewed loads put a busy expert
    past the kernel switch): 3.3 % median error here, largest 16.5 %, against 1.5 % over the grid."""
    peaks = read_peaks(FIXTURE / PEAKS_FILE)
    assert peaks.compute_units == 132  # the H100's multiprocessors, recorded by perfdb peaks
    table = CsvTable.read(FIXTURE / "GroupedMatmul.csv")
    rows = read_rows(FIXTURE / "GroupedMatmul.csv")
    by_line = {row.line: row for row in rows}
    errors = []
    for held in rows[::4]:
        db = tmp_path / f"line{held.line}"
        db.mkdir()
        shutil.copy(FIXTURE / PEAKS_FILE, db / PEAKS_FILE)
        rest = CsvTable.new(list(table.header))
        for index in range(len(table)):
            if index + 2 != held.line:
                rest.append_row(table.row_dict(index))
        rest.write(db / "GroupedMatmul.csv")
        answer = lookup(db, _query(held))
        assert answer.provenance in ("interpolated", "fallback"), answer.reason
        # the copy's line numbers, as the fixture numbers them
        originals = [line if line < held.line else line + 1 for line in answer.rows]
        kernel = grouped.cutlass_tiling(*_shape(held))
        assert originals and all(grouped.cutlass_tiling(*_shape(by_line[line])) == kernel for line in originals)
        assert answer.duration_us is not None and held.duration_us is not None
        errors.append(abs(answer.duration_us / held.duration_us - 1))
    assert statistics.median(errors) < 0.05, sorted(errors)
    assert max(errors) < 0.2, sorted(errors)


def test_a_split_nobody_measured_costs_between_the_loads_around_it() -> None:
    """4096 rows with one expert taking three times the mean: no row has that split; the answer is
    interpolated in the load spread between the grid's loads at 4096 rows, and costs more than
    the even split (the busy expert's extra tiles make a fourth wave)."""
    rows = [r for r in read_rows(FIXTURE / "GroupedMatmul.csv") if _shape(r)[0] == 4096]
    balanced = next(r for r in rows if r.cells["Input Values Source"] == "grid: balanced")
    sizes = [1536] + [366] * 6 + [4096 - 1536 - 6 * 366]
    ends = ",".join(str(sum(sizes[: i + 1])) for i in range(8))
    query = make_query({"Kernel Type": "GroupedMatmul", "Input Shapes": balanced.cells["Input Shapes"],
                        "Input Data Types": balanced.cells["Input Data Types"], "Input Values": ";;;;;;;" + ends})
    answer = lookup(FIXTURE, query)
    assert answer.provenance == "interpolated", answer.reason
    assert answer.details["imbalance"] == pytest.approx(3.0)
    assert balanced.duration_us is not None and answer.duration_us is not None
    assert answer.duration_us > 1.15 * balanced.duration_us
    assert "load spread" in answer.column and "run by the 128 x 256 tile's kernel" in answer.column


def test_perfdb_lookup_takes_the_split_on_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    from perf_plugin.cli import main as perfdb

    row = next(r for r in read_rows(FIXTURE / "GroupedMatmul.csv")
               if _shape(r)[0] == 2048 and r.cells["Input Values Source"] == "grid: zipf 1")
    args = ["lookup", "--database-path", str(FIXTURE), "--kernel-type", "GroupedMatmul",
            "--input-shapes", row.cells["Input Shapes"], "--input-dtypes", row.cells["Input Data Types"]]
    assert perfdb([*args, "--input-values", row.cells["Input Values"].strip('"')]) == 0
    assert f"{row.duration_us:.3f} us (exact: row {row.line};" in capsys.readouterr().out  # that split's own row
    balanced = next(r for r in read_rows(FIXTURE / "GroupedMatmul.csv")
                    if _shape(r)[0] == 2048 and r.cells["Input Values Source"] == "grid: balanced")
    assert perfdb(args) == 0  # no split given: the even one the replay draws, the balanced row's
    assert f"{balanced.duration_us:.3f} us (exact: row {balanced.line};" in capsys.readouterr().out


def test_without_the_multiprocessors_the_tiles_stream_their_weights(tmp_path: Path) -> None:
    """A peaks file written before ``perfdb peaks`` recorded the multiprocessors: no waves, each
    tile streams its expert's weight and the split is read by its tile excess; still only the
    rows of the query's own kernel."""
    shutil.copy(FIXTURE / "GroupedMatmul.csv", tmp_path / "GroupedMatmul.csv")
    text = (FIXTURE / PEAKS_FILE).read_text()
    (tmp_path / PEAKS_FILE).write_text("".join(line for line in text.splitlines(keepends=True)
                                               if not line.startswith("multiprocessors:")))
    assert read_peaks(tmp_path / PEAKS_FILE).compute_units is None
    rows = read_rows(FIXTURE / "GroupedMatmul.csv")
    held = next(r for r in rows if _shape(r)[0] == 3072 and r.cells["Input Values Source"] == "grid: zipf 1")
    sizes = list(grouped.group_sizes(held.cells["Input Values"].strip('"'), 8, 3072) or ())
    sizes[0], sizes[-1] = sizes[0] - 1, sizes[-1] + 1  # a split no row has
    ends = ",".join(str(sum(sizes[: i + 1])) for i in range(8))
    query = make_query({"Kernel Type": "GroupedMatmul", "Input Shapes": held.cells["Input Shapes"],
                        "Input Data Types": held.cells["Input Data Types"], "Input Values": ";;;;;;;" + ends})
    answer = lookup(tmp_path, query)
    assert answer.provenance == "interpolated", answer.reason
    assert "tile excess" in answer.column and "run by the 128 x 256 tile's kernel" in answer.column
    by_line = {r.line: r for r in rows}
    assert all(grouped.cutlass_tiling(*_shape(by_line[line])).m == 128 for line in answer.rows)


NARROW = Path(__file__).parent / "fixtures" / "cuda" / "h100_grouped_narrow"


def test_a_wave_half_empty_writes_as_long_as_a_full_one(tmp_path: Path) -> None:
    """128 experts of K = 96 and N = 4096 (a narrow expert's down projection), where the output's
    writes bound the kernel: 384 rows per expert take three 128-row tiles, the second cluster of
    two half empty, and run as long as 512 rows (254 against 268 us balanced).  All six loads at
    49152 rows held out, asked of the 32768- and 65536-row rows: within 5 %; answered from the
    exact output bytes, the even splits were 17 % short."""
    rows = read_rows(NARROW / "GroupedMatmul.csv")
    assert len(rows) == 120 and {_shape(row)[1:] for row in rows} == {(128, 4096)}
    held = [row for row in rows if _shape(row)[0] == 49152]
    assert len(held) == 6
    lines = {row.line for row in held}
    write_without(NARROW / "GroupedMatmul.csv", tmp_path, lambda line, _: line in lines)
    shutil.copy(NARROW / PEAKS_FILE, tmp_path / PEAKS_FILE)
    for row in held:
        answer = lookup(tmp_path, _query(row))
        assert answer.provenance == "interpolated", answer.reason
        assert answer.duration_us is not None and row.duration_us is not None
        assert abs(answer.duration_us / row.duration_us - 1) < 0.05, (row.cells["Input Values Source"], answer.line())
