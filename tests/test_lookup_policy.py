"""Policy mode (``perf_plugin.lookup.policy``): the Ascend performance model's interpolation policy,
read from the real op_mapping.yaml files, over the real Level2 profile's rows and small grids whose
answers are checked by hand."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from perf_plugin.cli import main as perfdb
from perf_plugin.database.table import CsvTable
from perf_plugin.lookup import Query
from perf_plugin.lookup.command import make_query
from perf_plugin.lookup.policy import lookup_by_policy
from tests.conftest import ASCEND

V13 = ASCEND / "op_mapping_vllm0.13.0_torch2.8.0_cann8.3.yaml"  # MatMulV2/V3 1-D; QuantBatchMatmulV3 up to 3-D
V18 = ASCEND / "op_mapping_vllm0.18.0_torch2.9.0_cann8.5.yaml"  # QuantBatchMatmulV3 1-D too; Mul elementwise
HEADER = ("Input Shapes", "Input Data Types", "Input Formats", "Output Shapes", "Output Data Types", "Duration(us)")
FIA = "FusedInferAttentionScore"


@pytest.fixture(scope="module")
def database(level2_database: Path) -> Path:
    return level2_database


def query(kernel_type: str, shapes: str, dtypes: str = "DT_BF16;DT_BF16", outputs: str = "", **cells: str) -> Query:
    return make_query({"Kernel Type": kernel_type, "Input Shapes": shapes, "Input Data Types": dtypes,
                       "Output Shapes": outputs, **cells})


def profiled(db: Path, kernel_type: str, shapes: str) -> tuple[int, float]:
    with (db / f"{kernel_type}.csv").open(newline="") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            if row["Input Shapes"].strip('"') == shapes:
                return line, float(row["Profiling Average Duration(us)"])
    raise AssertionError(shapes)


def write(db: Path, kernel_type: str, rows: list[dict[str, str]], header: tuple[str, ...] = HEADER) -> None:
    db.mkdir(parents=True, exist_ok=True)
    table = CsvTable.new(header)
    for row in rows:
        table.append_row(row)
    table.write(db / f"{kernel_type}.csv")


def gemm_row(m: int, k: int, n: int, duration: float, dtype: str = "DT_BF16", scale: str = "") -> dict[str, str]:
    """x [M,K] and a transposed weight [N,K] (the F.linear form), and an optional scale slot."""
    tail = ";256" if scale else ""
    return {"Input Shapes": f"{m},{k};{n},{k}{tail}", "Input Data Types": f"{dtype};{dtype}{scale and ';' + scale}",
            "Input Formats": "ND;ND" + (";ND" if scale else ""), "Output Shapes": f"{m},{n}",
            "Output Data Types": "DT_BF16", "Duration(us)": str(duration)}


# ------------------------------------------------------------------ exact, then one axis
def test_an_exact_row_answers_first_with_its_column(database: Path) -> None:
    line, average = profiled(database, "MatMulV3", "4096,1024;6144,1024")
    answer = lookup_by_policy(database, query("MatMulV3", "4096,1024;6144,1024"), V18)
    assert (answer.provenance, answer.duration_us, answer.rows) == ("exact", average, (line,))
    assert answer.column == "Profiling Average Duration(us)"


def test_one_axis_linear_in_n_and_in_k_between_the_adjacent_real_rows(database: Path) -> None:
    n_low, low = profiled(database, "MatMulV3", "4096,1024;4096,1024")  # N 4096 (weight [N,K])
    n_high, high = profiled(database, "MatMulV3", "4096,1024;6144,1024")  # N 6144
    answer = lookup_by_policy(database, query("MatMulV3", "4096,1024;5120,1024"), V18)
    assert answer.duration_us == pytest.approx((low + high) / 2)  # the latency, not an efficiency
    assert answer.rows == (n_low, n_high)
    assert answer.column == "policy max_interpolation_dim 1: linear in N between 4096 and 6144"
    assert (answer.details["N"], answer.details["N_low"], answer.details["N_high"]) == (5120, 4096, 6144)
    assert answer.reason == f"policy from {V18.name}: aten.mm.default"
    k_low, low = profiled(database, "MatMulV3", "4096,3072;1024,3072")
    k_high, high = profiled(database, "MatMulV3", "4096,6144;6144,1024")  # a [K,N] weight: layouts pool
    answer = lookup_by_policy(database, query("MatMulV3", "4096,4096;1024,4096"), V18)
    assert answer.duration_us == pytest.approx(low + (4096 - 3072) / (6144 - 3072) * (high - low))
    assert answer.rows == (k_low, k_high) and "linear in K between 3072 and 6144" in answer.column


def test_one_axis_linear_in_m(tmp_path: Path) -> None:
    write(tmp_path, "MatMulV2", [gemm_row(128, 64, 256, 10.0), gemm_row(256, 64, 256, 30.0)])
    answer = lookup_by_policy(tmp_path, query("MatMulV2", "160,64;256,64"), V18)
    assert answer.duration_us == pytest.approx(10.0 + 0.25 * 20.0)
    assert answer.column == "policy max_interpolation_dim 1: linear in M between 128 and 256"


def test_outside_the_measured_line_there_is_no_answer(database: Path) -> None:
    answer = lookup_by_policy(database, query("MatMulV3", "4096,1024;16384,1024"), V18)
    assert answer.provenance == "none" and answer.duration_us is None
    assert answer.reason.startswith("outside the measured hull: N in [2048, 6144] with M = 4096, K = 1024")


# ------------------------------------------------------------------ two and three axes
@pytest.fixture
def quant_grid(tmp_path: Path) -> Path:
    """QuantBatchMatmulV3 rows at the corners of a triangle (N 256) and a tetrahedron (one more at N 512);
    the mappings keep its first two inputs (tc_input_count: 2), so the scale slot's dtype is no regime."""
    write(tmp_path, "QuantBatchMatmulV3", [
        gemm_row(128, 64, 256, 10.0, "INT8", "FLOAT"), gemm_row(256, 64, 256, 20.0, "INT8", "FLOAT"),
        gemm_row(128, 128, 256, 30.0, "INT8", "FLOAT"), gemm_row(128, 64, 512, 50.0, "INT8", "FLOAT"),
    ])
    return tmp_path


