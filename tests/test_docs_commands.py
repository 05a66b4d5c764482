"""Every command README.md and docs/*.md show is run, or at least parsed, by this module.

The commands are the lines of the fenced ``bash`` (``sh``, ``shell``) blocks of README.md and of
every docs/*.md page, and each ``$ ``-prefixed line of any fenced block; a trailing ``# comment`` is
dropped, ``\\``-continued lines are joined, whitespace does not count. Each command must be

(a) a key of ``RUN``: a test below runs it for real on the CPU, in a copy of the project (bench/,
    the shipped database) made once per session, adapted as little as it takes: ``-k`` narrowed to
    a few small cases, 2 timed repeats after 1 warm-up (``PERF_REPEAT_COUNT``/``PERF_WARMUP_COUNT``),
    on the CPU whatever the host has (``PERF_BACKEND``),
    placeholders such as ``DIR`` filled with temporary directories;
(b) a whole line, or a whole quoted string, of a script under reproduce/ (whitespace aside): the
    script runs it (too long, or needing the package index, for this module); or
(c) a key of ``NEEDS_HARDWARE``, with the reason: each is parsed here (pytest accepts its options
    and values, its ``-m`` marker is registered, the files it names exist, torchrun knows its
    launcher options).

A command added to the docs without one of these fails ``test_every_documented_command_is_covered``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas  # noqa: F401  (imported once, before pytester's in-process runs restore sys.modules)
import pytest

from perf_plugin.cli import main as perfdb_main
from tests.test_fia_runtime import decode_call  # one 128-request decode step, as vLLM-Ascend records it

# pytester restores sys.modules after each in-process run, so torch re-imports a few modules and warns again
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

ROOT = Path(__file__).parents[1]
DOC_PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
SHELL_FENCES = {"bash", "sh", "shell"}
SAMPLE = Path("database", "data", "CPU_X86_64", "torch", "torch2.13.0")  # the shipped sample, derived on the CPU
FIXTURES = ROOT / "tests" / "fixtures"
BIN = Path(sys.executable).parent  # pytest, perfdb, pytest-benchmark of this environment

# (a) Run for real on the CPU: documented command -> the test of this module that runs it.
RUN = {
    # README.md "Where results go"
    "cp -r database/data /tmp/mydb && pytest bench --perf-database-root /tmp/mydb": "test_measure_into_a_copy",
    "pytest bench --perf-no-writeback": "test_only_measure",
    # README.md "Common uses" and docs/options.md "Common command lines"
    "pytest bench": "test_replay_the_derived_database",
    "pytest bench -k MatMulV3": "test_one_kernel_type",
    "pytest bench --collect-only -q": "test_collect_only_lists_one_case_per_row",
    "pytest bench --perf-database-path DIR": "test_an_explicit_database_directory",
    "pytest bench --perf-update-mode missing-only": "test_missing_only",
    "pytest bench --perf-replay-coverage-min 0.9": "test_coverage_gates",
    "pytest bench --perf-replay-coverage-min 0.98 --perf-replay-coverage-weight time": "test_coverage_gates",
    # docs/running.md: shards and their results files; docs/perfdb.md: merge, resume
    "pytest bench --perf-shard 0/2 --perf-results-out shard0.jsonl": "test_shards_merge_and_resume",
    "pytest bench --perf-shard 1/2 --perf-results-out shard1.jsonl": "test_shards_merge_and_resume",
    "perfdb merge DIR shard0.jsonl shard1.jsonl": "test_shards_merge_and_resume",
    "perfdb merge DIR RESULTS_FILE...": "test_shards_merge_and_resume",
    "perfdb resume DIR --dry-run": "test_shards_merge_and_resume",
    "perfdb resume DIR": "test_shards_merge_and_resume",
    # docs/running.md: baselines and a regression gate
    "pytest bench -n 8 --benchmark-json baseline.json": "test_pytest_benchmark_baseline_and_gate",
    "pytest bench -n 8 --perf-no-writeback --benchmark-compare baseline.json --benchmark-compare-fail mean:5%":
        "test_pytest_benchmark_baseline_and_gate",
    "pytest-benchmark compare baseline.json --group-by group --histogram hist": "test_pytest_benchmark_baseline_and_gate",
    # docs/perfdb.md
    "perfdb ingest --profiling-path PROF_DIR_OR_FILE --database-path DIR": "test_perfdb_ingest",
    "perfdb ingest --profiling-path kernel_details.csv --vllm-version 0.18.0 --torch-version 2.9.0 --cann-version 8.5":
        "test_perfdb_ingest",
    "perfdb grid --data-dir DIR --target-models qwen3-32b,dsv3 --rows 1000 --seed 0 --max-hbm-gb 32": "test_perfdb_grid",
    "perfdb validate-comm REFERENCE_DIR NEW_DIR --threshold 0.1 --gate": "test_perfdb_comm_tools",
    "perfdb upgrade-comm database/data --dry-run": "test_perfdb_comm_tools",
    "perfdb restore-quarantine DIR --kernel-type MatMulV2 --dry-run": "test_perfdb_restore_quarantine",
    "perfdb restore-quarantine DIR": "test_perfdb_restore_quarantine",
    "perfdb fia-runtime DIR --jsonl fia_runtime_metadata.jsonl": "test_perfdb_fia_runtime",
    # docs/perfdb.md: lookup
    'perfdb lookup --database-path DIR --kernel-type MatMulV3 --input-shapes "4096,1024;5120,1024" '
    '--input-dtypes "DT_BF16;DT_BF16"': "test_perfdb_lookup",
    "perfdb lookup --database-path DIR --queries queries.csv --out answers.csv": "test_perfdb_lookup",
    "perfdb lookup --database-path DIR --queries queries.csv --out answers.csv --policy": "test_perfdb_lookup",
    "perfdb lookup --database-path DIR --collective all_reduce --message-bytes 2097152 --devices 8":
        "test_perfdb_lookup_collective",
    "perfdb peaks --database-path DIR": "test_perfdb_peaks",
    # docs/lookup.md
    "python benchmarks/lookup_accuracy.py --database-path DIR --roofline --policy": "test_lookup_accuracy_benchmark",
    # docs/input-values.md
    "perfdb ingest --profiling-path trace.json --database-path DIR": "test_perfdb_ingest_input_values",
    "perfdb ingest --profiling-path elsewhere.json --input-values trace.values.json --database-path DIR":
        "test_perfdb_ingest_input_values",
}

# (c) Needs hardware this machine lacks: documented command -> why; parsed by test_commands_that_need_absent_hardware_parse.
NEEDS_HARDWARE = {
    "pytest bench --perf-backend cuda -n 8": "CUDA: one xdist worker per GPU, 8 GPUs",
    'pytest bench --perf-backend cuda --perf-no-writeback -k "RmsNorm or SwiGlu" '
    "--perf-candidate examples/candidates/triton_rmsnorm.py --perf-candidate-fast-p 0,1,1.5,2":
        "CUDA: a Triton candidate kernel",
    "pytest bench --perf-backend cuda --perf-no-writeback -k SwiGlu --perf-candidate examples/candidates/compiled_swiglu.py":
        "CUDA: a torch.compile'd candidate, judged on the GPU",
    "pytest bench --perf-backend npu --perf-vllm-version 0.18.0 --perf-cann-version 8.5":
        "an Ascend NPU with torch_npu and msprof",
    "torchrun --nproc-per-node 8 -m pytest bench -m hccl":
        "8 ranks, one per NPU, HCCL (the same tests on the CPU with gloo: reproduce/collectives_cpu.sh)",
}


# ------------------------------------------------------------------------------------- extraction


def _strip_comment(line: str) -> str:
    """The line without a shell comment: an unquoted ``#`` at the start or after whitespace."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index]
    return line


