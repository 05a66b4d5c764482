"""Generated rows: real profiler format, inherited structure, de-duplication, sampling, safety."""

from __future__ import annotations

import csv
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from perf_plugin.database.schema import (
    IDENTITY_COLUMNS,
    INPUT_STRIDES,
    INPUT_VALUES,
    INPUT_VALUES_SOURCE,
    OP_ARGUMENTS,
    ROW_ORIGIN,
)
from perf_plugin.replay.registry import signature_of
from perf_plugin.grid.config import load_config
from perf_plugin.grid.memory import budget_bytes
from perf_plugin.grid.models import MODELS, find_model
from perf_plugin.grid.runner import GridRequest, KernelReport, run_grid
from perf_plugin.replay.registry import get_replay
from perf_plugin.replay.tensors import kernel_row_from_cells
from perf_plugin.database.shapes import parse_shape_cell
from tests.kernels.support import kernel_row, replay_of

FIXTURES = Path(__file__).parent / "fixtures" / "ascend"
KERNEL_DETAILS = FIXTURES / "kernel_details_level2_llm_train.csv"
FIA_ROWS = FIXTURES / "db_row_FusedInferAttentionScore.csv"
PROFILED_TYPES = ("MatMulV2", "MatMulV3", "Add", "Mul", "Muls", "Cast", "RmsNorm", "SwiGlu", "TensorMove",
                  "Slice", "ConcatD", "GatherV2", "RotaryPositionEmbedding")
# INPUT_VALUES and its source: expert loads; INPUT_STRIDES and OP_ARGUMENTS: aten._scaled_mm's pattern;
# the runtime lengths: FusedInferAttentionScore's KV length distributions
EXTRA = ("avg_seq_len", ROW_ORIGIN, INPUT_VALUES, INPUT_VALUES_SOURCE, INPUT_STRIDES, OP_ARGUMENTS,
         "Runtime actual_seq_lengths_values", "Runtime actual_seq_lengths_kv_values")


def read_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    with path.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    return rows[0], rows[1:]


