"""Progress lines on a long run: tests done of total, rate, ETA, per xdist worker."""

from __future__ import annotations

from collections import Counter

import pytest

from perf_plugin.run.progress import format_duration, progress_line
from tests.test_plugin import BENCH_TEST, HEADER, _profiler_modules_loaded  # noqa: F401  (torch.profiler's lazy imports, before pytester)



def test_the_line_says_done_total_rate_eta_and_per_worker() -> None:
    assert format_duration(5) == "5s" and format_duration(95) == "1m35s" and format_duration(7260) == "2h01m"
    line = progress_line(41250, 100000, 80.5, Counter({"gw1": 20000, "gw0": 21250}))
    assert line == "perf: 41250/100000 tests (41.2%), 512.4/s, ETA 1m55s; gw0 21250, gw1 20000"
    assert progress_line(3, 0, 1.0, Counter({"local": 3})) == "perf: 3/? tests, 3.0/s"


def test_a_run_under_xdist_writes_progress_lines_per_worker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_kernels=BENCH_TEST)
    db = pytester.path / "db"
    db.mkdir()
    rows = [f'dynamic,CPU,"""{n},16""",FLOAT,ND,"""{n},16""",FLOAT,ND' for n in range(2, 14)]
    (db / "Abs.csv").write_text("\n".join([HEADER, *rows]) + "\n")
    result = pytester.runpytest_subprocess(
        "--perf-database-path", str(db), "-n", "2", "--perf-progress-interval", "0.000001",
        "--perf-repeat-count", "2", "--perf-warmup-count", "0", "-p", "no:cacheprovider", timeout=240,
    )
    result.assert_outcomes(passed=12)
    result.stdout.fnmatch_lines(["perf: 12/12 tests (100.0%), *.*/s, ETA 0s; gw0 *, gw1 *"])
    # without replay cases, no line from this plugin
    pytester.makepyfile(test_other="def test_x():\n    pass\n")
    other = pytester.runpytest_subprocess("test_other.py", "--perf-progress-interval", "0.000001", "-p", "no:cacheprovider")
    other.assert_outcomes(passed=1)
    assert "perf: " not in other.stdout.str()