def normalize(command: str) -> str:
    return " ".join(command.split())


def documented_commands() -> dict[str, list[str]]:
    """Each command of README.md and docs/*.md (normalized) -> where it is shown (``page:line``)."""
    found: dict[str, list[str]] = {}
    for page in DOC_PAGES:
        fence: str | None = None
        pending, start = "", 0
        for number, raw in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            stripped = raw.strip()
            if stripped.startswith("```"):
                fence = (stripped[3:].strip().lower() or "text") if fence is None else None
                continue
            if fence is None:
                continue
            dollar = stripped.startswith("$ ")
            if fence not in SHELL_FENCES and not dollar and not pending:
                continue
            text = _strip_comment(stripped[2:] if dollar else stripped).strip()
            if not pending:
                start = number
            text = f"{pending} {text}".strip()
            if text.endswith("\\"):
                pending = text[:-1].strip()
                continue
            pending = ""
            if text:
                found.setdefault(normalize(text), []).append(f"{page.relative_to(ROOT)}:{start}")
    return found


def reproduce_commands() -> set[str]:
    """Whole lines, and whole quoted strings, of the scripts under reproduce/ (normalized)."""
    commands: set[str] = set()
    for script in sorted((ROOT / "reproduce").rglob("*")):
        if not script.is_file() or script.suffix not in {".sh", ".py", ".bash", ""}:
            continue
        text = script.read_text(encoding="utf-8", errors="replace").replace("\\\n", " ")
        for line in text.splitlines():
            commands.add(normalize(_strip_comment(line)))
            for single, double in re.findall(r"'([^']*)'|\"([^\"]*)\"", line):
                commands.add(normalize(single or double))
    return commands


DOCUMENTED = documented_commands()


def documented(command: str) -> str:
    """The command as the docs show it; fails when they no longer do."""
    assert normalize(command) in DOCUMENTED, f"no longer in README.md or docs/: {command}"
    return command


