"""--perf-candidate: candidate kernels judged against the replays (correctness, speedup, fast_p),
a baseline_time.json, per-row trace files; and the package's plain functions."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from perf_plugin.candidates.artifacts import trace_name
from perf_plugin.candidates.baseline import (
    BaselineError,
    entry_from_samples,
    lookup,
    read_baseline,
    write_baseline,
)
from perf_plugin.candidates.judge import Verdict, check_candidate, poison_tensor
from perf_plugin.candidates.registry import CandidateFileError, load_candidates
from perf_plugin.candidates.scoring import RowScore, fast_p_table, parse_thresholds
from perf_plugin.results import CaseRef

from tests.test_plugin import BENCH_TEST, HEADER
# Real-format rows (embedded-quote shapes, Ascend dtype spellings); the second has a profiled time.
ADD_ROWS = [
    'dynamic,AI_VECTOR_CORE,"""8,128;8,128""",FLOAT;DT_BF16,ND;ND,"""8,128""",FLOAT,ND,,',
    'dynamic,AI_VECTOR_CORE,"""16,64;16,64""",FLOAT;FLOAT,ND;ND,"""16,64""",FLOAT,ND,3.0,100',
]
RMS_ROWS = ['dynamic,AI_VECTOR_CORE,"""4,64;64""",FLOAT;FLOAT,ND;ND,"""4,64;4,1""",FLOAT;FLOAT,ND;ND,,']
PROFILED = ",Profiling Average Duration(us),Profiling Count"

SAME_OP = '''
import torch
from perf_plugin.candidates import candidate

@candidate("Add")
def add(x, y, out=None):
    return torch.add(x, y) if out is None else torch.add(x, y, out=out)
'''
TIMES_1_01 = '''
import torch
from perf_plugin.candidates import candidate

@candidate("Add")
def add(x, y, out=None):
    return torch.add(x, y) * 1.01
'''
# Computes once per shape, then hands the same buffer back without writing it.
STALE = '''
import torch
from perf_plugin.candidates import candidate

_done = {}

@candidate("Add")
def add(x, y, out=None):
    key = (tuple(x.shape), x.dtype, y.dtype)
    if key not in _done:
        _done[key] = torch.add(x, y)
    return _done[key]
'''


def write_csv(path: Path, header: str, rows: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


@pytest.fixture(scope="module", autouse=True)
def _profiler_modules_loaded() -> None:
    """Import what a profiler session imports lazily, before pytester's in-process runs (as
    tests/test_plugin.py does: pytester restores sys.modules after every run)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]):
        torch.ones(1).add(1)


@pytest.fixture
def project(pytester: pytest.Pytester) -> Path:
    pytester.makepyfile(test_kernels=BENCH_TEST)
    db = pytester.path / "db"
    write_csv(db / "Add.csv", HEADER + PROFILED, ADD_ROWS)
    write_csv(db / "RmsNorm.csv", HEADER + PROFILED, RMS_ROWS)
    return db


def judge(pytester: pytest.Pytester, db: Path, source: str, *args: str, name: str = "cand") -> tuple[pytest.RunResult, dict]:
    path = pytester.path / f"{name}.py"
    path.write_text(source)
    result = pytester.runpytest(
        "--database-path", str(db), "--repeat-count", "3", "--warmup-count", "1", "-p", "no:cacheprovider",
        "--perf-candidate", str(path), "--perf-candidate-checks", "3", *args,
    )
    reports = sorted((pytester.path / "candidate_runs" / name).glob("candidate_run_*.json"))
    return result, json.loads(reports[-1].read_text()) if reports else {}


def test_a_correct_candidate_is_judged_on_every_row_and_its_times_stay_out_of_the_database(
    pytester: pytest.Pytester, project: Path
) -> None:
    result, report = judge(pytester, project, SAME_OP)
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*perf candidate*", "*2 rows judged, 2 correct*", "overall*"])
    stats = report["stats"]
    assert (stats["total_ops"], stats["passed_ops"], stats["pass_rate"]) == (2, 2, 1.0)
    profile = stats["op_results"]["Add"]["profile"]
    assert profile["gen_time"] > 0 and profile["base_time"] > 0
    assert math.isclose(profile["speedup"], profile["base_time"] / profile["gen_time"])
    assert report["fast_p"]["overall"]["fast_0"] == {"rows": 1.0, "time": 1.0}
    # the database holds the reference replay's means, one per row, none appended
    rows = list(csv.DictReader((project / "Add.csv").open()))
    assert len(rows) == 2
    written = sorted(float(r["Average Duration(us)"]) for r in rows)
    base = sorted(r["base_time"] for r in report["results"])
    assert all(math.isclose(w, b, rel_tol=1e-3) for w, b in zip(written, base))
    assert all(r["base_source"] == "run" for r in report["results"])
    (run_report,) = (project / "reports").glob("run_report_*.json")
    assert not any("::candidate" in json.dumps(r) for r in json.loads(run_report.read_text())["results"])


