"""The real Ascend Level2 profile, ingested and replayed on the CPU with write-back.

Every compute row of the profile has a replay; all but MemSet (a memory clear whose size the
profile does not record) replay and pass.  Write-back adds durations and keeps everything the
profile put there: every row, every profiled value, in its place.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from perf_plugin.cli import main as perfdb
from tests.conftest import ASCEND
from tests.test_plugin import _profiler_modules_loaded  # noqa: F401  (torch.profiler's lazy imports, before pytester)

BENCH_TEST = (Path(__file__).parents[1] / "bench" / "test_kernels.py").read_text()


def _snapshot(db: Path) -> dict[str, list[dict[str, str]]]:
    tables = {}
    for path in sorted(db.glob("*.csv")):
        with path.open(newline="") as handle:
            tables[path.name] = list(csv.DictReader(handle))
    return tables


def test_the_level2_profile_replays_and_keeps_every_profiled_value(pytester: pytest.Pytester) -> None:
    profile = pytester.path / "kernel_details.csv"
    shutil.copy(ASCEND / "kernel_details_level2_llm_train.csv", profile)
    db = pytester.path / "db"
    assert perfdb(["ingest", "--profiling-path", str(profile), "--database-path", str(db)]) == 0
    before = _snapshot(db)
    rows = sum(len(table) for table in before.values())
    assert rows == 109

    pytester.makepyfile(test_kernels=BENCH_TEST)
    result = pytester.runpytest(
        "--database-path", str(db), "--repeat-count", "2", "--warmup-count", "0", "-p", "no:cacheprovider",
        "--replay-coverage-min", "0.95", "-rs",
    )
    result.assert_outcomes(passed=108, skipped=1)
    result.stdout.fnmatch_lines([
        "*replay coverage: 99.1% of 109 selected rows replayed and passed, 99.2% of their profiled time*",
        "*MemSet.csv, row 2: replay cannot be built: MemSet records no tensors*",
    ])

    after = _snapshot(db)
    assert set(after) == set(before) and not list(db.glob("*.quarantine.csv"))
    for name, table in before.items():
        assert len(after[name]) == len(table), name
        for old, new in zip(table, after[name]):
            assert {column: new[column] for column in old} == old, name  # nothing profiled changed
            if name != "MemSet.csv":
                assert float(new["Average Duration(us)"]) > 0, name
    (memset,) = after["MemSet.csv"]
    assert memset.get("Average Duration(us)", "") == ""