# --------------------------------------------------------------------------------- coverage itself


def test_the_readme_keeps_its_two_commands() -> None:
    assert len(DOCUMENTED) >= 20
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    two = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    for tail in ("pytest bench", "pytest tests"):
        line = ("python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e . && "
                f"{tail}")  # fmt: skip
        assert f"```bash\n{line}\n```" in two  # CI and users rely on them as they are


def test_every_documented_command_is_covered() -> None:
    in_reproduce = reproduce_commands()
    uncovered = {
        command: where for command, where in DOCUMENTED.items()
        if command not in RUN and command not in NEEDS_HARDWARE and command not in in_reproduce
    }  # fmt: skip
    assert not uncovered, (
        "commands shown in README.md or docs/ that nothing runs: add each to RUN (and a test that runs it), to a "
        "script under reproduce/, or to NEEDS_HARDWARE with the reason:\n"
        + "\n".join(f"  {command}   ({', '.join(where)})" for command, where in uncovered.items())
    )


def test_the_lists_name_only_commands_the_docs_show_and_tests_that_exist() -> None:
    stale = [command for command in (*RUN, *NEEDS_HARDWARE) if normalize(command) != command or command not in DOCUMENTED]
    assert not stale, f"not (or not so spelled) in README.md or docs/: {stale}"
    assert not set(RUN) & set(NEEDS_HARDWARE)
    missing = {name for name in RUN.values() if not callable(globals().get(name))}
    assert not missing, f"RUN names tests this module lacks: {missing}"


def test_the_reproduce_scripts_cover_the_readme_two_commands() -> None:
    """The commands left to reproduce/ are there as whole lines or strings, never as fragments."""
    in_reproduce = reproduce_commands()
    left = sorted(c for c in DOCUMENTED if c not in RUN and c not in NEEDS_HARDWARE)
    assert left and all(c in in_reproduce for c in left)
    assert any(c.endswith("pytest bench") and "pip install" in c for c in left)
    assert any(c.endswith("pytest tests") and "pip install" in c for c in left)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_links_between_the_pages_resolve() -> None:
    """README.md and docs/ link each other by file and heading; each link names a page and heading that exist."""
    broken = []
    for page in DOC_PAGES:
        text = page.read_text(encoding="utf-8")
        for target, anchor in re.findall(r"\]\(([^)#\s]*\.md|)(?:#([^)\s]+))?\)", text):
            if not target and not anchor:
                continue
            linked = (page.parent / target).resolve() if target else page
            if not linked.is_file():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
                continue
            headings = {_slug(h) for h in re.findall(r"^#+ (.+)$", linked.read_text(encoding="utf-8"), re.M)}
            if anchor and anchor not in headings:
                broken.append(f"{page.relative_to(ROOT)}: {target}#{anchor}")
    assert not broken, broken
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    unlinked = [p.name for p in DOC_PAGES[1:] if f"(docs/{p.name})" not in readme]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of what ``pytest bench`` reads: bench/, the root conftest and pyproject, the database
    (and examples/, which commands name)."""
    copy = tmp_path_factory.mktemp("project")
    ignore = shutil.ignore_patterns("reports", ".perf-journal", "__pycache__", "*.lock")
    for name in ("bench", "database", "examples"):
        shutil.copytree(ROOT / name, copy / name, ignore=ignore)
    for name in ("conftest.py", "pyproject.toml"):
        shutil.copy(ROOT / name, copy / name)
    return copy


@pytest.fixture(scope="module", autouse=True)
def _profiler_modules_loaded() -> None:
    """What a profiler session imports lazily, imported once before pytester's in-process runs
    (pytester restores ``sys.modules`` after each; the profiler's C++ state outlives them)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]):
        torch.ones(1).add(1)


@dataclass
class Done:
    ret: int
    out: str


@dataclass
class Shell:
    """Runs documented commands, adapted, in the project copy."""

    pytester: pytest.Pytester
    capsys: pytest.CaptureFixture[str]
    project: Path

    def pytest(self, command: str) -> pytest.RunResult:
        """An in-process ``pytest`` run (what the command-line ``pytest`` runs), in the copy."""
        args = shlex.split(command)
        assert args[0] == "pytest", command
        return self.pytester.runpytest(*args[1:], "-p", "no:cacheprovider")

    def perfdb(self, command: str) -> Done:
        """The ``perfdb`` entry point, in process."""
        args = shlex.split(command)
        assert args[0] == "perfdb", command
        self.capsys.readouterr()
        try:
            ret = perfdb_main(args[1:])
        except SystemExit as stop:  # argparse
            ret = stop.code if isinstance(stop.code, int) else 1
        captured = self.capsys.readouterr()
        return Done(ret or 0, captured.out + captured.err)

    def shell(self, command: str, timeout: float = 180) -> Done:
        """A real shell, with this environment's executables first on PATH."""
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        done = subprocess.run(["bash", "-c", command], cwd=self.project, env=env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
        return Done(done.returncode, done.stdout + done.stderr)


@pytest.fixture
def sh(pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str], project: Path,
       monkeypatch: pytest.MonkeyPatch) -> Iterator[Shell]:  # fmt: skip
    monkeypatch.chdir(project)
    monkeypatch.setenv("PERF_REPEAT_COUNT", "2")
    monkeypatch.setenv("PERF_WARMUP_COUNT", "1")
    monkeypatch.setenv("PERF_PROGRESS_INTERVAL", "0")
    # the commands run on the CPU whatever this host has: on a GPU host the derived database
    # would be the GPU's, not the shipped sample these tests read back
    monkeypatch.setenv("PERF_BACKEND", "cpu")
    monkeypatch.setenv("PERF_TORCH_VERSION", SAMPLE.name.removeprefix("torch"))  # the sample's, whatever torch runs
    yield Shell(pytester, capsys, project)


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def duration(path: Path, dtype: str) -> list[str]:
    """``Average Duration(us)`` of the scalar rows (Add-scalar-<dtype>-...) of ``dtype`` (INT32, INT64, FLOAT)."""
    return [
        r.get("Average Duration(us)", "") for r in rows(path)
        if r["Input Shapes"] == '";"' and r["Input Data Types"].split(";")[0] == dtype
    ]  # fmt: skip


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.glob("*.csv"))}