def read_dicts(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def build_database(directory: Path, kernel_types=PROFILED_TYPES, row_origin: bool = False) -> None:
    """Per-kernel CSVs with the identity cells of the fixture's profiled kernels (one row per shape)."""
    directory.mkdir(parents=True, exist_ok=True)
    durations: dict[str, dict[tuple[str, ...], list[float]]] = defaultdict(dict)
    for row in read_dicts(KERNEL_DETAILS):
        key = tuple(row[c] for c in IDENTITY_COLUMNS)
        durations[row["Type"]].setdefault(key, []).append(float(row["Duration(us)"]))
    for kernel_type in kernel_types:
        with (directory / f"{kernel_type}.csv").open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            origin = [ROW_ORIGIN] if row_origin else []
            writer.writerow(list(IDENTITY_COLUMNS) + ["Profiling Average Duration(us)"] + origin)
            for key, values in durations[kernel_type].items():
                writer.writerow(list(key) + [f"{sum(values) / len(values):.3f}"] + [""] * len(origin))
    shutil.copy(FIA_ROWS, directory / "FusedInferAttentionScore.csv")


def grid(directory: Path, models: str | None, kernel_types: tuple[str, ...] = (), rows: int = 1000,
         seed: int = 0, max_gb: float = 32.0) -> dict[str, KernelReport]:
    names = tuple(find_model(m) for m in models.split(",")) if models else ()
    request = GridRequest(
        directory=directory,
        config=load_config(),
        models=names or MODELS,
        restricted=bool(names),
        rows=rows,
        seed=seed,
        budget=budget_bytes(max_gb),
        kernel_types=kernel_types,
    )
    return {r.kernel_type: r for r in run_grid(request)}


def generated(path: Path) -> list[dict[str, str]]:
    return [r for r in read_dicts(path) if r.get(ROW_ORIGIN, "").startswith("grid:")]


@pytest.fixture(scope="module")
def expanded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database built from the real fixtures, expanded for three models over every routed type."""
    directory = tmp_path_factory.mktemp("grid") / "db"
    build_database(directory)
    grid(directory, "qwen3-32b,dsv3,qwen3-235b-a22b", tuple(load_config().kernels), rows=60)
    return directory


def test_every_generated_row_parses_and_passes_the_replay_checks(expanded: Path) -> None:
    checked = 0
    for kernel_type in load_config().kernels:
        rows = generated(expanded / f"{kernel_type}.csv")
        assert rows, kernel_type
        replay = get_replay(kernel_type)
        for row in rows:
            kernel_row = kernel_row_from_cells(kernel_type, row)
            if replay is not None:
                replay.check(kernel_row)
                checked += 1
            for column, value in row.items():
                if column not in IDENTITY_COLUMNS and column not in EXTRA:
                    assert value == "", (kernel_type, column)
            assert row["OP State"] == "dynamic"
    assert checked > 0


def test_rows_inherit_the_profiled_structure_and_quote_style(expanded: Path) -> None:
    text = (expanded / "MatMulV2.csv").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.endswith(("qwen3-32b", "deepseek-v3", "qwen3-235b-a22b"))]
    assert lines and all(line.startswith('dynamic,AI_CORE,"""') for line in lines)
    for row in generated(expanded / "MatMulV2.csv"):
        assert (row["Input Data Types"], row["Input Formats"]) == ("DT_BF16;DT_BF16", "ND;ND")
        assert (row["Output Data Types"], row["Output Formats"]) == ("DT_BF16", "ND")
        a, b = (tuple(map(int, s.split(","))) for s in row["Input Shapes"].strip('"').split(";"))
        assert tuple(map(int, row["Output Shapes"].strip('"').split(","))) == (a[0], b[0])
        assert a[1] == b[1]
    # Cast: the profiled BF16 -> FLOAT row is 3-D with format NCL; 2-D rows get ND
    for row in generated(expanded / "Cast.csv"):
        assert (row["Input Data Types"], row["Output Data Types"]) == ("DT_BF16", "FLOAT")
        assert (row["Input Formats"], row["Output Formats"]) == ("ND", "ND")
    # Add: the BF16 residual-add row (NCL;NCL, output ND)
    for row in generated(expanded / "Add.csv"):
        cells = (row["Input Data Types"], row["Input Formats"], row["Output Formats"])
        assert cells == ("DT_BF16;DT_BF16", "ND;ND", "ND")


def _slots(cell: str) -> list[str]:
    return cell.strip('"').split(";")


def test_fused_attention_rows_keep_the_31_slot_profiler_format(expanded: Path) -> None:
    profiled = read_dicts(FIA_ROWS)
    tnd_decode, mla_decode = profiled[0], profiled[6]
    rows = generated(expanded / "FusedInferAttentionScore.csv")
    seen_layouts = set()
    for row in rows:
        shapes = _slots(row["Input Shapes"])
        assert len(shapes) == len(_slots(row["Input Data Types"])) == len(_slots(row["Input Formats"])) == 31
        present = [i for i, s in enumerate(shapes) if s]
        dims = [tuple(map(int, s.split(","))) if s else None for s in shapes]
        out = _slots(row["Output Shapes"])
        assert len(out) == 2 and out[1] == "" and row["Output Data Types"] == "DT_BF16;FLOAT"
        kv_len = int(row["avg_seq_len"])
        if present == [0, 1, 2, 4, 5, 6, 14]:  # TND, paged KV cache (decode)
            seen_layouts.add("tnd_decode")
            assert row["Input Data Types"] == tnd_decode["Input Data Types"]
            assert row["Input Formats"] == tnd_decode["Input Formats"]
            (t, heads, head_dim), (blocks, block, kv_width) = dims[0], dims[1]
            batch, max_blocks = dims[14]
            assert dims[5] == dims[6] == (batch,) and dims[4] == (2048, 2048)
            # per-request KV lengths of a distribution other than even (tests/test_grid_kv_lengths.py)
            lengths = [int(n) for n in row["Runtime actual_seq_lengths_kv_values"].split(",") if n] or [kv_len] * batch
            assert len(lengths) == batch and sum(lengths) == batch * kv_len
            assert blocks == sum(-(-n // block) for n in lengths) and max_blocks == -(-max(lengths) // block)
            assert t % batch == 0 and t // batch <= kv_len
            tp = 64 // heads if "qwen3-32b" in row[ROW_ORIGIN] else None
            if tp is not None:  # Qwen3-32B: 8 KV heads, one replicated head per rank beyond tp 8
                assert kv_width == (8 // tp if tp <= 8 else 1) * head_dim
        elif present == [0, 1, 2, 6, 14, 24, 25]:  # MLA decode, BNSD in, NBSD out
            seen_layouts.add("mla_decode")
            assert row[ROW_ORIGIN] == "grid:attention:deepseek-v3"
            assert row["Input Data Types"] == mla_decode["Input Data Types"]
            assert row["Input Formats"] == mla_decode["Input Formats"]
            batch, heads, q_len, rank = dims[0]
            assert rank == 512 and dims[24] == (batch, heads, q_len, 64)
            assert tuple(map(int, out[0].split(","))) == (heads, batch, q_len, 512)
        elif present == [0, 1, 2, 4, 5, 6]:  # TND prefill
            seen_layouts.add("prefill")
            t = dims[0][0]
            assert t == dims[5][0] * kv_len
    assert seen_layouts == {"tnd_decode", "mla_decode", "prefill"}


def test_default_structure_for_a_kernel_type_without_source_rows(expanded: Path) -> None:
    text = (expanded / "GroupedMatmul.csv").read_text(encoding="utf-8")
    header, rows = read_rows(expanded / "GroupedMatmul.csv")
    assert header == list(IDENTITY_COLUMNS) + [INPUT_VALUES, INPUT_VALUES_SOURCE, ROW_ORIGIN]
    assert '"""' not in text  # a new file uses plain shape cells
    for row in rows:
        cells = dict(zip(header, row))
        assert (cells["OP State"], cells["Accelerator Core"]) == ("dynamic", "AI_CORE")
        assert cells["Input Data Types"] == "DT_BF16;DT_BF16;" + "DT_UNDEFINED;" * 5 + "INT64;DT_UNDEFINED"
        assert cells["Input Formats"] == "ND;ND;" + "NULL;" * 5 + "ND;NULL"
        x, w = (tuple(map(int, s.split(","))) for s in cells["Input Shapes"].split(";")[:2])
        group_list = int(cells["Input Shapes"].split(";")[7])
        assert w[0] == group_list and x[1] == w[1]
        assert tuple(map(int, cells["Output Shapes"].split(","))) == (x[0], w[2])


def test_every_grouped_gemm_shape_is_written_once_per_expert_load(expanded: Path) -> None:
    header, rows = read_rows(expanded / "GroupedMatmul.csv")
    by_shape: dict[str, dict[str, tuple[int, ...]]] = {}
    for row in rows:
        cells = dict(zip(header, row))
        ends = parse_shape_cell(cells[INPUT_VALUES])[7]
        assert ends is not None
        sizes = [b - a for a, b in zip((0, *ends), ends)]
        m, experts = int(cells["Input Shapes"].split(",")[0]), int(cells["Input Shapes"].split(";")[7])
        assert len(sizes) == experts and sum(sizes) == m and min(sizes) >= 0
        by_shape.setdefault(cells["Input Shapes"], {})[cells[INPUT_VALUES_SOURCE]] = tuple(sizes)
        replay_of("GroupedMatmul").check(kernel_row("GroupedMatmul", cells))  # the replay takes the groups
    loads = {"grid: balanced", "grid: zipf 0.5", "grid: zipf 1", "grid: zipf 1.5", "grid: max_mean 2", "grid: max_mean 4"}
    # the fixture samples the generated rows: every load is there, each shape has some of them
    assert set().union(*by_shape.values()) == loads
    for found in by_shape.values():
        if "grid: balanced" in found:
            assert max(found["grid: balanced"]) - min(found["grid: balanced"]) <= 1
        if "grid: zipf 1" in found:
            assert list(found["grid: zipf 1"]) == sorted(found["grid: zipf 1"], reverse=True)


def test_documented_default_for_a_route_without_core(tmp_path: Path) -> None:
    config = tmp_path / "grid.yaml"
    config.write_text(
        "grids: {tokens: [3]}\n"
        "kernels:\n"
        "  Neg:\n"
        "    generator: elementwise\n"
        "    patterns: [{over: {m: tokens}, dtype: FLOAT16, inputs: [[m, hidden]], outputs: [[m, hidden]]}]\n",
        encoding="utf-8",
    )
    request = GridRequest(tmp_path / "db", load_config(config), (find_model("llama-3.1-8b"),), True, 0, 0,
                          budget_bytes(1), ("Neg",))
    assert run_grid(request)[0].written == 1
    assert (tmp_path / "db" / "Neg.csv").read_text(encoding="utf-8") == (
        "OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Output Shapes,"
        "Output Data Types,Output Formats,Row Origin\n"
        "dynamic,AI_CORE,\"3,4096\",FLOAT16,ND,\"3,4096\",FLOAT16,ND,grid:elementwise:llama-3.1-8b\n"
    )


def test_existing_rows_stay_a_byte_identical_prefix(tmp_path: Path) -> None:
    directory = tmp_path / "db"
    build_database(directory, ("MatMulV2", "Add"), row_origin=True)
    before = {name: (directory / f"{name}.csv").read_bytes() for name in ("MatMulV2", "Add")}
    reports = grid(directory, "llama-3.1-8b", ("MatMulV2", "Add"), rows=30)
    for name, old in before.items():
        new = (directory / f"{name}.csv").read_bytes()
        assert reports[name].written == min(30, reports[name].available) > 0
        assert new.startswith(old) and len(new) > len(old)


def test_a_missing_origin_column_is_added_without_changing_values(tmp_path: Path) -> None:
    directory = tmp_path / "db"
    build_database(directory, ("RmsNorm",))
    old_header, old_rows = read_rows(directory / "RmsNorm.csv")
    grid(directory, "llama-3.1-8b", ("RmsNorm",), rows=5)
    header, rows = read_rows(directory / "RmsNorm.csv")
    assert header == old_header + [ROW_ORIGIN]
    assert [row[:-1] for row in rows[: len(old_rows)]] == old_rows
    assert all(row[-1] == "" for row in rows[: len(old_rows)])
    assert [row[-1] for row in rows[len(old_rows):]] == ["grid:norm:llama-3.1-8b"] * 5


def test_rows_already_in_the_file_are_not_generated_again(tmp_path: Path) -> None:
    directory = tmp_path / "db"
    directory.mkdir()
    # Qwen3-32B qkv_proj at tp 8 for one token, recorded with the weight as [K, N]
    (directory / "MatMulV2.csv").write_text(
        "Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats,"
        "Average Duration(us)\n"
        '"1,5120;5120,1280",DT_BF16;DT_BF16,ND;ND,"1,1280",DT_BF16,ND,9.5\n',
        encoding="utf-8",
    )
    reports = grid(directory, "qwen3-32b", ("MatMulV2",), rows=0)
    report = reports["MatMulV2"]
    tokens = len(load_config().grids["tokens"])
    assert report.in_file == 1
    assert report.available == report.written == 25 * tokens - 1  # 25 (N, K) pairs over 5 TP sizes
    rows = read_dicts(directory / "MatMulV2.csv")
    signatures = [signature_of("MatMulV2", r) for r in rows]
    assert len(set(signatures)) == len(signatures)
    # an older database without OP State / Accelerator Core keeps its columns
    assert list(rows[0]) == ["Input Shapes", "Input Data Types", "Input Formats", "Output Shapes",
                             "Output Data Types", "Output Formats", "Average Duration(us)", ROW_ORIGIN]
    assert rows[1]["Input Shapes"] == "1,5120;10240,5120"  # plain style, like the file


def test_same_seed_same_rows_different_seed_different_sample(tmp_path: Path) -> None:
    files = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        directory = tmp_path / name
        build_database(directory, ("MatMulV2",))
        report = grid(directory, "qwen3-32b", ("MatMulV2",), rows=20, seed=seed)["MatMulV2"]
        assert report.written == 20 and report.available > 20
        files[name] = (directory / "MatMulV2.csv").read_bytes()
    assert files["a"] == files["b"]
    assert files["a"] != files["c"]
    full = tmp_path / "full"
    build_database(full, ("MatMulV2",))
    grid(full, "qwen3-32b", ("MatMulV2",), rows=0)
    everything = {r["Input Shapes"] for r in generated(full / "MatMulV2.csv")}
    for name in files:
        sample = {r["Input Shapes"] for r in generated(tmp_path / name / "MatMulV2.csv")}
        assert len(sample) == 20 and sample <= everything


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "db"
    build_database(directory, ("MatMulV2",))
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    request = GridRequest(directory, load_config(), (find_model("qwen3-32b"),), True, 10, 0, budget_bytes(32),
                          ("MatMulV2", "GroupedMatmul"), dry_run=True)
    reports = run_grid(request)
    assert [r.written for r in reports] == [10, 0]
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before


def test_expert_loads_sum_to_the_rows_and_skew_as_stated() -> None:
    from perf_plugin.grid.expert_load import parse_load

    assert parse_load("balanced").sizes(10, 4) == (3, 3, 2, 2)
    zipf = parse_load("zipf 1.0").sizes(1024, 8)
    assert sum(zipf) == 1024 and list(zipf) == sorted(zipf, reverse=True)
    assert abs(zipf[0] / (1024 / 8) - 8 / sum(1 / (i + 1) for i in range(8))) < 0.01  # ~2.94x the mean
    top = parse_load("max_mean 4").sizes(1024, 8)
    assert top[0] == 512 and sum(top) == 1024 and len(set(top[1:])) <= 2
    assert parse_load("max_mean 100").sizes(16, 4) == (16, 0, 0, 0)  # capped at every row
    for bad in ("zipf", "zipf -1", "max_mean 0.5", "uniform 2"):
        with pytest.raises(ValueError, match="expert load"):
            parse_load(bad)
