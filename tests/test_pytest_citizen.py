"""The plugin in a project that is not a benchmark: it costs nothing and takes no option name.

Both tests run pytest in a fresh interpreter (``runpytest_subprocess``), where the plugin is
loaded through its entry point as in any project that has the package installed.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

BENCH_TEST = (Path(__file__).parents[1] / "bench" / "test_kernels.py").read_text()
ADD_CSV = (
    "OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats\n"
    'dynamic,AI_VECTOR_CORE,"""8,128;8,128""",FLOAT;FLOAT,ND;ND,"""8,128""",FLOAT,ND\n'
)

UNRELATED_TEST = """
import sys

def test_the_plugin_is_loaded_and_torch_is_not(request):
    assert request.config.pluginmanager.has_plugin("perf_plugin")
    assert "torch" not in sys.modules
"""


def test_an_unrelated_run_does_not_import_torch(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_unrelated=UNRELATED_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "perf: backend" not in result.stdout.str()


PROJECT_CONFTEST = """
def pytest_addoption(parser):
    parser.addoption("--device", default="none", help="the project's own device option")
"""

PROJECT_TEST = """
def test_the_project_keeps_its_device_option(request):
    assert request.config.getoption("--device") == "mine"
    assert request.config.getoption("--perf-device") == "LAB_DEVICE"
"""


def test_a_conftest_that_adds_device_keeps_it_and_the_replay_runs(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(PROJECT_CONFTEST)
    pytester.makepyfile(test_project=PROJECT_TEST, test_kernels=BENCH_TEST)
    db = pytester.path / "db"
    db.mkdir()
    (db / "Add.csv").write_text(ADD_CSV)
    result = pytester.runpytest_subprocess(
        "--device", "mine", "--perf-device", "LAB_DEVICE", "--perf-database-path", str(db),
        "--perf-repeat-count", "3", "--warmup-count", "1", "-p", "no:cacheprovider",
    )  # fmt: skip
    result.assert_outcomes(passed=2)  # the project's test and the one replay case
    with (db / "Add.csv").open(newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    assert float(row["Average Duration(us)"]) > 0
