"""``perfdb grid`` rows of ``aten._scaled_mm`` (FP8 GEMMs through ``torch._scaled_mm``).

The rows must be exactly what trace ingest writes for the call of an FP8 linear layer (checked
against a real CPU trace ingested here), take N and K from the model projections MatMulV2 rows
take (and the generic grid), replay and verify through ``pytest bench`` on the CPU, and stay
within ``--max-hbm-gb`` counting one byte per float8 element.
"""

from __future__ import annotations

import csv
import itertools
import random
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from perf_plugin.cli import main as perfdb
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.schema import IDENTITY_COLUMNS, INPUT_STRIDES, OP_ARGUMENTS, ROW_ORIGIN
from perf_plugin.database.table import CsvTable
from perf_plugin.grid.config import load_config
from perf_plugin.grid.memory import budget_bytes
from perf_plugin.grid.models import MODELS, find_model
from perf_plugin.grid.runner import GridRequest, KernelReport, plan_rows, run_grid
from perf_plugin.ingest.pipeline import ingest_path
from tests.kernels.support import replay_on_cpu
from tests.test_grid_config import write_config
from tests.test_plugin import BENCH_TEST, _profiler_modules_loaded  # noqa: F401

KERNEL_TYPE = "aten._scaled_mm"
ARGUMENTS = '{"overload":"default","args":[{"tensor":0},{"tensor":1},{"tensor":2},{"tensor":3},null,null,15,false]}'
TOKENS = set(load_config().grids["tokens"])