def test_trace_files_follow_the_trace_naming(pytester: pytest.Pytester, project: Path) -> None:
    judge(pytester, project, SAME_OP)
    names = sorted(p.name for p in (pytester.path / "candidate_runs" / "cand" / "Add").iterdir())
    assert names == [
        "I2_S01_Add_DO_CODER_result.txt",
        "I2_S02_Add_VERIFIER_error_log.txt",
        "I2_S02_Add_VERIFIER_profile.txt",
        "I3_S01_Add_DO_CODER_result.txt",
        "I3_S02_Add_VERIFIER_error_log.txt",
        "I3_S02_Add_VERIFIER_profile.txt",
    ]
    folder = pytester.path / "candidate_runs" / "cand" / "Add"
    assert (folder / "I3_S01_Add_DO_CODER_result.txt").read_text() == SAME_OP
    log = (folder / "I3_S02_Add_VERIFIER_error_log.txt").read_text().splitlines()
    assert log[:3] == [f"PASS check {n} of 3 (seed {1_000_003 + n - 1})" for n in (1, 2, 3)]
    assert log[-1] == "PASS the last timed repeat's outputs match the reference"
    profile = json.loads((folder / "I3_S02_Add_VERIFIER_profile.txt").read_text())
    assert profile["row_line"] == 3 and len(profile["gen_samples_us"]) == 3 and profile["weight_us"] == 300.0


def test_baseline_time_json_is_written_then_reused(pytester: pytest.Pytester, project: Path) -> None:
    _, first = judge(pytester, project, SAME_OP)
    baseline_file = pytester.path / "candidate_runs" / "baseline_time.json"
    stored = json.loads(baseline_file.read_text())
    ((device, types),) = stored.items()
    entries = types["Add"]
    assert len(entries) == 2
    entry = next(iter(entries.values()))
    assert set(entry) >= {"mean", "std", "min", "max", "num_trials", "hardware", "device"} and entry["num_trials"] == 3
    # a later run judges against the stored times: make them recognisable
    for item in entries.values():
        item["mean"] = 1.0  # ms
    baseline_file.write_text(json.dumps(stored))
    result, second = judge(pytester, project, SAME_OP, name="cand2")
    result.stdout.fnmatch_lines(["*reference times: 2 from *baseline_time.json, 0 from this run*"])
    assert [r["base_source"] for r in second["results"]] == ["baseline", "baseline"]
    assert [r["base_time"] for r in second["results"]] == [1000.0, 1000.0]
    assert json.loads(baseline_file.read_text()) == stored  # nothing to add: left as it was


def test_a_wrong_candidate_is_not_correct_and_not_fast(pytester: pytest.Pytester, project: Path) -> None:
    result, report = judge(pytester, project, TIMES_1_01)
    result.assert_outcomes(passed=3)  # the reference replays still pass and are written back
    assert report["stats"]["passed_ops"] == 0 and "profile" not in report["stats"]["op_results"]["Add"]
    assert all(share["rows"] == 0.0 for share in report["fast_p"]["overall"].values())
    assert all("check 1 of 3" in r["reason"] and "relative error" in r["reason"] for r in report["results"])
    assert all(r["gen_time"] is None for r in report["results"])
    result.stdout.fnmatch_lines(["*wrong: Add-*check 1 of 3*relative error*"])


def test_a_candidate_handing_back_a_stale_buffer_is_caught_by_the_poisoning(pytester: pytest.Pytester, project: Path) -> None:
    _, report = judge(pytester, project, STALE)
    assert report["stats"]["passed_ops"] == 0
    for row in report["results"]:
        assert row["checks_passed"] == 1 and "check 2 of 3" in row["reason"], row