def test_two_axes_griddata_inside_the_triangle(quant_grid: Path) -> None:
    # (160, 80) is a quarter along M and along K: 10 + 0.25 * 10 + 0.25 * 20
    answer = lookup_by_policy(quant_grid, query("QuantBatchMatmulV3", "160,80;256,80;256", "INT8;INT8;BF16"), V13)
    assert answer.provenance == "interpolated" and answer.duration_us == pytest.approx(17.5)
    assert answer.column == "policy griddata linear in (M, K)" and answer.rows == (2, 3, 4)
    assert answer.details["interpolation_dim"] == 2 and (answer.details["K_low"], answer.details["K_high"]) == (64, 128)


def test_max_interpolation_dim_1_refuses_a_query_only_two_axes_reach(quant_grid: Path) -> None:
    answer = lookup_by_policy(quant_grid, query("QuantBatchMatmulV3", "160,80;256,80;256", "INT8;INT8;FLOAT"), V18)
    assert answer.provenance == "none"
    assert answer.reason.startswith("policy max_interpolation_dim 1 allows interpolation along at most 1 axis")
    assert "(M, K)" in answer.reason and V18.name in answer.reason


def test_three_axes_griddata_inside_the_tetrahedron(quant_grid: Path) -> None:
    # a quarter along each axis: 10 + 0.25 * 10 + 0.25 * 20 + 0.25 * 40
    answer = lookup_by_policy(quant_grid, query("QuantBatchMatmulV3", "160,80;320,80;256", "INT8;INT8;FLOAT"), V13)
    assert answer.duration_us == pytest.approx(27.5)
    assert answer.column == "policy griddata linear in (M, K, N)" and answer.rows == (2, 3, 4, 5)


@pytest.mark.parametrize("shapes", ["100,80;320,80;256", "240,120;480,120;256"])
def test_outside_the_hull_there_is_no_answer(quant_grid: Path, shapes: str) -> None:
    """Below the measured M; then inside every axis's range but beyond the tetrahedron's face."""
    answer = lookup_by_policy(quant_grid, query("QuantBatchMatmulV3", shapes, "INT8;INT8;FLOAT"), V13)
    assert answer.duration_us is None
    assert answer.reason.startswith("outside the measured hull: M in [128, 256], K in [64, 128], N in [256, 512]")