def sample_copy(project: Path, target: Path) -> Path:
    shutil.copytree(project / SAMPLE, target, ignore=shutil.ignore_patterns("reports", ".perf-journal"))
    return target


def clear_scalar_add_durations(directory: Path) -> None:
    """No duration in the scalar Add rows, whatever earlier runs wrote there."""
    path = directory / "Add.csv"
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header, table = list(reader.fieldnames or ()), list(reader)
    for row in table:
        if row["Input Shapes"] == '";"' and "Average Duration(us)" in row:
            row["Average Duration(us)"] = ""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, header, lineterminator="\n")
        writer.writeheader()
        writer.writerows(table)


ONE_ADD = "'Add and INT32'"  # one small case: Add of two int32 scalars
SCALAR_ADDS = "'Add and scalar'"  # the four scalar Add rows


# ------------------------------------------------------------------------------------ (a) pytest bench


def test_collect_only_lists_one_case_per_row(sh: Shell, project: Path) -> None:
    result = sh.pytest(documented("pytest bench --collect-only -q"))
    assert result.ret == 0
    cases = [line for line in result.outlines if line.startswith("bench/test_kernels.py::test_kernel_replay[")]
    assert len(cases) == sum(len(rows(p)) for p in (project / SAMPLE).glob("*.csv") if ".quarantine" not in p.name)
    assert "bench/test_kernels.py::test_kernel_replay[Add-scalar-INT32-to-scalar-INT32]" in cases


def test_replay_the_derived_database(sh: Shell, project: Path) -> None:
    """``pytest bench`` writes into the derived directory's CSVs, its reports into reports/."""
    command = documented("pytest bench") + f" -k {ONE_ADD}"
    result = sh.pytest(command)
    result.assert_outcomes(passed=1)
    directory = project / SAMPLE
    assert f"database {directory}" in result.stdout.str()
    assert float(duration(directory / "Add.csv", "INT32")[0]) > 0
    for pattern in ("replay_report_*.md", "duration_gap_*.csv", "run_report_*.json"):
        assert list((directory / "reports").glob(pattern)), pattern


def test_one_kernel_type(sh: Shell) -> None:
    command = documented("pytest bench -k MatMulV3").replace("MatMulV3", "'MatMulV3 and FLOAT'")  # its one small row
    sh.pytest(command).assert_outcomes(passed=1)


def test_an_explicit_database_directory(sh: Shell, project: Path, tmp_path: Path) -> None:
    directory = sample_copy(project, tmp_path / "db")
    before = digest(project / SAMPLE)
    command = documented("pytest bench --perf-database-path DIR").replace("DIR", str(directory))
    sh.pytest(f"{command} -k {ONE_ADD}").assert_outcomes(passed=1)
    assert float(duration(directory / "Add.csv", "INT32")[0]) > 0
    assert digest(project / SAMPLE) == before  # the derived directory is left alone


def test_missing_only(sh: Shell, project: Path) -> None:
    directory = project / SAMPLE
    clear_scalar_add_durations(directory)
    sh.pytest(f"pytest bench -k {ONE_ADD}").assert_outcomes(passed=1)  # one scalar row with a duration
    kept = duration(directory / "Add.csv", "INT32")
    result = sh.pytest(documented("pytest bench --perf-update-mode missing-only") + f" -k {SCALAR_ADDS}")
    assert result.ret == 0
    assert duration(directory / "Add.csv", "INT32") == kept  # measured before: not written again
    assert all(float(d) > 0 for dtype in ("INT64", "FLOAT") for d in duration(directory / "Add.csv", dtype))