def test_a_candidate_file_that_raises_stops_the_run_with_one_line(pytester: pytest.Pytester, project: Path) -> None:
    result, _ = judge(pytester, project, "import torch\n\nraise RuntimeError('no kernel here')\n")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*cand.py (line 3): importing it raised RuntimeError: no kernel here"])
    assert "Traceback" not in result.stderr.str()


# ----------------------------------------------------------------------------- plain functions
def test_fast_p_by_rows_and_by_profiled_time() -> None:
    scores = [
        RowScore("a", "Add", True, 10.0, 5.0, weight_us=100.0),  # 2x
        RowScore("b", "Add", True, 10.0, 8.0, weight_us=300.0),  # 1.25x
        RowScore("c", "Add", False, 10.0, 1.0, weight_us=600.0),  # fast but wrong
        RowScore("d", "RmsNorm", True, 4.0, 5.0),  # slower, no profiled time
    ]
    table = fast_p_table(scores, (0.0, 1.0, 1.5))
    add = table["Add"]["fast_p"]
    assert add["fast_0"] == {"rows": 2 / 3, "time": 0.4}
    assert add["fast_1"] == {"rows": 2 / 3, "time": 0.4}
    assert add["fast_1.5"] == {"rows": 1 / 3, "time": 0.1}
    assert table["RmsNorm"]["fast_p"]["fast_1"] == {"rows": 0.0, "time": None}
    overall = table["overall"]
    assert overall["fast_p"]["fast_1"]["rows"] == 0.5 and overall["fast_p"]["fast_0"]["rows"] == 0.75
    assert overall["speedup"] == pytest.approx(24.0 / 18.0)  # correct, timed rows: 10+10+4 over 5+8+5
    assert parse_thresholds("2, 1,1.5,1") == (1.0, 1.5, 2.0)
    with pytest.raises(ValueError):
        parse_thresholds("-1")


def test_baseline_round_trip_and_errors(tmp_path: Path) -> None:
    ref = CaseRef("Add-8x128", "Add", "Add.csv", 2, "sig")
    path = write_baseline(tmp_path / "b.json", {"H100": {"Add": {ref.case_id: entry_from_samples(ref, (2.0, 4.0), "NVIDIA H100", "cuda")}}})
    baseline = read_baseline(path)
    entry = lookup(baseline, "H100", ref)
    assert entry is not None and entry.mean_ms == 0.003 and entry.mean_us == pytest.approx(3.0) and entry.num_trials == 2
    assert lookup(baseline, "H100", CaseRef("Add-8x128", "Add", "Add.csv", 2, "changed row")) is None
    assert lookup(baseline, "A100", ref) is None
    assert read_baseline(tmp_path / "absent.json") == {}
    (tmp_path / "bad.json").write_text('{"H100": {"Add": {"Add-8x128": {"std": 1}}}}')
    with pytest.raises(BaselineError, match=r"bad.json: 'H100' / 'Add' / 'Add-8x128' has no 'mean'"):
        read_baseline(tmp_path / "bad.json")


def test_trace_name_pads_the_step_and_sanitises_the_op() -> None:
    assert trace_name(123, 3, "exp_add_op", "DO_DESIGNER", "prompt") == "I123_S03_exp_add_op_DO_DESIGNER_prompt.txt"
    assert trace_name(7, 12, "aten.mm/x", "VERIFIER", "profile") == "I7_S12_aten.mm_x_VERIFIER_profile.txt"


def test_registry_collects_by_kernel_type_and_refuses_duplicates(tmp_path: Path) -> None:
    good = tmp_path / "good.py"
    good.write_text(SAME_OP)
    assert list(load_candidates(good)) == ["Add"]
    twice = tmp_path / "twice.py"
    twice.write_text(SAME_OP + SAME_OP.split("\n", 3)[3].replace("def add", "def add2"))
    with pytest.raises(CandidateFileError, match="two candidates registered for kernel type Add"):
        load_candidates(twice)
    with pytest.raises(CandidateFileError, match="candidate file not found"):
        load_candidates(tmp_path / "missing.py")


def test_poisoning_makes_every_element_wrong() -> None:
    import torch

    for tensor in (torch.ones(4), torch.arange(4, dtype=torch.int32), torch.tensor([True, False])):
        before = tensor.clone()
        poison_tensor(tensor)
        assert not bool((tensor == before).any())