def test_rows_at_one_coordinate_merge_to_their_median_and_columns_do_not_mix(tmp_path: Path) -> None:
    header = (*HEADER[:5], "Average Duration(us)", "Profiling Average Duration(us)")
    rows = [gemm_row(128, 64, 256, 10.0), *[gemm_row(256, 64, 256, d) for d in (20.0, 20.0, 50.0)],
            gemm_row(512, 64, 256, 0.0)]
    for row in rows:
        row["Average Duration(us)"] = row.pop("Duration(us)")
    rows[-1].update({"Average Duration(us)": "", "Profiling Average Duration(us)": "15"})  # a fallback column
    write(tmp_path, "MatMulV2", rows, header)
    answer = lookup_by_policy(tmp_path, query("MatMulV2", "192,64;256,64"), V18)
    assert answer.duration_us == pytest.approx(15.0) and answer.rows == (2, 3, 4, 5)  # median 20, not mean 30
    beyond = lookup_by_policy(tmp_path, query("MatMulV2", "384,64;256,64"), V18)
    assert beyond.reason.startswith("outside the measured hull: M in [128, 256]")  # row 6 is not on the line


# ------------------------------------------------------------------ generic compute and the defaults
def test_generic_compute_output_numel_in_the_regime_of_the_output_tail(tmp_path: Path) -> None:
    def concat(rows: int, cols: int, duration: float) -> dict[str, str]:
        return {"Input Shapes": f"{rows},{cols};{rows},{cols}", "Input Data Types": "DT_BF16;DT_BF16",
                "Input Formats": "ND;ND", "Output Shapes": f"{2 * rows},{cols}", "Output Data Types": "DT_BF16",
                "Duration(us)": str(duration)}

    # 9600 output elements as [200, 48]: the query's numel, but another tail (48, not 64)
    write(tmp_path, "ConcatD", [concat(50, 64, 10.0), concat(100, 64, 20.0), concat(100, 48, 99.0)])
    answer = lookup_by_policy(tmp_path, query("ConcatD", "75,64;75,64", outputs="150,64"), V18)
    assert answer.duration_us == pytest.approx(15.0) and answer.rows == (2, 3)
    assert answer.column == "policy generic_compute output_numel: linear in output_numel between 6400 and 12800"
    blind = lookup_by_policy(tmp_path, query("ConcatD", "75,64;75,64"), V18)
    assert blind.duration_us is None and "output_numel reads the one output shape; none is given" in blind.reason


def test_a_kernel_without_an_override_takes_its_category_default(database: Path) -> None:
    low_line, low = profiled(database, "Mul", "4194304;")
    high_line, high = profiled(database, "Mul", "6291456;")
    mul = query("Mul", '"5242880;"', "FLOAT;FLOAT")
    generic = lookup_by_policy(database, mul, V13)  # aten.mul.Tensor: ordinary compute, axis_0
    assert generic.duration_us == pytest.approx((low + high) / 2) and set(generic.rows) == {low_line, high_line}
    assert generic.column == "policy linear in axis_0 between 4194304 and 6291456"
    elementwise = lookup_by_policy(database, query("Mul", '"5242880;"', "FLOAT;FLOAT", "5242880"), V18)
    assert elementwise.duration_us == pytest.approx((low + high) / 2)  # query_mode elementwise: io_numel
    assert elementwise.column == "policy query_mode elementwise: linear in io_numel between 8388608 and 12582912"
    assert "reads the output shape; none is given" in str(lookup_by_policy(database, mul, V18).reason)
    cos = lookup_by_policy(database, query("Cos", "1536", "FLOAT"), V18)
    assert cos.reason == f"the policy declares no interpolation for Cos: no operator mapping of {V18.name} names " \
                         "it and kernel_overrides does not"


def test_without_an_op_mapping_the_built_in_defaults_answer_and_say_so(quant_grid: Path) -> None:
    answer = lookup_by_policy(quant_grid, query("QuantBatchMatmulV3", "160,80;256,80;256", "INT8;INT8;FLOAT"))
    assert answer.duration_us == pytest.approx(17.5) and answer.column == "policy griddata linear in (M, K)"
    assert answer.reason == f"policy from built-in defaults (no op_mapping.yaml in {quant_grid})"
    # no tc_input_count without the mappings: the scale slot's dtype is part of the regime
    other = lookup_by_policy(quant_grid, query("QuantBatchMatmulV3", "160,80;256,80;256", "INT8;INT8;BF16"))
    assert other.duration_us is None
    assert other.reason.startswith("no timed row of QuantBatchMatmulV3.csv shares the query's regime (3 inputs")


