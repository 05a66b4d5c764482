"""Shared fixtures of the project's own tests."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

FIXTURES = Path(__file__).parent / "fixtures"


def pytest_configure(config: pytest.Config) -> None:
    """torch imported before the test modules, with capture suspended, as a replay run imports it.

    The tests run replay sessions inside this one (pytester); imported by a test module under
    this session's capture, torch's logging would write to that capture stream, not to the
    inner run's report whose contents the log-capture tests check.
    """
    from perf_plugin.run.setup import import_torch_outside_capture

    import_torch_outside_capture(config)
ASCEND = FIXTURES / "ascend"


# kernel_details.csv is msprof's op_summary with renamed columns (tests/fixtures/ascend/SOURCES.md).
# No genuine op_summary file is public, so tests build one from the real kernel_details fixture by
# renaming the columns back (newer generation: Block Num / Mix Block Num).
OP_SUMMARY_COLUMNS = {
    "Name": "Op Name",
    "Type": "OP Type",
    "Accelerator Core": "Task Type",
    "Start Time(us)": "Task Start Time(us)",
    "Duration(us)": "Task Duration(us)",
    "Wait Time(us)": "Task Wait Time(us)",
    "Block Dim": "Block Num",
    "Mix Block Dim": "Mix Block Num",
}


@pytest.fixture(scope="module")
def level2_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database ingested from the real Level2 training profile, once per test module (copy it
    before changing it)."""
    from perf_plugin.cli import main as perfdb

    db = tmp_path_factory.mktemp("level2") / "db"
    assert perfdb(["ingest", "--profiling-path", str(ASCEND / "kernel_details_level2_llm_train.csv"),
                   "--database-path", str(db)]) == 0
    return db


@pytest.fixture
def ascend_fixtures() -> Path:
    return ASCEND


@pytest.fixture(autouse=True)
def _replay_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests' expectations (device directory names, free memory, gloo) are the CPU's.

    On a machine with a GPU, ``--backend auto`` would pick CUDA; an explicit ``--backend``
    option in a test still wins over this environment default.
    """
    monkeypatch.setenv("PERF_BACKEND", "cpu")
