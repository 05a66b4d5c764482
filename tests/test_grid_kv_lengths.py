"""``perfdb grid`` writes FusedInferAttentionScore rows once per KV length distribution.

The arithmetic of the distributions, the cells of the rows they give (paged decode: per-request
KV lengths and a block table and caches resized for them; TND prefill: cumulative query and KV
lengths, shapes unchanged), that the replay reads back exactly the written lengths and replays a
row on the CPU, the memory budget of each variant, and the ``--dry-run`` counts.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from perf_plugin.cli import main as perfdb
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.schema import IDENTITY_COLUMNS, INPUT_VALUES_SOURCE, ROW_ORIGIN
from perf_plugin.database.table import CsvTable
from perf_plugin.grid.config import DEFAULT_CONFIG, load_config
from perf_plugin.grid.length_distribution import parse_distribution, parse_distributions, with_kv_lengths
from perf_plugin.grid.models import ModelConfig, find_model
from perf_plugin.grid.runner import GridRequest, KernelReport, plan_rows, run_grid
from perf_plugin.replay.kernels._fia_plan import fia_plan
from perf_plugin.replay.tensors import kernel_row_from_cells
from tests.test_grid_memory import independent_bytes
from tests.test_plugin import BENCH_TEST, _profiler_modules_loaded  # noqa: F401

FIA = "FusedInferAttentionScore"
Q_VALUES, KV_VALUES = "Runtime actual_seq_lengths_values", "Runtime actual_seq_lengths_kv_values"
LABELS = {"grid: kv even", "grid: kv spread 4", "grid: kv max_mean 4"}  # the shipped route's list
R = 4  # the shipped spread and max_mean ratio
GIB = 1 << 30


# ------------------------------------------------------------------ the distributions
@pytest.mark.parametrize(("text", "total", "parts", "minimum", "expected"), [
    ("even", 10, 4, 1, (3, 3, 2, 2)),  # the remainder to the first requests
    ("spread 3", 12, 3, 1, (6, 4, 2)),  # mean 4, shortest 2 * 4 / (1 + 3) = 2, longest 6
    ("spread 4", 512, 4, 1, (205, 154, 102, 51)),  # 204.8, 153.6, 102.4, 51.2: largest remainders
    ("max_mean 4", 1280, 8, 1, (640, 92, 92, 92, 91, 91, 91, 91)),  # the rest share 640 / 7 = 91.43
    ("max_mean 4", 512, 4, 1, (509, 1, 1, 1)),  # 4x the mean is every token: capped
    ("max_mean 100", 512, 4, 4, (500, 4, 4, 4)),  # capped so the others keep their minimum
    ("spread 4", 20, 4, 4, (7, 5, 4, 4)),  # 8, 6, 4, 2: the 2, then the 3.56 raised to 4
    ("spread 4", 1000, 1, 1, (1000,)),
    ("max_mean 4", 4, 4, 1, (1, 1, 1, 1)),
])  # fmt: skip
def test_lengths_by_hand(text: str, total: int, parts: int, minimum: int, expected: tuple[int, ...]) -> None:
    assert parse_distribution(text).lengths(total, parts, minimum) == expected


@pytest.mark.parametrize("text", ["even", "spread 1.5", "spread 4", "spread 16", "max_mean 2", "max_mean 4",
                                  "max_mean 64"])  # fmt: skip
def test_lengths_keep_the_total_the_bounds_and_the_shape(text: str) -> None:
    distribution = parse_distribution(text)
    ratio = float(text.split()[1]) if " " in text else 1.0
    for parts in (1, 2, 3, 4, 7, 8, 64, 256):
        for mean in (1, 5, 128, 131, 4096):
            for minimum in {1, min(mean, 4)}:
                lengths = distribution.lengths(parts * mean, parts, minimum)
                assert len(lengths) == parts and sum(lengths) == parts * mean and min(lengths) >= minimum
                exact = [float(mean)] * parts
                if text.startswith("spread") and parts > 1:
                    shortest = 2 * mean / (1 + ratio)
                    exact = [ratio * shortest - i * (ratio - 1) * shortest / (parts - 1) for i in range(parts)]
                elif text.startswith("max_mean") and parts > 1:
                    top = min(ratio * mean, parts * mean - (parts - 1) * minimum)
                    exact = [top] + [(parts * mean - top) / (parts - 1)] * (parts - 1)
                if min(exact) >= minimum:  # the minimum does not bind: the lengths are the exact ones, rounded
                    assert all(abs(n - x) < 1 for n, x in zip(lengths, exact)), (text, parts, mean, lengths)
                assert list(lengths) == sorted(lengths, reverse=True)  # the longest request first


def test_spread_ratio_and_max_mean_share_for_large_lengths() -> None:
    spread = parse_distribution("spread 4").lengths(64 * 4096, 64)
    assert abs(max(spread) / min(spread) - 4) < 0.01 and len(set(b - a for a, b in zip(spread[1:], spread))) <= 2
    top = parse_distribution("max_mean 4").lengths(64 * 4096, 64)
    assert top[0] == 4 * 4096 and max(top[1:]) - min(top[1:]) <= 1


def test_labels_and_parse_errors() -> None:
    assert [parse_distribution(t).label for t in ("even", " spread 4 ", "max_mean 1.5", "spread 4.0")] == [
        "even", "spread 4", "max_mean 1.5", "spread 4"]  # fmt: skip
    for bad in ("spread", "spread 0.5", "max_mean x", "uniform 2", "even 2", "spread inf", "spread nan", 4, ""):
        with pytest.raises(ValueError, match="KV length distribution"):
            parse_distribution(bad)
    with pytest.raises(ValueError, match="kv_lengths: expected a list"):
        parse_distributions("even")
    with pytest.raises(ValueError, match="3 tokens cannot make 4 requests"):
        parse_distribution("even").lengths(3, 4)


def _route_config(tmp_path: Path, options: str) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(f"kernels:\n  {FIA}:\n    generator: attention\n    options: {options}\n"
                    "    patterns: [{inputs: [[1, 1]], outputs: [[1, 1]]}]\n", encoding="utf-8")  # fmt: skip
    return path


@pytest.mark.parametrize(("options", "message"), [
    ("{kv_lengths: [even, uniform 2]}", "options: KV length distribution 'uniform 2'"),
    ("{kv_lengths: even}", "options: kv_lengths: expected a list"),
    ("{kv_length: [even]}", "options: generator 'attention' takes kv_lengths (got kv_length)"),
])  # fmt: skip
def test_config_errors_name_the_route(tmp_path: Path, options: str, message: str) -> None:
    with pytest.raises(DatabaseError, match=re.escape(f"kernels.{FIA}.{message}")):
        load_config(_route_config(tmp_path, options))


# ------------------------------------------------------------------ the generated rows
def _plan(kernel_type: str, models: tuple[ModelConfig, ...], budget: int, config: Any = None) -> tuple[
        list[dict[str, str]], KernelReport]:  # fmt: skip
    request = GridRequest(Path("unused"), config or load_config(), models, True, 0, 0, budget)
    report = KernelReport(kernel_type, Path("unused"), created=True)
    table = CsvTable.new(list(IDENTITY_COLUMNS) + ["avg_seq_len", ROW_ORIGIN])
    return plan_rows(kernel_type, request.config.kernels[kernel_type], table, request, report), report


@pytest.fixture(scope="module")
def shipped_rows() -> list[dict[str, str]]:
    """Every FIA row of the shipped config for a GQA and an MLA model."""
    rows, _ = _plan(FIA, (find_model("qwen3-32b"), find_model("deepseek-v3")), 32 * GIB)
    return rows


def _dims(cell: str) -> list[tuple[int, ...] | None]:
    return [tuple(map(int, s.split(","))) if s else None for s in cell.strip('"').split(";")]


def _ints(cell: str) -> list[int]:
    return [int(v) for v in cell.split(",") if v]


def _groups(rows: list[dict[str, str]]) -> dict[tuple[str, ...], dict[str, dict[str, str]]]:
    """Rows by the shape they were generated from (query, output, dtypes, mean), by label."""
    groups: dict[tuple[str, ...], dict[str, dict[str, str]]] = defaultdict(dict)
    for row in rows:
        slots = row["Input Shapes"].strip('"').split(";")
        base = (slots[0], ";".join(slots[3:14]), row["Output Shapes"], row["Input Data Types"], row["avg_seq_len"],
                slots[1].split(",", 1)[-1])  # fmt: skip
        assert row[INPUT_VALUES_SOURCE] not in groups[base]
        groups[base][row[INPUT_VALUES_SOURCE]] = row
    return groups


def test_every_shape_once_per_distribution_batch_one_once(shipped_rows: list[dict[str, str]]) -> None:
    groups = _groups(shipped_rows)
    batches = set()
    for found in groups.values():
        even = found.get("grid: kv even")
        assert set(found) <= LABELS and even is not None  # the even row is the smallest but one: within 32 GiB
        assert even.get(Q_VALUES, "") == even.get(KV_VALUES, "") == ""  # today's row, unchanged but for the label
        batch = _dims(even["Input Shapes"])[6][0]  # actual_seq_lengths_kv: one per request
        batches.add(batch)
        if batch == 1:
            assert set(found) == {"grid: kv even"}
        elif independent_bytes(FIA, even) < 16 * GIB:  # a variant differs by a few blocks: within 32 GiB too
            assert set(found) == LABELS, found.keys()
    assert {1, 2, 256} <= batches


def _check_paged(even: dict[str, str], row: dict[str, str], label: str) -> None:
    base, dims = _dims(even["Input Shapes"]), _dims(row["Input Shapes"])
    lengths, mean = _ints(row.get(KV_VALUES, "")), int(row["avg_seq_len"])
    query, key, batch = base[0], base[1], base[14][0]
    # a 4-d cache [blocks, KV_N, block, D] goes with a BNSD query [B, N, S, D]; a 3-d one
    # [blocks, block, KV_N * D] with TND [T, N, D] or BSND [B, S, N, D]
    block = key[2] if len(key) == 4 else key[1]
    q_len = query[0] // batch if len(query) == 3 else (query[2] if len(key) == 4 else query[1])
    assert row.get(Q_VALUES, "") == "" and row["avg_seq_len"] == even["avg_seq_len"]
    assert len(lengths) == batch and sum(lengths) == batch * mean and min(lengths) >= q_len
    if label == "grid: kv max_mean 4":
        assert abs(lengths[0] - min(R * mean, batch * mean - (batch - 1) * q_len)) <= 1
        assert max(lengths[1:]) - min(lengths[1:]) <= 1
    else:
        assert abs(lengths[0] / lengths[-1] - R) < 0.1 and lengths == sorted(lengths, reverse=True)
    blocks = [math.ceil(n / block) for n in lengths]
    assert dims[14] == (batch, max(blocks))  # the block table holds the longest request
    for slot in (1, 2, 25):  # key, value (and MLA's key_rope): as many blocks as the requests use
        if base[slot] is not None:
            assert dims[slot] == (sum(blocks), *base[slot][1:])
    assert [d for i, d in enumerate(dims) if i not in (1, 2, 14, 25)] == [
        d for i, d in enumerate(base) if i not in (1, 2, 14, 25)]  # fmt: skip
    assert row["Output Shapes"] == even["Output Shapes"]


def test_paged_decode_and_tnd_prefill_cells(shipped_rows: list[dict[str, str]]) -> None:
    seen = set()
    for found in _groups(shipped_rows).values():
        even = found["grid: kv even"]
        paged = _dims(even["Input Shapes"])[14] is not None
        for label, row in found.items():
            if label == "grid: kv even":
                continue
            seen.add(("paged" if paged else "prefill", label, row[ROW_ORIGIN]))
            if paged:
                _check_paged(even, row, label)
                continue
            ends, batch = _ints(row.get(Q_VALUES, "")), _dims(even["Input Shapes"])[5][0]
            lengths = [b - a for a, b in zip([0, *ends], ends)]
            assert row.get(KV_VALUES, "") == row.get(Q_VALUES, "") and row["Input Shapes"] == even["Input Shapes"]
            assert len(ends) == batch and ends[-1] == _dims(row["Input Shapes"])[0][0] == batch * int(row["avg_seq_len"])
            assert min(lengths) >= 1 and lengths != [lengths[0]] * batch
    for origin in ("grid:attention:qwen3-32b", "grid:attention:deepseek-v3"):
        for kind in ("paged", "prefill"):
            assert {label for k, label, o in seen if (k, o) == (kind, origin)} == LABELS - {"grid: kv even"}


def test_every_row_reads_back_its_written_lengths(shipped_rows: list[dict[str, str]]) -> None:
    layouts = set()
    for row in shipped_rows:
        plan = fia_plan(kernel_row_from_cells(FIA, row))  # CaseBuildError if the replay could not build it
        layouts.add((plan.api_layout, bool(plan.block_size)))
        mean = int(row["avg_seq_len"])
        if row[INPUT_VALUES_SOURCE] == "grid: kv even":
            assert plan.kv_lens == (mean,) * plan.batch
        elif plan.block_size:
            assert list(plan.kv_lens) == _ints(row.get(KV_VALUES, ""))
        else:
            ends = _ints(row.get(KV_VALUES, ""))
            assert list(plan.q_lens) == list(plan.kv_lens) == [b - a for a, b in zip([0, *ends], ends)]
        assert sum(plan.kv_lens) == plan.batch * mean
    assert layouts == {("TND", True), ("TND", False), ("BSND", True), ("BNSD", True), ("BNSD_NBSD", True)}


def test_equal_lengths_are_written_once(shipped_rows: list[dict[str, str]]) -> None:
    evens = [{k: v for k, v in row.items() if k not in (INPUT_VALUES_SOURCE, ROW_ORIGIN)}
             for row in shipped_rows if row[INPUT_VALUES_SOURCE] == "grid: kv even"]  # fmt: skip
    single = next(row for row in evens if _dims(row["Input Shapes"])[6] == (1,))
    four = next(row for row in evens if _dims(row["Input Shapes"])[6] == (4,))
    # a batch of one: every distribution gives the row's own length, the even row, once
    assert with_kv_lengths(single, parse_distributions(["spread 4", "max_mean 4", "even"])) == [
        {**single, INPUT_VALUES_SOURCE: "grid: kv even"}]  # fmt: skip
    # spread 4.0 is spread 4; max_mean 4 and max_mean 9 are both capped for 4 requests
    rows = with_kv_lengths(four, parse_distributions(["spread 4", "spread 4.0", "max_mean 4", "max_mean 9"]))
    assert [row[INPUT_VALUES_SOURCE] for row in rows] == ["grid: kv spread 4", "grid: kv max_mean 4"]


def test_rows_the_grid_cannot_vary_are_written_once_unlabelled() -> None:
    bsnd = {"Input Shapes": "2,64,4,128;2,64,1,128;2,64,1,128", "Input Data Types": "DT_BF16;DT_BF16;DT_BF16",
            "Output Shapes": "2,64,4,128", "Output Data Types": "DT_BF16", "avg_seq_len": "64"}  # fmt: skip
    distributions = parse_distributions(["even", "spread 4"])
    assert with_kv_lengths(bsnd, distributions) == [bsnd]  # contiguous BSND: every request padded to one length
    unreadable = {**bsnd, "Input Shapes": "2,64;2,64;2,64"}
    assert with_kv_lengths(unreadable, distributions) == [unreadable]


# ------------------------------------------------------------------ a small config of the shipped patterns
def _small_config(tmp_path: Path, kv_len: int = 200, batches: tuple[int, ...] = (1, 3),
                  patterns: tuple[str, ...] = ()) -> Path:  # fmt: skip
    """The shipped FIA route (patterns and kv_lengths) over a few small grid values."""
    shipped = yaml.safe_load(DEFAULT_CONFIG.read_text(encoding="utf-8"))
    route = shipped["kernels"][FIA]
    if patterns:
        route["patterns"] = [p for p in route["patterns"] if p["name"] in patterns]
    grids = {"decode_batch": list(batches), "decode_q_len": [2], "kv_len": [kv_len], "block_size": [128],
             "prefill_batch": list(batches), "prefill_len": [40]}  # fmt: skip
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"grids": grids, "kernels": {FIA: route}}), encoding="utf-8")
    return path


def _at_tp(name: str, tp: int) -> ModelConfig:
    return dataclasses.replace(find_model(name), tp_sizes=(tp,))


def test_generated_rows_replay_and_verify_on_the_cpu(
    pytester: pytest.Pytester, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = pytester.path / "db"
    config = load_config(_small_config(tmp_path, batches=(3,)))
    models = (_at_tp("llama-3.1-8b", 8), _at_tp("deepseek-v3", 16))  # 4 and 8 heads per rank
    report = run_grid(GridRequest(db, config, models, True, 0, 0, GIB, (FIA,)))[0]
    rows = list(csv.DictReader((db / f"{FIA}.csv").open(newline="")))
    # 4 GQA patterns and 2 MLA ones, each once per distribution
    assert report.written == len(rows) == 18 and {r[INPUT_VALUES_SOURCE] for r in rows} == LABELS
    assert sum(1 for r in rows if r[KV_VALUES]) == 12
    capsys.readouterr()
    pytester.makepyfile(test_kernels=BENCH_TEST)
    result = pytester.runpytest("--database-path", str(db), "--repeat-count", "1", "--warmup-count", "0",
                                "-p", "no:cacheprovider", "--replay-coverage-min", "1.0")  # fmt: skip
    result.assert_outcomes(passed=len(rows))  # built from the written lengths and verified against float64
    for row in csv.DictReader((db / f"{FIA}.csv").open(newline="")):
        assert float(row["Average Duration(us)"]) > 0, row["Input Shapes"]


def test_each_variant_is_held_to_the_budget(tmp_path: Path) -> None:
    # mean 160 over blocks of 128: the even rows use 2 blocks a request; spread 4 (256, 192, 128, 64)
    # fewer, max_mean 4 a wider block table: variants on both sides of their even row
    config = load_config(_small_config(tmp_path, kv_len=160, batches=(4,), patterns=("gqa_decode_tnd_paged",)))
    models = (_at_tp("llama-3.1-8b", 8),)
    everything, _ = _plan(FIA, models, GIB, config)
    size = {row[INPUT_VALUES_SOURCE]: independent_bytes(FIA, row) for row in everything}
    assert set(size) == LABELS and size["grid: kv spread 4"] < size["grid: kv even"] < size["grid: kv max_mean 4"]
    for budget in (size["grid: kv spread 4"], size["grid: kv even"], size["grid: kv max_mean 4"]):
        rows, report = _plan(FIA, models, budget, config)
        kept = {row[INPUT_VALUES_SOURCE] for row in rows}
        assert kept == {label for label, n in size.items() if n <= budget}
        assert report.over_budget == 3 - len(kept) and report.variants == 2
        candidates = report.evaluated - report.filtered + report.variants
        assert candidates - report.skipped == report.over_budget + report.repeated + report.in_file + report.available


def _counts(out: str) -> list[int]:
    """candidates, skipped, over budget, repeated, in file, available, (would be) written."""
    line = next(line for line in out.splitlines() if line.startswith(FIA))
    return [int(v) for v in line.split()[1:8]]


def test_dry_run_counts_every_distribution(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _small_config(tmp_path, kv_len=160, batches=(1, 4), patterns=("gqa_decode_tnd_paged",))
    db = tmp_path / "db"

    def dry_run(directory: Path, *extra: str, path: Path = config) -> list[int]:
        assert perfdb(["grid", "--data-dir", str(directory), "--target-models", "llama-3.1-8b", "--kernel-types",
                       FIA, "--config", str(path), "--rows", "0", "--dry-run", *extra]) == 0  # fmt: skip
        return _counts(capsys.readouterr().out)

    # llama-3.1-8b at tp 1, 2, 4, 8: 2 batch sizes each, a batch of one once, a batch of 4 three times
    assert dry_run(db) == [16, 0, 0, 0, 0, 16, 16] and not db.exists()
    assert perfdb(["grid", "--data-dir", str(db), "--target-models", "llama-3.1-8b", "--kernel-types", FIA,
                   "--config", str(config), "--rows", "0"]) == 0  # fmt: skip
    capsys.readouterr()
    rows = list(csv.DictReader((db / f"{FIA}.csv").open(newline="")))
    assert len(rows) == 16 and dry_run(db) == [16, 0, 0, 0, 16, 0, 0]  # every row is in the file now
    sizes = sorted({independent_bytes(FIA, row) for row in rows})
    middle = (sizes[len(sizes) // 2 - 1] + sizes[len(sizes) // 2]) / 2  # between two row sizes: no rounding edge
    over = sum(1 for row in rows if independent_bytes(FIA, row) > middle)
    assert 0 < over < 16
    assert dry_run(tmp_path / "other", "--max-hbm-gb", repr(middle / GIB)) == [16, 0, over, 0, 0, 16 - over, 16 - over]
    # without kv_lengths: one row per shape, as before
    plain = yaml.safe_load(config.read_text(encoding="utf-8"))
    del plain["kernels"][FIA]["options"]
    config.write_text(yaml.safe_dump(plain), encoding="utf-8")
    assert dry_run(tmp_path / "other") == [8, 0, 0, 0, 0, 8, 8]


# ------------------------------------------------------------------ FlashAttentionScore TND (packed prefill)
def test_flash_attention_tnd_rows_carry_each_distributions_lengths_in_input_values() -> None:
    from perf_plugin.database.schema import INPUT_VALUES
    from perf_plugin.replay.kernels._flash_varlen import varlen_plan

    rows, _ = _plan("FlashAttentionScore", (find_model("llama-3.1-8b"),), 32 * GIB)
    by_shape: dict[str, dict[str, dict[str, str]]] = defaultdict(dict)
    for row in (r for r in rows if _dims(r["Input Shapes"])[0][1] == 32):  # TP 1: all 32 query heads
        assert row[INPUT_VALUES_SOURCE] not in by_shape[row["Input Shapes"]]
        by_shape[row["Input Shapes"]][row[INPUT_VALUES_SOURCE]] = row
    assert len(by_shape) == 32  # 4 batches x 8 lengths
    for shapes, found in by_shape.items():
        batch = _dims(shapes)[8][0]  # actual_seq_qlen: one per request
        assert set(found) == (LABELS if batch > 1 else {"grid: kv even"})
        assert found["grid: kv even"].get(INPUT_VALUES, "") == ""  # the replay's default: even lengths
        for label, row in found.items():
            plan = varlen_plan(kernel_row_from_cells("FlashAttentionScore", row))
            tokens = _dims(shapes)[0][0]
            assert plan.causal and plan.q_lens == plan.kv_lens and sum(plan.q_lens) == tokens
            if label == "grid: kv spread 4" and batch == 8:
                assert plan.q_lens == parse_distribution("spread 4").lengths(tokens, batch)
                assert abs(plan.q_lens[0] / plan.q_lens[-1] - R) < 0.1
            if label == "grid: kv max_mean 4" and batch == 8:
                assert plan.q_lens[0] == 4 * tokens // 8 and plan.measured


def test_generated_flash_attention_rows_replay_on_the_cpu() -> None:
    from tests.kernels.support import replay_on_cpu

    rows, _ = _plan("FlashAttentionScore", (find_model("llama-3.1-8b"),), 32 * GIB)
    small = [r for r in rows if _dims(r["Input Shapes"])[0] == (512, 32, 128) and _dims(r["Input Shapes"])[8][0] == 4]
    assert len(small) == 3
    for row in small:
        (lse, ones, out), _ = replay_on_cpu("FlashAttentionScore", row)
        assert tuple(out.shape) == (512, 32, 128) and tuple(lse.shape) == (512, 32, 8)