# ------------------------------------------------------------------ attention
def fia_cells(seq: int, heads: int = 8, duration: str = "") -> dict[str, str]:
    """A packed (TND) decode call of 4 requests, contiguous KV of ``seq`` tokens each (2 KV heads), no mask."""
    return {"Input Shapes": f"4,{heads},128;{4 * seq},2,128;{4 * seq},2,128;;;4;4",
            "Input Data Types": "DT_BF16;DT_BF16;DT_BF16;DT_UNDEFINED;DT_UNDEFINED;INT64;INT64",
            "Input Formats": "ND;ND;ND;NULL;NULL;ND;ND", "Output Shapes": f"4,{heads},128",
            "Output Data Types": "DT_BF16", "Duration(us)": duration}


def fia_query(seq: int, heads: int = 8) -> Query:
    cells = fia_cells(seq, heads)
    del cells["Duration(us)"]
    return make_query({"Kernel Type": FIA, **cells})


def test_sqrt_seq_interpolates_attention_in_the_square_root_of_the_kv_length(tmp_path: Path) -> None:
    write(tmp_path, FIA, [fia_cells(1024, duration="10"), fia_cells(4096, duration="40")])
    # sqrt: 32 -> 10, 64 -> 40; sqrt(2304) = 48 is halfway: 25 (linear in seq would give 22.5)
    answer = lookup_by_policy(tmp_path, fia_query(2304), V18)
    assert answer.duration_us == pytest.approx(25.0) and answer.rows == (2, 3)
    assert answer.column == "policy axis_transform sqrt_seq: linear in sqrt(seq) between 1024 and 4096"
    assert (answer.details["seq"], answer.details["seq_low"], answer.details["seq_high"]) == (2304, 1024, 4096)
    raw = lookup_by_policy(tmp_path, fia_query(2304))  # the built-in default: raw seq
    assert raw.duration_us == pytest.approx(22.5) and raw.column == "policy linear in seq between 1024 and 4096"
    assert raw.reason == f"policy from built-in defaults (no op_mapping.yaml in {tmp_path})"


def test_attention_two_axes_seq_and_heads(tmp_path: Path) -> None:
    write(tmp_path, FIA, [fia_cells(1024, 8, "10"), fia_cells(4096, 8, "40"), fia_cells(1024, 16, "30")])
    # sqrt(seq) halfway (48 of 32..64) and heads a quarter (10 of 8..16): 10 + 0.5 * 30 + 0.25 * 20
    answer = lookup_by_policy(tmp_path, fia_query(2304, 10), V13)
    assert answer.duration_us == pytest.approx(30.0)
    assert answer.column == "policy axis_transform sqrt_seq: griddata linear in (sqrt(seq), heads)"


def test_a_paged_call_without_its_kv_lengths_gets_no_attention_answer(tmp_path: Path) -> None:
    """The real FIA row's paged decode call, 144 requests instead of 128 and no avg_seq_len: its
    shapes give the cache's capacity, not the KV length the policy interpolates along."""
    shutil.copy(ASCEND / "db_row_FusedInferAttentionScore.csv", tmp_path / f"{FIA}.csv")
    with (tmp_path / f"{FIA}.csv").open(newline="") as handle:
        row = next(csv.DictReader(handle))
    shapes = row["Input Shapes"].strip('"').replace("128,4,128", "144,4,128").replace(";128;128;", ";144;144;")
    shapes = shapes.replace("128,512", "144,512")
    call = query(FIA, shapes, row["Input Data Types"], "144,4,128;", **{"Output Data Types": row["Output Data Types"]})
    answer = lookup_by_policy(tmp_path, call, V18)
    assert answer.duration_us is None
    assert answer.reason.startswith("the query: a paged call's KV length (seq) is not in its shapes")
    given = lookup_by_policy(tmp_path, query(FIA, shapes, row["Input Data Types"], "144,4,128;", avg_seq_len="4096",
                                             **{"Output Data Types": row["Output Data Types"]}), V18)
    assert "not in its shapes" not in given.reason  # read now; no rows around it (batch 144 was never measured)
