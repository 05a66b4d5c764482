"""``perfdb grid`` / ``python -m perf_plugin.grid``: options, derived paths, errors, output."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from perf_plugin.cli import main
from perf_plugin.database.schema import IDENTITY_COLUMNS, ROW_ORIGIN

REPO = Path(__file__).resolve().parents[1]
KERNEL_DETAILS = Path(__file__).parent / "fixtures" / "ascend" / "kernel_details_level2_llm_train.csv"
QWEN3_32B_PAIRS = {
    (10240, 5120), (5120, 8192), (51200, 5120), (5120, 25600), (151936, 5120),
    (5120, 5120), (5120, 4096), (25600, 5120), (5120, 12800), (75968, 5120),
    (2560, 5120), (5120, 2048), (12800, 5120), (5120, 6400), (37984, 5120),
    (1280, 5120), (5120, 1024), (6400, 5120), (5120, 3200), (18992, 5120),
    (768, 5120), (5120, 512), (3200, 5120), (5120, 1600), (9496, 5120),
}


def matmul_database(directory: Path) -> Path:
    """MatMulV2.csv with the identity cells of the fixture's profiled MatMulV2 kernels."""
    directory.mkdir(parents=True)
    with KERNEL_DETAILS.open(newline="", encoding="utf-8") as handle:
        keys = {tuple(r[c] for c in IDENTITY_COLUMNS) for r in csv.DictReader(handle) if r["Type"] == "MatMulV2"}
    path = directory / "MatMulV2.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(IDENTITY_COLUMNS)
        writer.writerows(sorted(keys))
    return path


def generated_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [r for r in csv.DictReader(handle) if r.get(ROW_ORIGIN, "").startswith("grid:")]


def test_target_models_restrict_matmul_rows_to_the_models_pairs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = matmul_database(tmp_path / "db")
    code = main(["grid", "--data-dir", str(tmp_path / "db"), "--target-models", "qwen3-32b", "--rows", "0"])
    out = capsys.readouterr().out
    assert code == 0
    rows = generated_rows(path)
    pairs = set()
    for row in rows:
        (m, k), (n, k2) = (tuple(map(int, s.split(","))) for s in row["Input Shapes"].strip('"').split(";"))
        assert k == k2 and row[ROW_ORIGIN] == "grid:gemm:qwen3-32b"
        pairs.add((n, k))
    assert pairs == QWEN3_32B_PAIRS
    assert f"database directory {tmp_path / 'db'}\n" in out
    assert f"wrote {len(rows)} rows to 1 CSV(s)" in out
    assert out.splitlines()[2].split()[0] == "MatMulV2"


def test_derived_directory_is_printed_and_used(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main([
        "grid", "--database-root", str(tmp_path), "--vllm-version", "0.18.0", "--torch-version", "2.9.0",
        "--cann-version", "8.5", "--target-models", "llama-3.1-8b", "--kernel-types", "RmsNorm", "--rows", "7",
    ])
    expected = tmp_path / "ATLAS_800_A3_752T_128G_DIE" / "vllm_ascend" / "vllm0.18.0_torch2.9.0_cann8.5"
    assert code == 0
    assert f"database directory {expected} (derived)" in capsys.readouterr().out
    assert len(generated_rows(expected / "RmsNorm.csv")) == 7


def test_dry_run_prints_counts_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = matmul_database(tmp_path / "db")
    before = path.read_bytes()
    code = main(["grid", "--data-dir", str(tmp_path / "db"), "--target-models", "dsv3", "--dry-run",
                 "--kernel-types", "MatMulV2,BatchMatMulV2", "--rows", "5"])
    out = capsys.readouterr().out
    assert code == 0
    assert path.read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "db").iterdir()) == ["MatMulV2.csv"]
    assert "would write 10 rows to 2 CSV(s)" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--target-models", "qwen3-32b,gpt-5"],
            "unknown model 'gpt-5'; known models: qwen3-32b; qwen3-235b-a22b (alias qwen3-235b); "
            "deepseek-v3 (alias dsv3); llama-3.1-8b (alias llama3.1-8b); llama-3.1-70b (alias llama3.1-70b)",
        ),
        (["--kernel-types", "Conv2D"], "kernel type 'Conv2D' has no grid route in config.yaml; routed: "),
        (["--kernel-types", "../x"], "kernel type '../x' is not a plain name"),
        (["--rows", "-1"], "--rows must be 0 (no limit) or positive, got -1"),
        (["--max-hbm-gb", "0"], "--max-hbm-gb must be positive, got 0.0"),
    ],
)
def test_user_mistakes_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    matmul_database(tmp_path / "db")
    code = main(["grid", "--data-dir", str(tmp_path / "db"), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("perfdb grid: error: ") and err.count("\n") == 1
    assert message in err


def test_a_csv_without_shape_columns_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "Add.csv").write_text("Shapes,Average Duration(us)\n4096,1.0\n", encoding="utf-8")
    assert main(["grid", "--data-dir", str(tmp_path / "db")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'db' / 'Add.csv'}, column 'Input Shapes': missing column" in err


def test_no_directory_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grid", "--vllm-version", "0.18.0"]) == 2
    assert "give --data-dir, or --vllm-version, --torch-version and --cann-version" in capsys.readouterr().err


def test_missing_directory_without_kernel_types(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grid", "--data-dir", str(tmp_path / "nothing")]) == 2
    assert "database directory does not exist" in capsys.readouterr().err
    assert not (tmp_path / "nothing").exists()


def test_python_dash_m_runs_the_subcommand(tmp_path: Path) -> None:
    path = matmul_database(tmp_path / "db")
    result = subprocess.run(
        [sys.executable, "-m", "perf_plugin.grid", "--data-dir", str(tmp_path / "db"), "--target-models",
         "llama-3.1-70b", "--rows", "3", "--seed", "5"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "wrote 3 rows to 1 CSV(s)" in result.stdout
    assert len(generated_rows(path)) == 3
    listing = subprocess.run([sys.executable, "-m", "perf_plugin.grid", "--list-models"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
    assert "deepseek-v3" in listing and "tp 1,4,8,16, ep 8,16,32,64" in listing


REPRODUCE = Path(__file__).resolve().parent.parent / "reproduce"
# the parts of reproduce/lookup_accuracy_cuda.sh and the rows its header says each writes
LOOKUP_GRIDS = [
    ("lookup_grid_dense.yaml", "MatMulV2,aten._scaled_mm", "llama-3.1-8b,qwen3-32b,llama-3.1-70b", 6096),
    ("lookup_grid_dense.yaml", "RmsNorm,Add,SwiGlu", "llama-3.1-8b,qwen3-32b,llama-3.1-70b", 720),
    ("lookup_grid_dense.yaml", "FusedInferAttentionScore", "llama-3.1-8b", 1160),
    ("lookup_grid.yaml", "FusedInferAttentionScore", "llama-3.1-8b", 988),
]


@pytest.mark.parametrize("config,kernel_types,models,rows", LOOKUP_GRIDS, ids=[g[1] + "@" + g[0] for g in LOOKUP_GRIDS])
def test_the_lookup_accuracy_grids_write_the_rows_their_script_names(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str, kernel_types: str, models: str,
        rows: int) -> None:  # fmt: skip
    assert main(["grid", "--config", str(REPRODUCE / config), "--database-path", str(tmp_path), "--rows", "100000",
                 "--max-hbm-gb", "40", "--kernel-types", kernel_types, "--target-models", models, "--dry-run"]) == 0
    assert f"would write {rows} rows" in capsys.readouterr().out