def test_check_candidate_stops_at_the_first_failing_input_set() -> None:
    import torch

    from perf_plugin.replay.registry import get_replay
    from perf_plugin.replay.tensors import KernelRow, TensorSpec

    replay = get_replay("Add")
    assert replay is not None
    spec = TensorSpec((8, 16), "FLOAT", "ND")
    row = KernelRow("Add", (spec, spec), (spec,))
    cpu = torch.device("cpu")
    calls = []

    def flaky(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return x + y if len(calls) < 3 else x - y

    verdict = Verdict("c", "Add", "Add.csv", 2)
    ok = check_candidate(flaky, replay, row, cpu, lambda s: torch.Generator().manual_seed(s), [1, 2, 3, 4], lambda: None, verdict)
    assert not ok and verdict.checks_passed == 2 and verdict.reason.startswith("check 3 of 4 (seed 3)")


# Hides milliseconds of work (a 4096^3 float32 GEMM) on a side stream the caller never waits for:
# the guard is that the candidate is timed from the device's records of every stream, not from
# the calling stream's.
SIDE_STREAM = '''
import torch
from perf_plugin.candidates import candidate

_state = []

@candidate("Add")
def add(x, y, out=None):
    if not _state:
        big = torch.randn(4096, 4096, device=x.device)
        _state.extend([torch.cuda.Stream(), big])
    side, big = _state
    with torch.cuda.stream(side):
        torch.mm(big, big)
        return torch.add(x, y) if out is None else torch.add(x, y, out=out)
'''


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA (side streams)")
def test_work_on_a_side_stream_is_counted_in_the_candidates_time(pytester: pytest.Pytester, project: Path) -> None:
    result, report = judge(pytester, project, SIDE_STREAM, "--perf-backend", "cuda")
    result.assert_outcomes(passed=3)
    profile = report["stats"]["op_results"]["Add"]["profile"]
    assert profile["gen_time"] > 500  # µs: the side stream's spin, not only the launch on the caller's stream
    assert profile["speedup"] < 0.1


# Launches the collector's own marker kernel (torch.cuda._sleep) in every call, then the op: it
# must be timed with its sleep, and the reference rows must keep their times.
LAUNCHES_THE_MARKER = '''
import torch
from perf_plugin.candidates import candidate

@candidate("Add")
def add(x, y, out=None):
    torch.cuda._sleep(200_000)
    return torch.add(x, y) if out is None else torch.add(x, y, out=out)
'''


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA (the marker kernel)")
@pytest.mark.parametrize("cache_mode", ["warm", "produced", "auto"])
def test_a_candidate_launching_the_marker_kernel_is_timed_and_the_reference_rows_keep_their_times(
    pytester: pytest.Pytester, project: Path, cache_mode: str
) -> None:
    result, report = judge(pytester, project, LAUNCHES_THE_MARKER, "--perf-backend", "cuda", "--perf-cache-mode", cache_mode)
    result.assert_outcomes(passed=3)
    results = report["results"]
    assert len(results) == 2 and all(r["correct"] for r in results)
    # 200,000 spin cycles are 100 us or more at a GPU's clock of at most 2 GHz; the add alone a few
    assert all(r["gen_time"] > 50 and r["gen_time"] > 5 * r["base_time"] for r in results), results
    rows = list(csv.DictReader((project / "Add.csv").open()))
    assert all(float(r["Average Duration(us)"]) > 0 for r in rows)


def test_candidates_are_judged_under_xdist_and_reported_once(pytester: pytest.Pytester, project: Path) -> None:
    path = pytester.path / "cand.py"
    path.write_text(SAME_OP)
    result = pytester.runpytest_subprocess(
        "--perf-database-path", str(project), "--perf-repeat-count", "3", "--perf-warmup-count", "1", "-n", "2",
        "-p", "no:cacheprovider", "--perf-candidate", str(path), "--perf-candidate-checks", "3", timeout=240,
    )
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*2 rows judged, 2 correct*"])
    (report,) = sorted((pytester.path / "candidate_runs" / "cand").glob("candidate_run_*.json"))
    stats = json.loads(report.read_text())["stats"]
    assert (stats["total_ops"], stats["passed_ops"]) == (2, 2)
    assert stats["op_results"]["Add"]["profile"]["gen_time"] > 0
