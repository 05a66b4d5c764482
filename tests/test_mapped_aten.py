"""Kernel types with no replay of their own, which the real op_mapping.yaml maps from an aten
operator, replay through that operator, built from the row; a row the operator cannot be built
from says which argument it lacks."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
import torch

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.mapped_aten import MappedAtenReplay, argument_template
from perf_plugin.replay.op_mapping import replay_lookup_for
from perf_plugin.replay.tensors import kernel_row_from_cells
from perf_plugin.replay.verify import verify_outputs
from tests.conftest import ASCEND
from tests.test_level2_end_to_end import BENCH_TEST
from tests.test_plugin import _profiler_modules_loaded  # noqa: F401

OP_MAPPING = ASCEND / "op_mapping_vllm0.13.0_torch2.8.0_cann8.3.yaml"
HEADER = ["OP State", "Accelerator Core", "Input Shapes", "Input Data Types", "Input Formats", "Output Shapes",
          "Output Data Types", "Output Formats"]
# Rows as an Ascend profiler writes them (kernel_details' cells), of kernel types the 0.13.0
# mapping names from aten operators and no replay of this project claims.
ROWS = {
    "Sigmoid": ["dynamic", "AI_VECTOR_CORE", '"4096,128"', "DT_BF16", "ND", '"4096,128"', "DT_BF16", "ND"],
    "Div": ["dynamic", "AI_VECTOR_CORE", '"2048,64;2048,64"', "FLOAT;FLOAT", "ND;ND", '"2048,64"', "FLOAT", "ND"],
    "SelectV2": ["dynamic", "AI_VECTOR_CORE", '"64,128;64,128;64,128"', "BOOL;FLOAT;FLOAT", "ND;ND;ND", '"64,128"', "FLOAT", "ND"],
    "BitwiseNot": ["dynamic", "AI_VECTOR_CORE", '"1024"', "BOOL", "ND", '"1024"', "BOOL", "ND"],
    "ScatterElementsV2": ["dynamic", "AI_VECTOR_CORE", '"64,128;64,8;64,8"', "FLOAT;INT64;FLOAT", "ND;ND;ND",
                          '"64,128"', "FLOAT", "ND"],
}


def database(root: Path) -> Path:
    db = root / "db"
    db.mkdir()
    shutil.copy(OP_MAPPING, db / "op_mapping.yaml")
    for kernel_type, cells in ROWS.items():
        with (db / f"{kernel_type}.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(HEADER)
            writer.writerow(cells)
    return db


@pytest.mark.parametrize("kernel_type", ["Sigmoid", "Div", "SelectV2", "BitwiseNot"])
def test_a_mapped_kernel_type_replays_through_its_aten_operator(tmp_path: Path, kernel_type: str) -> None:
    lookup, _ = replay_lookup_for(database(tmp_path))
    replay = lookup(kernel_type)
    assert isinstance(replay, MappedAtenReplay)
    row = kernel_row_from_cells(kernel_type, dict(zip(HEADER, ROWS[kernel_type])))
    replay.check(row)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    outputs = replay.run(*args)
    verify_outputs(replay, row, outputs, replay.reference(*args), args)


def test_an_argument_the_row_does_not_record_is_named(tmp_path: Path) -> None:
    lookup, _ = replay_lookup_for(database(tmp_path))
    replay = lookup("ScatterElementsV2")
    assert replay is not None
    row = kernel_row_from_cells("ScatterElementsV2", dict(zip(HEADER, ROWS["ScatterElementsV2"])))
    with pytest.raises(CaseBuildError, match=r"aten.scatter.value takes dim \(int\), which the row does not record"):
        replay.check(row)


def test_templates_follow_the_schema() -> None:
    assert argument_template("where", "self", 3) == [{"tensor": 0}, {"tensor": 1}, {"tensor": 2}]
    assert argument_template("add", "Tensor", 2) == [{"tensor": 0}, {"tensor": 1}]  # alpha left at its default
    with pytest.raises(CaseBuildError, match="takes 1 tensor"):
        argument_template("sigmoid", "default", 2)


def test_pytest_bench_replays_them_and_reports_the_one_it_cannot_build(pytester: pytest.Pytester) -> None:
    db = database(pytester.path)
    pytester.makepyfile(test_kernels=BENCH_TEST)
    result = pytester.runpytest("--database-path", str(db), "--repeat-count", "2", "--warmup-count", "0",
                                "-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=4, skipped=1)
    result.stdout.fnmatch_lines(["*ScatterElementsV2.csv, row 2*aten.scatter.value takes dim (int)*"])