def read_dicts(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def dims(cell: str) -> list[list[int]]:
    return [[int(d) for d in slot.split(",")] if slot else [] for slot in cell.strip('"').split(";")]


def mnk(kernel_type: str, row: dict[str, str]) -> tuple[int, int, int]:
    """(M, N, K) of a generated row: MatMulV2 as ``M,K;N,K``, _scaled_mm as ``M,K;K,N;;``."""
    a, b = dims(row["Input Shapes"])[:2]
    return (a[0], b[0], a[1]) if kernel_type == "MatMulV2" else (a[0], b[1], a[1])


def plan(kernel_type: str, models: tuple[str, ...], budget: int, table: CsvTable | None = None,
         ) -> tuple[list[dict[str, str]], KernelReport]:
    """The rows ``perfdb grid`` would append (no --rows limit); no models: the generic grid only."""
    restricted = bool(models)
    request = GridRequest(
        directory=Path("unused"),
        config=load_config(),
        models=tuple(find_model(m) for m in models),
        restricted=restricted,
        rows=0,
        seed=0,
        budget=budget,
    )
    report = KernelReport(kernel_type, Path("unused"), created=True)
    route = request.config.kernels[kernel_type]
    if table is None:
        table = CsvTable.new(list(IDENTITY_COLUMNS) + list(route.written_columns) + [ROW_ORIGIN])
    return plan_rows(kernel_type, route, table, request, report), report


def test_a_row_has_exactly_the_cells_of_an_fp8_linear_layer() -> None:
    rows, _ = plan(KERNEL_TYPE, ("qwen3-32b",), budget_bytes(32))
    # qwen3-32b's merged QKV projection at TP 1: N = (64 + 2 * 8) * 128, K = hidden = 5120
    (row,) = [r for r in rows if r["Input Shapes"] == "4,5120;5120,10240;;"]
    assert row == {
        "OP State": "dynamic",
        "Accelerator Core": "CUDA",
        "Input Shapes": "4,5120;5120,10240;;",
        "Input Data Types": "FLOAT8_E4M3FN;FLOAT8_E4M3FN;FLOAT;FLOAT",
        "Input Formats": "ND;ND;ND;ND",
        "Output Shapes": "4,10240",
        "Output Data Types": "DT_BF16",
        "Output Formats": "ND",
        INPUT_STRIDES: "5120,1;1,5120;;",  # the weight [N,K] read transposed: column-major [K,N]
        OP_ARGUMENTS: ARGUMENTS,
        ROW_ORIGIN: "grid:gemm:qwen3-32b",
    }


@pytest.mark.parametrize("models", [("qwen3-32b", "deepseek-v3", "qwen3-235b-a22b"), ()])
def test_shapes_are_the_matmul_rows_fp8_gemms_can_run(models: tuple[str, ...]) -> None:
    """The model projections' (N, K) (no models: the generic grid) with M over the token grid,
    as MatMulV2 has them, less the pairs cuBLASLt runs no FP8 GEMM for (K or N not a multiple of 16)."""
    scaled, _ = plan(KERNEL_TYPE, models, budget_bytes(32))
    matmul, _ = plan("MatMulV2", models, budget_bytes(32))
    fp8 = {mnk(KERNEL_TYPE, r) for r in scaled}
    bf16 = {mnk("MatMulV2", r) for r in matmul}
    assert len(fp8) == len(scaled)
    assert fp8 == {(m, n, k) for m, n, k in bf16 if n % 16 == 0 and k % 16 == 0}
    assert {m for m, _, _ in fp8} == TOKENS
    if not models:
        grids = load_config().grids
        assert {(n, k) for _, n, k in fp8} == set(itertools.product(grids["gemm_n"], grids["gemm_k"]))
        assert {r[ROW_ORIGIN] for r in scaled} == {"grid:gemm:generic"}
    for row in scaled:
        (m, n, k) = mnk(KERNEL_TYPE, row)
        assert row["Input Shapes"] == f"{m},{k};{k},{n};;" and row["Output Shapes"] == f"{m},{n}"
        assert row[INPUT_STRIDES] == f"{k},1;1,{k};;" and row[OP_ARGUMENTS] == ARGUMENTS


def _ingested_fp8_linear(root: Path, m: int, k: int, n: int) -> Path:
    """A database ingested from a real (CPU) trace of one FP8 linear layer ``x[m,k] @ w[n,k].t()``."""
    x = torch.rand(m, k).to(torch.float8_e4m3fn)
    weight = torch.rand(n, k).to(torch.float8_e4m3fn)
    scale_a, scale_b = torch.tensor(0.5), torch.tensor(0.25)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        torch._scaled_mm(x, weight.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
    prof.export_chrome_trace(str(root / "trace.json"))
    ingest_path(root / "trace.json", root / "db")
    return root / "db"


def test_ingested_rows_and_generated_rows_are_one_form(tmp_path: Path) -> None:
    """The row ingest writes for a shape of the grid is recognised as that shape (its signature,
    Input Strides and Op Arguments included); the rows appended beside it take its form."""
    database = _ingested_fp8_linear(tmp_path, 4, 256, 128)  # m in tokens, k in gemm_k, n in gemm_n
    path = database / f"{KERNEL_TYPE}.csv"
    (ingested,) = read_dicts(path)
    request = GridRequest(directory=database, config=load_config(), models=(), restricted=False, rows=0,
                          seed=0, budget=budget_bytes(0.001), kernel_types=(KERNEL_TYPE,))
    (report,) = run_grid(request)
    assert report.in_file == 1 and report.written > 100 and not report.default_structure_patterns
    rows = read_dicts(path)
    assert {c: v for c, v in rows[0].items() if c != ROW_ORIGIN} == ingested  # unchanged, Row Origin added
    assert rows[0][INPUT_STRIDES] == ingested[INPUT_STRIDES] == '"256,1;1,256;;"'
    for row in rows[1:]:
        m, n, k = mnk(KERNEL_TYPE, row)
        assert row["Input Shapes"] == f'"{m},{k};{k},{n};;"' and row["Output Shapes"] == f'"{m},{n}"'
        assert row[INPUT_STRIDES] == f'"{k},1;1,{k};;"'
        same = ("OP State", "Accelerator Core", "Input Data Types", "Input Formats", "Output Data Types",
                "Output Formats", OP_ARGUMENTS)
        assert {c: row[c] for c in same} == {c: ingested[c] for c in same}
        assert (m, n, k) != (4, 128, 256)


@pytest.mark.parametrize("seed", [0, 1])
def test_no_row_over_the_budget_gets_through(seed: int) -> None:
    """One byte per float8 element, two per bfloat16 output, nothing for the 0-d scales; a row
    of MatMulV2 kept at a budget is kept as an FP8 GEMM too (its operands take half the bytes)."""
    budget = random.Random(f"scaled-mm-{seed}").randrange(1 << 22, 1 << 31)
    models = tuple(m.name for m in MODELS[:4])
    rows, report = plan(KERNEL_TYPE, models, budget)
    sizes = [m * k + k * n + 2 * m * n for m, n, k in (mnk(KERNEL_TYPE, r) for r in rows)]
    assert rows and max(sizes) <= budget and max(sizes) * 16 > budget
    assert report.over_budget > 0
    candidates = report.evaluated - report.filtered
    assert candidates - report.skipped == report.over_budget + report.repeated + report.in_file + report.available
    kept = {mnk(KERNEL_TYPE, r) for r in rows}
    matmul, _ = plan("MatMulV2", models, budget)
    assert {(m, n, k) for m, n, k in map(lambda r: mnk("MatMulV2", r), matmul) if n % 16 == 0 and k % 16 == 0} <= kept


def test_a_generated_row_replays_and_verifies_on_the_cpu() -> None:
    rows, _ = plan(KERNEL_TYPE, (), budget_bytes(32))
    (row,) = [r for r in rows if r["Input Shapes"] == "16,256;256,128;;"]
    outputs, reference = replay_on_cpu(KERNEL_TYPE, row)
    assert tuple(outputs.shape) == (16, 128) and outputs.dtype == torch.bfloat16
    assert reference.dtype == torch.float64 and reference.device.type == "cpu"


def test_generated_rows_replay_through_pytest_bench(pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str]) -> None:
    db = pytester.path / "db"
    code = perfdb(["grid", "--data-dir", str(db), "--rows", "3", "--seed", "2", "--max-hbm-gb", "0.0002",
                   "--kernel-types", KERNEL_TYPE])
    assert code == 0
    capsys.readouterr()
    generated = read_dicts(db / f"{KERNEL_TYPE}.csv")
    assert len(generated) == 3
    pytester.makepyfile(test_kernels=BENCH_TEST)
    result = pytester.runpytest("--database-path", str(db), "--repeat-count", "2", "--warmup-count", "1",
                                "-p", "no:cacheprovider", "--replay-coverage-min", "1.0")
    result.assert_outcomes(passed=3)
    for row in read_dicts(db / f"{KERNEL_TYPE}.csv"):
        assert float(row["Average Duration(us)"]) > 0, row["Input Shapes"]


CONFIG = """
grids:
  tokens: [1, 8]
  gn: [32]
  gk: [64]
kernels:
  aten._scaled_mm:
    generator: gemm
    options: {kind: linear, generic_n: gn, generic_k: gk}
    patterns:
      - name: fp8
        over: {m: tokens}
        dtype: FLOAT8_E4M3FN
        inputs: [[m, k], [k, n], {dtype: FLOAT}, {dtype: FLOAT}]
        outputs: [{shape: [m, n], dtype: BF16}]
        DETAIL
"""


@pytest.mark.parametrize(
    ("detail", "message"),
    [
        ("strides: [[k, 1], [1]]", r"patterns\[0\]\.strides\[1\]: expected one stride per dim of input slot 1"),
        ("strides: [~, ~, [1], ~]", r"strides\[2\]: expected one stride per dim of input slot 2 \(0 dims\)"),
        ("strides: {7: [1, k]}", r"strides: slot 7 is not an input slot \(the pattern has 4\)"),
        ("strides: [[k, 1], [1, k +]]", r"strides\[1\]\[1\]: malformed expression"),
        ("arguments: {overload: default, args: [{tensor: 0}, {tensor: 5}]}", r"arguments\.args: input slot 5 is not"),
        ("arguments: {overload: default, args: [{tensor: x}]}", r"arguments\.args: a \{tensor: k\} argument needs"),
        ("arguments: {overload: default}", r"arguments: expected \{overload: NAME, args: \[\.\.\.\]\}"),
        ("arguments: {args: [], kwargs: {}}", r"arguments: unknown key 'kwargs'"),
    ],
)
def test_detail_errors_name_the_key(tmp_path: Path, detail: str, message: str) -> None:
    path = write_config(tmp_path, CONFIG.replace("DETAIL", detail))
    with pytest.raises(DatabaseError, match=message):
        load_config(path)


def test_a_broadcast_stride_of_zero_is_kept_and_a_negative_one_skips(tmp_path: Path) -> None:
    text = CONFIG.replace("DETAIL", "strides: [[k, 1], [0, STRIDE]]")
    for stride, written in (("k", True), ("0 - 1", False)):
        config = load_config(write_config(tmp_path, text.replace("STRIDE", stride)))
        request = GridRequest(directory=Path("unused"), config=config, models=(), restricted=False, rows=0,
                              seed=0, budget=budget_bytes(1))
        report = KernelReport(KERNEL_TYPE, Path("unused"), created=True)
        route = config.kernels[KERNEL_TYPE]
        table = CsvTable.new(list(IDENTITY_COLUMNS) + list(route.written_columns) + [ROW_ORIGIN])
        rows = plan_rows(KERNEL_TYPE, route, table, request, report)
        if written:
            assert [r[INPUT_STRIDES] for r in rows] == ["64,1;0,64;;", "64,1;0,64;;"]
            assert "Op Arguments" not in rows[0]
        else:
            assert rows == [] and report.skipped == 2 and "not a stride" in report.skip_reasons[0]