def test_coverage_gates(sh: Shell, project: Path, tmp_path: Path) -> None:
    by_rows = sh.pytest(documented("pytest bench --perf-replay-coverage-min 0.9") + f" -k {ONE_ADD}")
    assert by_rows.ret == 0
    assert "replay coverage: 100.0% of 1 selected rows" in by_rows.stdout.str()
    # by time needs profiled times, which the shipped sample lacks: the sample's rows, with the
    # profile they come from ingested into them, as a profiled model's database
    profiled = sample_copy(project, tmp_path / "profiled")
    profile = FIXTURES / "ascend" / "kernel_details_level2_llm_train.csv"
    assert sh.perfdb(f"perfdb ingest --profiling-path {profile} --database-path {profiled}").ret == 0
    command = documented("pytest bench --perf-replay-coverage-min 0.98 --perf-replay-coverage-weight time")
    by_time = sh.pytest(f"{command} --perf-database-path {profiled} -k {ONE_ADD}")
    assert by_time.ret == 0
    assert "of their profiled time (meets --perf-replay-coverage-min 0.98 by time)" in by_time.stdout.str()


def test_only_measure(sh: Shell, project: Path) -> None:
    directory = project / SAMPLE
    def reports() -> dict[Path, int]:
        # by modification time too: a run in the same second as the one before writes the same names
        return {path: path.stat().st_mtime_ns for path in (directory / "reports").glob("*")}

    before, reports_before = digest(directory), reports()
    sh.pytest(documented("pytest bench --perf-no-writeback") + f" -k {ONE_ADD}").assert_outcomes(passed=1)
    assert digest(directory) == before  # CSVs unchanged
    written = {path for path, mtime in reports().items() if reports_before.get(path) != mtime}
    assert {path.name.split("_2")[0] for path in written} >= {"replay_report", "duration_gap", "run_report"}


def test_measure_into_a_copy(sh: Shell, project: Path, tmp_path: Path) -> None:
    """The README's copy-then-measure line, in a real shell: the checkout's CSVs stay as they are."""
    command = documented("cp -r database/data /tmp/mydb && pytest bench --perf-database-root /tmp/mydb")
    copy = tmp_path / "mydb"
    before = digest(project / SAMPLE)
    done = sh.shell(command.replace("/tmp/mydb", str(copy)) + f" -k {ONE_ADD} -p no:cacheprovider")
    assert done.ret == 0, done.out
    assert f"database: {copy / SAMPLE.relative_to('database/data')}" in done.out
    assert float(duration(copy / SAMPLE.relative_to("database/data") / "Add.csv", "INT32")[0]) > 0
    assert digest(project / SAMPLE) == before


def test_shards_merge_and_resume(sh: Shell, project: Path, tmp_path: Path) -> None:
    """Two shards' results files merged into one copy (docs/running.md), resumed as journals (docs/perfdb.md)."""
    for shard in ("0/2", "1/2"):
        index = shard[0]
        command = documented(f"pytest bench --perf-shard {shard} --perf-results-out shard{index}.jsonl")
        result = sh.pytest(f"{command} -k {SCALAR_ADDS}")
        result.assert_outcomes(passed=2)  # four scalar Add rows, two a shard
        assert (project / f"shard{index}.jsonl").is_file()
    merged = sample_copy(project, tmp_path / "merged")
    done = sh.perfdb(documented("perfdb merge DIR shard0.jsonl shard1.jsonl").replace("DIR", str(merged)))
    assert done.ret == 0, done.out
    assert done.out.count("2 measured case(s), 2 row(s) written") == 2, done.out
    assert all(float(d) > 0 for d in [*duration(merged / "Add.csv", "INT32"), *duration(merged / "Add.csv", "INT64")])
    other = sample_copy(project, tmp_path / "other")
    command = documented("perfdb merge DIR RESULTS_FILE...").replace("DIR", str(other))
    done = sh.perfdb(command.replace("RESULTS_FILE...", "shard0.jsonl shard1.jsonl"))
    assert done.ret == 0, done.out
    assert digest(other) == digest(merged)

    # a results file is a run's journal: left in .perf-journal, perfdb resume writes it back
    resumed = sample_copy(project, tmp_path / "resumed")
    (resumed / ".perf-journal").mkdir()
    shutil.copy(project / "shard0.jsonl", resumed / ".perf-journal" / "shard0.jsonl")
    dry = sh.perfdb(documented("perfdb resume DIR --dry-run").replace("DIR", str(resumed)))
    assert dry.ret == 0 and "2 measured result(s)" in dry.out, dry.out
    assert list((resumed / ".perf-journal").glob("*.jsonl"))
    done = sh.perfdb(documented("perfdb resume DIR").replace("DIR", str(resumed)))
    assert done.ret == 0 and "written back (all)" in done.out and "2 rows updated" in done.out, done.out
    assert not list((resumed / ".perf-journal").glob("*.jsonl"))


