"""pytest-benchmark stores and compares the replays' device timings (``perf_plugin.report.benchmark_bridge``).

End to end through ``pytest bench`` in subprocesses (pytest-benchmark's regression check raises
out of the terminal summary, as it does for its users): the profiler's samples reach
``--benchmark-json`` and ``--benchmark-autosave``, and ``--benchmark-compare-fail`` gates a later
run on a saved baseline, with and without xdist.  The threshold tests time with a collector of
the project's own (``pytest_perf_make_collector``) whose samples are set by the test, so that a
neutral change and a 20 % regression are told apart exactly on a shared CPU; the others use the
built-in profiler.
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest

from perf_plugin.report import benchmark_bridge
from perf_plugin.results import CaseRef, CaseResult
from tests.test_plugin import ADD_ROWS, BENCH_TEST, HEADER, MATMUL_ROWS
from tests.test_plugin import _profiler_modules_loaded  # noqa: F401  (torch.profiler's lazy imports, before pytester)

# a kernel type with no replay: its case is skipped, so it has no benchmark
NO_REPLAY_ROWS = ['dynamic,AI_CORE,"""8,8""",FLOAT,ND,"""8,8""",FLOAT,ND']
REPEATS = 4
WORKERS = [None, "2"]

# Samples set by the test: the kernel type's base duration times DEVICE_FACTOR, the kernels still run.
FIXED_COLLECTOR = '''
import os

from perf_plugin.results import CaseResult

BASE_US = {"MatMulV2": 20.0, "Add": 3.0}


class FixedDeviceCollector:
    kind = "in-process"

    def __init__(self):
        self.ready = []

    def measure(self, ref, run_once, repeats, before_repeat=None):
        for _ in range(repeats):
            if before_repeat is not None:
                before_repeat()
            run_once()
        factor = float(os.environ["DEVICE_FACTOR"])
        samples = tuple(BASE_US[ref.kernel_type] * factor * (1 + 0.01 * i) for i in range(repeats))
        self.ready.append(CaseResult(ref, "passed", backend="cpu", samples_us=samples))

    def drain(self):
        ready, self.ready = self.ready, []
        return ready

    def finish(self):
        return self.drain()


def pytest_perf_make_collector(backend, settings):
    return FixedDeviceCollector()
'''


@pytest.fixture
def database(pytester: pytest.Pytester) -> Path:
    pytester.makepyfile(test_kernels=BENCH_TEST)
    db = pytester.path / "db"
    db.mkdir()
    (db / "MatMulV2.csv").write_text("\n".join([HEADER, *MATMUL_ROWS]) + "\n")
    (db / "Add.csv").write_text("\n".join([HEADER, *ADD_ROWS]) + "\n")
    return db


def bench(pytester: pytest.Pytester, db: Path, workers: str | None, *args: str) -> pytest.RunResult:
    """``pytest bench`` on the tiny database in a subprocess, with or without ``-n``."""
    xdist = ["-n", workers] if workers else []
    return pytester.runpytest_subprocess(
        "--perf-database-path", str(db), "--perf-repeat-count", str(REPEATS), "--perf-warmup-count", "1",
        "-p", "no:cacheprovider", "--benchmark-storage", str(pytester.path / "store"), *xdist, *args,
    )


def saved_runs(pytester: pytest.Pytester) -> list[Path]:
    return sorted((pytester.path / "store").glob("*/*.json"))


def baseline_scaled(saved: Path, factor: float, name: str) -> Path:
    """A copy of a saved run beside it whose stored times are ``factor`` times the measured ones."""
    data = json.loads(saved.read_text())
    for entry in data["benchmarks"]:
        stats = entry["stats"]
        for key in ("min", "max", "mean", "median", "stddev", "q1", "q3", "iqr", "ld15iqr", "hd15iqr", "total"):
            stats[key] *= factor
        stats["ops"] /= factor
    target = saved.with_name(name)
    target.write_text(json.dumps(data))
    return target


def csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


# ----------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("workers", WORKERS)
def test_json_holds_one_entry_per_measured_case_with_its_device_samples(
    pytester: pytest.Pytester, database: Path, workers: str | None
) -> None:
    (database / "NoSuchKernel.csv").write_text("\n".join([HEADER, *NO_REPLAY_ROWS]) + "\n")
    result = bench(pytester, database, workers, "--benchmark-json", "out.json", "--benchmark-autosave")
    result.assert_outcomes(passed=3, skipped=1)
    data = json.loads((pytester.path / "out.json").read_text())
    entries = {entry["fullname"]: entry for entry in data["benchmarks"]}
    assert len(entries) == 3 and not any("NoSuchKernel" in name for name in entries)
    written = {
        (kernel_type, line): row
        for kernel_type in ("MatMulV2", "Add")
        for line, row in enumerate(csv_rows(database / f"{kernel_type}.csv"), start=2)
    }
    for fullname, entry in entries.items():
        info = entry["extra_info"]
        assert fullname.startswith("test_kernels.py::test_kernel_replay[") and entry["name"] == fullname.split("::")[1]
        assert entry["group"] == info["kernel_type"] and info["backend"] == "cpu" and info["device"] == "CPU_X86_64"
        assert info["csv_file"] == f"{info['kernel_type']}.csv" and info["signature"]
        samples = entry["stats"]["data"]
        assert len(samples) == entry["stats"]["rounds"] == REPEATS and entry["stats"]["iterations"] == 1
        # the samples are the device samples written back to the row (seconds there, us in the CSV)
        row = written[(info["kernel_type"], info["row_line"])]
        assert float(row["Average Duration(us)"]) == pytest.approx(statistics.fmean(samples) * 1e6, abs=1e-3)
        assert float(row["MicroBench Min Duration(us)"]) == pytest.approx(min(samples) * 1e6, abs=1e-3)
        assert entry["options"]["timer"] == "perf_plugin.device:cpu"
    # the autosaved run holds the same benchmarks, by node id
    (saved,) = saved_runs(pytester)
    assert {entry["fullname"] for entry in json.loads(saved.read_text())["benchmarks"]} == set(entries)


@pytest.mark.parametrize("workers", WORKERS)
def test_compare_fail_gates_on_a_saved_baseline_of_the_profilers_samples(
    pytester: pytest.Pytester, database: Path, workers: str | None
) -> None:
    bench(pytester, database, workers, "--benchmark-autosave").assert_outcomes(passed=3)
    (saved,) = saved_runs(pytester)
    # a baseline a million times faster than anything this machine measures: a regression (a
    # thousand was not enough margin: a small CPU matmul's mean moved ~1900x on a loaded 2-core host)
    baseline_scaled(saved, 1e-6, "0002_faster.json")
    regressed = bench(pytester, database, workers, "--benchmark-compare=0002", "--benchmark-compare-fail=mean:5%")
    assert regressed.ret != 0
    lines = "\n".join(regressed.outlines + regressed.errlines)  # pytest-benchmark logs its verdict to stderr
    assert "Performance has regressed" in lines
    assert lines.count("Field 'mean' has failed PercentageRegressionCheck") == 3
    assert "test_kernel_replay[MatMulV2-32x64,64x16-FLOAT-to-32x16-FLOAT]" in lines
    # the run itself wrote its durations back before the gate: a regression is not a failed replay
    assert all(float(r["Average Duration(us)"]) > 0 for r in csv_rows(database / "MatMulV2.csv"))
    # a million times slower: an improvement passes
    slower = baseline_scaled(saved, 1e6, "0003_slower.json")
    improved = bench(pytester, database, workers, f"--benchmark-compare={slower}", "--benchmark-compare-fail=mean:5%")
    assert improved.ret == 0, improved.stdout.str()
    improved.stdout.fnmatch_lines(["*benchmark 'Add'*", "*benchmark 'MatMulV2'*"])
    assert "Performance has regressed" not in improved.stdout.str() + improved.stderr.str()


@pytest.mark.parametrize("workers", WORKERS)
def test_compare_fail_passes_a_neutral_change_and_fails_a_regression_beyond_the_threshold(
    pytester: pytest.Pytester, database: Path, workers: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest(FIXED_COLLECTOR)
    monkeypatch.setenv("DEVICE_FACTOR", "1.0")
    bench(pytester, database, workers, "--benchmark-autosave").assert_outcomes(passed=3)
    (saved,) = saved_runs(pytester)
    stored = {entry["group"]: entry["stats"]["mean"] for entry in json.loads(saved.read_text())["benchmarks"]}
    assert stored == pytest.approx({"MatMulV2": 20.3e-6, "Add": 3.045e-6})  # the samples as measured, in seconds
    gate = ("--benchmark-compare=0001", "--benchmark-compare-fail=mean:5%")

    neutral = bench(pytester, database, workers, *gate)
    assert neutral.ret == 0, neutral.stdout.str()
    assert "Performance has regressed" not in neutral.stdout.str() + neutral.stderr.str()

    monkeypatch.setenv("DEVICE_FACTOR", "1.2")
    regressed = bench(pytester, database, workers, *gate)
    assert regressed.ret != 0
    lines = "\n".join(regressed.outlines + regressed.errlines)
    assert "Performance has regressed" in lines
    assert lines.count("Field 'mean' has failed PercentageRegressionCheck: 20.0000") == 3


def test_a_plain_run_gives_pytest_benchmark_nothing(pytester: pytest.Pytester, database: Path) -> None:
    # no table of every case unless the run asks pytest-benchmark for something
    result = bench(pytester, database, None)
    result.assert_outcomes(passed=3)
    assert "benchmark 'MatMulV2'" not in result.stdout.str() and not saved_runs(pytester)


# ----------------------------------------------------------------------------- plain functions
def _ref(case_id: str, kernel_type: str = "Add", line: int = 2) -> CaseRef:
    return CaseRef(case_id, kernel_type, f"{kernel_type}.csv", line, "8,8 | FLOAT")


def test_only_passed_cases_with_samples_and_a_test_become_benchmarks() -> None:
    refs = {f"t.py::test[{name}]": _ref(name) for name in ("a", "b", "c")}
    results = [
        CaseResult(_ref("c"), "passed", backend="cpu", samples_us=(2.0, 4.0)),
        CaseResult(_ref("a"), "passed", backend="cpu", samples_us=(1.0,)),
        CaseResult(_ref("b"), "failed", reason="mismatch", backend="cpu", samples_us=(1.0,)),
        CaseResult(_ref("d"), "passed", backend="cpu", samples_us=(1.0,)),  # no test made it
        CaseResult(_ref("e"), "passed", backend="cpu"),  # nothing measured
    ]
    found = benchmark_bridge.measured(results, benchmark_bridge.node_ids_by_case(refs))
    assert [(node, r.ref.case_id) for node, r in found] == [("t.py::test[a]", "a"), ("t.py::test[c]", "c")]


def test_an_entry_holds_the_samples_in_seconds_and_is_added_once() -> None:
    refs = {"t.py::test[MatMulV2-x]": _ref("MatMulV2-x", "MatMulV2", 7)}
    results = [CaseResult(refs["t.py::test[MatMulV2-x]"], "passed", backend="cuda", samples_us=(2.0, 4.0, 6.0),
                          reported_kernel_type="MatMulV3")]
    options = benchmark_bridge.timing_options("cuda", 3, 1, "rotate")
    session = SimpleNamespace(benchmarks=[])  # what the bridge reads of pytest-benchmark's session
    assert benchmark_bridge.add_benchmarks(session, results, refs, device_name="H100", options=options) == 1
    assert benchmark_bridge.add_benchmarks(session, results, refs, device_name="H100", options=options) == 0
    (entry,) = session.benchmarks
    flat = entry.as_dict(include_data=True)
    assert flat["name"] == "test[MatMulV2-x]" and flat["fullname"] == "t.py::test[MatMulV2-x]"
    assert flat["group"] == "MatMulV2" and flat["param"] == "MatMulV2-x"
    assert flat["stats"]["data"] == pytest.approx([2e-6, 4e-6, 6e-6])
    assert flat["stats"]["mean"] == pytest.approx(4e-6) and flat["stats"]["rounds"] == 3
    assert flat["extra_info"]["row_line"] == 7 and flat["extra_info"]["reported_kernel_type"] == "MatMulV3"
    assert flat["extra_info"]["device"] == "H100" and flat["options"]["cache_mode"] == "rotate"


@pytest.mark.parametrize(
    ("args", "wanted"),
    [
        ((), False),
        (("--benchmark-autosave",), True),
        (("--benchmark-json", "x.json"), True),
        (("--benchmark-compare",), True),
        (("--benchmark-enable",), True),
        (("--benchmark-autosave", "--benchmark-disable"), False),
    ],
)
def test_pytest_benchmark_is_given_entries_only_when_asked(
    pytester: pytest.Pytester, args: tuple[str, ...], wanted: bool
) -> None:
    config = pytester.parseconfig(*args)
    assert benchmark_bridge.requested(config) is wanted
