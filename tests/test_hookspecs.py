"""The hooks a project implements to extend a run (``perf_plugin.hookspecs``), in one pytester run:
a replay that lives in the project, a collector of its own, and the finished run's summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_kernel_catalog import TANH_MODULE
from tests.test_plugin import _profiler_modules_loaded  # noqa: F401  (torch.profiler's lazy imports, before pytester)

BENCH_TEST = (Path(__file__).parents[1] / "bench" / "test_kernels.py").read_text()
HEADER = "OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats"

CONFTEST = '''
import json
from pathlib import Path

from perf_plugin.profiling.torch_profiler import TorchProfilerCollector

OUT = Path(__file__).parent / "hooks.json"
SEEN = {"measured": []}


class CountingCollector(TorchProfilerCollector):
    def measure(self, ref, run_once, repeats, before_repeat=None):
        SEEN["measured"].append(ref.kernel_type)
        super().measure(ref, run_once, repeats, before_repeat)


def pytest_perf_replay_modules(config):
    return ["project_replays"]


def pytest_perf_make_collector(backend, settings):
    return CountingCollector(backend, batch_size=settings.profile_batch_size)


def pytest_perf_run_finished(config, summary, notes):
    SEEN["passed"] = sorted(r.ref.kernel_type for r in summary.results if r.outcome == "passed")
    SEEN["coverage"] = summary.coverage
    SEEN["notes_have_writeback"] = any(line.startswith("write-back") for line in notes)
    OUT.write_text(json.dumps(SEEN))
'''


def test_a_project_extends_the_run_through_the_hooks(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(project_replays=TANH_MODULE, test_kernels=BENCH_TEST)
    pytester.syspathinsert()
    db = pytester.path / "db"
    db.mkdir()
    (db / "Tanh.csv").write_text(HEADER + '\ndynamic,CPU,"""16,8""",FLOAT,ND,"""16,8""",FLOAT,ND\n')
    (db / "Add.csv").write_text(HEADER + '\ndynamic,CPU,"""8,8;8,8""",FLOAT;FLOAT,ND;ND,"""8,8""",FLOAT,ND\n')
    result = pytester.runpytest(
        "--perf-database-path", str(db), "--perf-repeat-count", "3", "--perf-warmup-count", "1", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=2)
    seen = json.loads((pytester.path / "hooks.json").read_text())
    assert sorted(seen["measured"]) == ["Add", "Tanh"]  # the project's collector timed both cases
    assert seen["passed"] == ["Add", "Tanh"]  # the project's Tanh replay ran beside the built-in Add
    assert seen["coverage"] == 1.0 and seen["notes_have_writeback"]
