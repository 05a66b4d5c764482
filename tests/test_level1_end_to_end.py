"""The real Ascend Level1 profile (a CNN's training step, batch 32), ingested and replayed on the CPU.

Its 134 compute rows span 33 kernel types: convolutions and their backprops on 5HD activations
and FRACTAL_Z weights, the TransData conversions between those formats and NCHW, the
optimizer's Foreach kernels, max pooling with its UINT16 argmax mask, the loss and its gradient.
All but MemSet (a memory clear whose size the profile does not record) replay and pass; no row
leaves its CSV, and write-back keeps every profiled value in its place.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from perf_plugin.cli import main as perfdb
from tests.conftest import ASCEND
from tests.test_level2_end_to_end import BENCH_TEST, _snapshot
from tests.test_plugin import _profiler_modules_loaded  # noqa: F401  (torch.profiler's lazy imports, before pytester)


@pytest.fixture(scope="module")
def ingested(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The profile ingested before pytester snapshots ``sys.modules``: the parts of pandas the
    ingest imports stay imported for the tests that follow."""
    folder = tmp_path_factory.mktemp("level1")
    profile = folder / "kernel_details.csv"
    shutil.copy(ASCEND / "kernel_details_level1.csv", profile)
    assert perfdb(["ingest", "--profiling-path", str(profile), "--database-path", str(folder / "db")]) == 0
    return folder / "db"


def test_the_level1_profile_replays_and_keeps_every_profiled_value(ingested: Path, pytester: pytest.Pytester) -> None:
    db = pytester.path / "db"
    shutil.copytree(ingested, db)
    before = _snapshot(db)
    assert sum(len(table) for table in before.values()) == 134 and len(before) == 33

    pytester.makepyfile(test_kernels=BENCH_TEST)
    result = pytester.runpytest(
        "--database-path", str(db), "--repeat-count", "1", "--warmup-count", "0", "-p", "no:cacheprovider",
        "--replay-coverage-min", "0.95", "--replay-coverage-weight", "time", "-rs",
    )
    result.assert_outcomes(passed=133, skipped=1)
    result.stdout.fnmatch_lines([
        "*replay coverage: 99.3% of 134 selected rows replayed and passed, 98.2% of their profiled time*",
        "*MemSet.csv, row 2: replay cannot be built: MemSet records no tensors*",
    ])

    after = _snapshot(db)
    assert set(after) == set(before) and not list(db.glob("*.quarantine.csv"))  # UINT16 rows stay
    for name, table in before.items():
        assert len(after[name]) == len(table), name
        for old, new in zip(table, after[name]):
            assert {column: new[column] for column in old} == old, name
            if name != "MemSet.csv":
                assert float(new["Average Duration(us)"]) > 0, name