def test_pytest_benchmark_baseline_and_gate(sh: Shell) -> None:
    """``-n 8`` becomes ``-n 0`` (no worker processes; the bridge under -n: tests/test_benchmark_bridge.py)."""
    baseline = documented("pytest bench -n 8 --benchmark-json baseline.json").replace("-n 8", "-n 0")
    sh.pytest(f"{baseline} -k {ONE_ADD}").assert_outcomes(passed=1)
    saved = json.loads(Path("baseline.json").read_text())
    assert [b["group"] for b in saved["benchmarks"]] == ["Add"]

    gate = documented(
        "pytest bench -n 8 --perf-no-writeback --benchmark-compare baseline.json --benchmark-compare-fail mean:5%"
    ).replace("-n 8", "-n 0")
    result = sh.pytest(f"{gate} -k {ONE_ADD}")
    out = result.stdout.str() + result.stderr.str()
    assert "Comparing against benchmarks from: baseline.json" in out
    # two runs of one tiny CPU case may differ by more than 5 %: then the gate must say so
    assert result.ret == 0 or "Performance has regressed" in out, out

    compare = documented("pytest-benchmark compare baseline.json --group-by group --histogram hist")
    try:
        import pygal  # noqa: F401  (pip install 'pytest-benchmark[histogram]')
    except ImportError:
        compare = compare.replace(" --histogram hist", "")
    done = sh.shell(compare)
    assert done.ret == 0, done.out
    assert "test_kernel_replay[Add-scalar-INT32-to-scalar-INT32]" in done.out


# ---------------------------------------------------------------------------------------- (a) perfdb


def test_perfdb_ingest(sh: Shell, project: Path, tmp_path: Path) -> None:
    profile = FIXTURES / "ascend" / "kernel_details_level1.csv"  # a real torch_npu profile's kernel table
    command = documented("perfdb ingest --profiling-path PROF_DIR_OR_FILE --database-path DIR")
    done = sh.perfdb(command.replace("PROF_DIR_OR_FILE", str(profile)).replace("DIR", str(tmp_path / "db")))
    assert done.ret == 0, done.out
    assert list((tmp_path / "db").glob("*.csv"))

    shutil.copy(profile, project / "kernel_details.csv")
    done = sh.perfdb(documented(
        "perfdb ingest --profiling-path kernel_details.csv --vllm-version 0.18.0 --torch-version 2.9.0 --cann-version 8.5"
    ))  # fmt: skip
    assert done.ret == 0, done.out
    derived = project / "database" / "data" / "ATLAS_800_A3_752T_128G_DIE" / "vllm_ascend" / "vllm0.18.0_torch2.9.0_cann8.5"
    assert list(derived.glob("*.csv"))


