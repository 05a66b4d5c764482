"""The memory estimator and the --max-hbm-gb budget filter."""

from __future__ import annotations

import random
from math import prod
from pathlib import Path

import pytest

from perf_plugin.database.schema import IDENTITY_COLUMNS, ROW_ORIGIN
from perf_plugin.database.table import CsvTable
from perf_plugin.grid.config import load_config
from perf_plugin.grid.memory import GIB, budget_bytes, estimate_bytes, estimate_row_bytes
from perf_plugin.grid.models import find_model
from perf_plugin.grid.runner import GridRequest, KernelReport, plan_rows
from perf_plugin.replay.tensors import kernel_row_from_cells

# bytes per element, written out here rather than taken from the code under test
ITEMSIZE = {"DT_BF16": 2, "FLOAT16": 2, "FLOAT": 4, "INT64": 8, "INT32": 4, "INT8": 1}
KERNEL_TYPES = ("MatMulV2", "FusedInferAttentionScore", "GroupedMatmul", "GatherV2", "SoftmaxV2", "BatchMatMulV2")
MODELS = ("qwen3-32b", "deepseek-v3", "qwen3-235b-a22b")
# attention has the largest grid; two models (GQA and MLA) keep the test quick
ATTENTION_MODELS = ("qwen3-32b", "deepseek-v3")


def test_estimate_of_a_profiled_matmul_row() -> None:
    row = kernel_row_from_cells("MatMulV3", {
        "Input Shapes": '"4096,1024;6144,1024"', "Input Data Types": "DT_BF16;DT_BF16",
        "Output Shapes": '"4096,6144"', "Output Data Types": "DT_BF16",
    })
    assert estimate_row_bytes(row) == (4096 * 1024 + 6144 * 1024 + 4096 * 6144) * 2
    assert estimate_row_bytes(row, workspace=100) == (4096 * 1024 + 6144 * 1024 + 4096 * 6144) * 2 + 100
    shapes = ((4096, 1024), (6144, 1024)), ((4096, 6144),)
    assert estimate_bytes(*shapes, (2, 2), (2,), 100) == estimate_row_bytes(row, workspace=100)
    assert estimate_bytes(((8,), None), ((8, 2),), (4, 8), (1,)) == 8 * 4 + 16
    assert budget_bytes(32) == 32 * 2**30 == 32 * GIB
    assert budget_bytes(0.5) == 2**29


def independent_bytes(kernel_type: str, row: dict[str, str]) -> int:
    """Tensor bytes of a CSV row from its cells, plus the FIA softmax statistics workspace."""
    total = 0
    for side in ("Input", "Output"):
        shapes = row[f"{side} Shapes"].strip('"').split(";")
        dtypes = row[f"{side} Data Types"].split(";")
        for shape, dtype in zip(shapes, dtypes):
            if shape:
                total += prod(int(d) for d in shape.split(",")) * ITEMSIZE[dtype]
    if kernel_type == "FusedInferAttentionScore":
        query = [int(d) for d in row["Input Shapes"].strip('"').split(";")[0].split(",")]
        total += 8 * prod(query[:-1])  # float32 max and sum per query token and head
    return total


def plan(kernel_type: str, budget: int) -> tuple[list[dict[str, str]], KernelReport]:
    table = CsvTable.new(list(IDENTITY_COLUMNS) + ["avg_seq_len", ROW_ORIGIN])
    names = ATTENTION_MODELS if kernel_type == "FusedInferAttentionScore" else MODELS
    request = GridRequest(
        directory=Path("unused"),
        config=load_config(),
        models=tuple(find_model(m) for m in names),
        restricted=True,
        rows=0,
        seed=0,
        budget=budget,
    )
    report = KernelReport(kernel_type, Path("unused"), created=True)
    route = request.config.kernels[kernel_type]
    return plan_rows(kernel_type, route, table, request, report), report


@pytest.mark.parametrize("kernel_type", KERNEL_TYPES)
def test_no_row_over_the_budget_gets_through(kernel_type: str) -> None:
    rng = random.Random(f"budget-{kernel_type}")
    budgets = [rng.randrange(1 << 20, 1 << 33), budget_bytes(32)]
    previous: set[tuple[str, ...]] = set()
    reports = []
    for budget in budgets:
        rows, report = plan(kernel_type, budget)
        reports.append(report)
        sizes = [independent_bytes(kernel_type, row) for row in rows]
        assert rows and all(size <= budget for size in sizes)
        # every candidate is accounted for exactly once
        candidates = report.evaluated - report.filtered + report.variants  # expert loads: a row each
        assert candidates - report.skipped == report.over_budget + report.repeated + report.in_file + report.available
        # a larger budget keeps every row a smaller one kept
        keys = {tuple(row[c] for c in IDENTITY_COLUMNS) + (row.get("avg_seq_len", ""),) for row in rows}
        assert previous <= keys
        previous = keys
        if report.over_budget:
            # the filter is tight: the largest row kept is within a factor 16 of the budget
            assert max(sizes) * 16 > budget
    assert reports[0].over_budget >= reports[1].over_budget
    if kernel_type == "FusedInferAttentionScore":
        assert reports[1].over_budget > 0  # 256 sequences of 128K tokens exceed 32 GiB