def test_perfdb_ingest_input_values(sh: Shell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A routed MoE layer profiled with the capture (examples/moe_trace.py, CPU-sized): the values
    file beside the trace, then the same file named for a trace elsewhere."""
    import importlib.util

    import torch

    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no _grouped_mm")
    spec = importlib.util.spec_from_file_location("moe_trace_docs", ROOT / "examples" / "moe_trace.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = script
    spec.loader.exec_module(script)
    layer = script.build_layer(script.MoeShape(hidden=64, intermediate=32, experts=4, top_k=2), "cpu", 1.0)
    x = torch.randn(32, 64).to(torch.bfloat16)
    monkeypatch.chdir(tmp_path)
    script.profile_layer(layer, x, tmp_path / "trace.json")
    for command, db in (("perfdb ingest --profiling-path trace.json --database-path DIR", "db"),
                        ("perfdb ingest --profiling-path elsewhere.json --input-values trace.values.json "
                         "--database-path DIR", "db_elsewhere")):
        shutil.copy(tmp_path / "trace.json", tmp_path / "elsewhere.json")
        done = sh.perfdb(documented(command).replace("DIR", str(tmp_path / db)))
        assert done.ret == 0, done.out
        # the two grouped GEMMs, the router's softmax and top-k, the two gathers by the sorted order
        assert "6 of 6 captured call(s) attached" in done.out
        assert {row["Input Values Source"] for row in rows(tmp_path / db / "GroupedMatmul.csv")} == {"measured"}


def test_perfdb_lookup(sh: Shell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the real Level2 profile's rows: one interpolated query, then a CSV of queries."""
    db = tmp_path / "db"
    assert sh.perfdb(f"perfdb ingest --profiling-path {FIXTURES / 'ascend' / 'kernel_details_level2_llm_train.csv'} "
                     f"--database-path {db}").ret == 0
    done = sh.perfdb(documented('perfdb lookup --database-path DIR --kernel-type MatMulV3 --input-shapes '
                                '"4096,1024;5120,1024" --input-dtypes "DT_BF16;DT_BF16"').replace("DIR", str(db)))
    assert done.ret == 0 and "interpolated" in done.out, done.out
    monkeypatch.chdir(tmp_path)
    (tmp_path / "queries.csv").write_text('Kernel Type,Input Shapes,Input Data Types\nMatMulV3,"4096,1024;6144,1024",DT_BF16;DT_BF16\n')
    done = sh.perfdb(documented("perfdb lookup --database-path DIR --queries queries.csv --out answers.csv").replace("DIR", str(db)))
    assert done.ret == 0, done.out
    assert rows(tmp_path / "answers.csv")[0]["Provenance"] == "exact"
    shutil.copy(FIXTURES / "ascend" / "op_mapping_vllm0.18.0_torch2.9.0_cann8.5.yaml", db / "op_mapping.yaml")
    done = sh.perfdb(documented("perfdb lookup --database-path DIR --queries queries.csv --out answers.csv --policy")
                     .replace("DIR", str(db)))
    assert done.ret == 0, done.out
    assert rows(tmp_path / "answers.csv")[0]["Policy Provenance"] == "exact"


def test_perfdb_lookup_collective(sh: Shell, tmp_path: Path) -> None:
    """An all_reduce over 8 devices between two measured sizes: the alpha-beta line through them."""
    db = tmp_path / "hccl"
    db.mkdir()
    (db / "hcom_allReduce_.csv").write_text("message_bytes,num_devices,dtype,topology_tier,Duration(us),bandwidth_gbps\n"
                                            "1048576,8,DT_BF16,1,40.0,26.2\n4194304,8,DT_BF16,1,100.0,41.9\n")
    done = sh.perfdb(documented("perfdb lookup --database-path DIR --collective all_reduce --message-bytes 2097152 "
                                "--devices 8").replace("DIR", str(db)))
    assert done.ret == 0, done.out
    assert "all_reduce of 2097152 B over 8 devices: 60.000 us (interpolated" in done.out


def test_lookup_accuracy_benchmark(tmp_path: Path) -> None:
    """On the real Level2 profile's rows, with the real 0.18 op_mapping.yaml beside them."""
    db = tmp_path / "db"
    from perf_plugin.cli import main as perfdb

    assert perfdb(["ingest", "--profiling-path", str(FIXTURES / "ascend" / "kernel_details_level2_llm_train.csv"),
                   "--database-path", str(db)]) == 0
    shutil.copy(FIXTURES / "ascend" / "op_mapping_vllm0.18.0_torch2.9.0_cann8.5.yaml", db / "op_mapping.yaml")
    command = documented("python benchmarks/lookup_accuracy.py --database-path DIR --roofline --policy")
    args = shlex.split(command.replace("DIR", str(db)))[1:] + ["--kernel-types", "MatMulV3,Mul"]  # two, to stay quick
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["kernel", "type", "method"]
    assert any(line.startswith("MatMulV3") and " policy " in line for line in lines)
    assert any(line.startswith("Mul ") and "interpolated" in line for line in lines)


def test_perfdb_peaks(sh: Shell, tmp_path: Path) -> None:
    """Measured on this machine's CPU (the default backend where no accelerator is present), with
    small GEMMs so that the test stays quick."""
    done = sh.perfdb(documented("perfdb peaks --database-path DIR").replace("DIR", str(tmp_path))
                     + " --backend cpu --sizes 128 --copy-mib 8 --repeats 2")
    assert done.ret == 0, done.out
    assert "GEMM TFLOP/s BF16" in done.out and (tmp_path / "device_peaks.yaml").is_file()


def test_perfdb_grid(sh: Shell, project: Path, tmp_path: Path) -> None:
    directory = sample_copy(project, tmp_path / "db")
    before = sum(len(rows(p)) for p in directory.glob("*.csv"))
    command = documented("perfdb grid --data-dir DIR --target-models qwen3-32b,dsv3 --rows 1000 --seed 0 --max-hbm-gb 32")
    done = sh.perfdb(command.replace("DIR", str(directory)))
    assert done.ret == 0, done.out
    after = sum(len(rows(p)) for p in directory.glob("*.csv"))
    assert before < after <= before + 1000 * 13


COMM_HEADER = "message_bytes,num_devices,dtype,topology_tier,Duration(us),bandwidth_gbps"
COMM_ROWS = ("1024,2,DT_BF16,1,30.5,0.0336", "1048576,2,DT_BF16,1,410.0,2.557")


def test_perfdb_comm_tools(sh: Shell, tmp_path: Path) -> None:
    reference, new = tmp_path / "reference", tmp_path / "new"
    for directory in (reference, new):
        directory.mkdir()
        (directory / "hcom_allReduce_.csv").write_text("\n".join([COMM_HEADER, *COMM_ROWS]) + "\n")
    command = documented("perfdb validate-comm REFERENCE_DIR NEW_DIR --threshold 0.1 --gate")
    done = sh.perfdb(command.replace("REFERENCE_DIR", str(reference)).replace("NEW_DIR", str(new)))
    assert done.ret == 0, done.out
    slower = COMM_ROWS[1].replace("410.0", "500.0")  # 22 % slower: the gate fails
    (new / "hcom_allReduce_.csv").write_text("\n".join([COMM_HEADER, COMM_ROWS[0], slower]) + "\n")
    assert sh.perfdb(command.replace("REFERENCE_DIR", str(reference)).replace("NEW_DIR", str(new))).ret == 1

    done = sh.perfdb(documented("perfdb upgrade-comm database/data --dry-run"))
    assert done.ret == 0, done.out


MATMUL_HEADER = "OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats"
MATMUL_GOOD = 'dynamic,AI_CORE,"""32,64;64,16""",FLOAT;FLOAT,ND;ND,"""32,16""",FLOAT,ND'
MATMUL_MALFORMED = 'dynamic,AI_CORE,"""32,x;64,16""",FLOAT;FLOAT,ND;ND,"""32,16""",FLOAT,ND'


def test_perfdb_restore_quarantine(sh: Shell, tmp_path: Path) -> None:
    directory = tmp_path / "db"
    directory.mkdir()
    (directory / "MatMulV2.csv").write_text("\n".join([MATMUL_HEADER, MATMUL_GOOD, MATMUL_MALFORMED]) + "\n")
    sh.pytest(f"pytest bench --perf-database-path {directory}").assert_outcomes(passed=1, skipped=1)
    quarantine = directory / "MatMulV2.quarantine.csv"
    assert quarantine.is_file() and len(rows(directory / "MatMulV2.csv")) == 1

    dry = sh.perfdb(documented("perfdb restore-quarantine DIR --kernel-type MatMulV2 --dry-run").replace("DIR", str(directory)))
    assert dry.ret == 0 and quarantine.is_file(), dry.out
    done = sh.perfdb(documented("perfdb restore-quarantine DIR").replace("DIR", str(directory)))
    assert done.ret == 0, done.out
    assert not quarantine.exists()
    assert [r["Input Shapes"] for r in rows(directory / "MatMulV2.csv")] == ['"32,64;64,16"', '"32,x;64,16"']


def test_perfdb_fia_runtime(sh: Shell, project: Path, tmp_path: Path) -> None:
    directory = tmp_path / "db"
    directory.mkdir()
    shutil.copy(FIXTURES / "ascend" / "db_row_FusedInferAttentionScore.csv", directory / "FusedInferAttentionScore.csv")
    (project / "fia_runtime_metadata.jsonl").write_text(json.dumps(decode_call([2000] * 128)) + "\n")
    done = sh.perfdb(documented("perfdb fia-runtime DIR --jsonl fia_runtime_metadata.jsonl").replace("DIR", str(directory)))
    assert done.ret == 0, done.out
    column = "Runtime actual_seq_lengths_kv_values"
    filled = [r for r in rows(directory / "FusedInferAttentionScore.csv") if r.get(column)]
    assert filled and all(r[column] == ",".join(["2000"] * 128) for r in filled)  # the decode rows


# ------------------------------------------------------------------------------- (c) absent hardware


def _long_options(help_text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", help_text))


def test_commands_that_need_absent_hardware_parse(sh: Shell) -> None:
    # a candidate file is imported when the options are parsed, and compiled_swiglu.py calls
    # torch.compile: its compiler, imported once here, stays loaded across the in-process runs
    import torch._inductor.compile_fx  # noqa: F401

    helped = sh.pytest("pytest --help")
    assert helped.ret == 0
    pytest_options = _long_options(helped.stdout.str())
    markers = sh.pytest("pytest --markers").stdout.str()
    for command, reason in NEEDS_HARDWARE.items():
        assert reason
        args = shlex.split(command)
        if args[0] == "torchrun":
            from torch.distributed.run import get_args_parser  # torchrun's own parser

            launch = get_args_parser().parse_args(args[1:])  # exits (fails the test) on an unknown launcher option
            assert launch.module and launch.training_script == "pytest", command
            args = ["pytest", *launch.training_script_args]
        assert args[0] == "pytest", command
        unknown = {a.split("=")[0] for a in args if a.startswith("--")} - pytest_options
        assert not unknown, f"{command}: pytest --help lists no {sorted(unknown)}"
        for index, arg in enumerate(args):
            if arg == "-m":
                assert f"@pytest.mark.{args[index + 1]}:" in markers, command
            if arg.endswith(".py"):
                assert (ROOT / arg).is_file(), f"{command}: no {arg}"
        # pytest parses the whole line (option names, choices, values) before it prints its help
        parsed = sh.pytest(shlex.join(args) + " --help")
        assert parsed.ret == 0, f"{command}:\n{parsed.stderr.str()}"
