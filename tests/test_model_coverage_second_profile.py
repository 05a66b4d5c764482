"""``benchmarks/model_coverage.py --second-process``: the replayed rows of one profile judged
against another profile's in-model durations, rows matched by their identity cells as the
database CSV spells them and as ingest gives them."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "tests" / "fixtures" / "cuda" / "indexing_trace.json"


@pytest.fixture(scope="module")
def model_coverage() -> ModuleType:
    spec = importlib.util.spec_from_file_location("model_coverage", ROOT / "benchmarks" / "model_coverage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["model_coverage"] = module  # its dataclasses resolve their module's names
    spec.loader.exec_module(module)
    return module


def _replayed(db: Path, factor: float) -> None:
    """Every row of ``db`` written back as if replayed at ``factor`` times its in-model duration."""
    for path in db.glob("*.csv"):
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        header = list(rows[0]) + ["Average Duration(us)"]
        for row in rows:
            row["Average Duration(us)"] = f"{float(row['Profiling Average Duration(us)']) * factor:.6f}"
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=header)
            writer.writeheader()
            writer.writerows(rows)


def _outcomes(module: ModuleType, db: Path) -> list[object]:
    """The database's rows as ``collect_rows`` reads them, every one counted as passed."""
    rows = module.collect_rows(db)
    for row in rows:
        with (db / f"{row.kernel_type}.csv").open(newline="") as handle:
            cells = list(csv.DictReader(handle))[row.line - 2]
        row.replayed_us = float(cells["Average Duration(us)"])
    return rows


@pytest.mark.parametrize(("factor", "within"), [(1.05, 1.0), (1.2, 0.0)])
def test_every_row_of_a_profile_matches_itself_in_another_ingest(
    model_coverage: ModuleType, tmp_path: Path, factor: float, within: float
) -> None:
    from perf_plugin.ingest.pipeline import ingest_path

    db = tmp_path / "db"
    ingest_path(TRACE, db)
    _replayed(db, factor)
    rows = _outcomes(model_coverage, db)
    judged = model_coverage.against_profile(rows, model_coverage.profiled_rows(TRACE))
    assert judged["rows_matched"] == judged["rows_replayed"] == len(rows) > 10
    assert judged["rows_within"] == within and judged["time_within"] == within


def test_a_row_the_other_profile_lacks_is_not_matched(model_coverage: ModuleType, tmp_path: Path) -> None:
    from perf_plugin.ingest.pipeline import ingest_path

    db = tmp_path / "db"
    ingest_path(TRACE, db)
    _replayed(db, 1.0)
    rows = _outcomes(model_coverage, db)
    other = model_coverage.profiled_rows(TRACE)
    dropped = rows[0].key
    judged = model_coverage.against_profile(rows, {key: value for key, value in other.items() if key != dropped})
    assert judged["rows_matched"] == len(rows) - 1 and judged["rows_within"] == 1.0


def test_a_run_into_a_folder_keeps_the_models_an_earlier_run_measured_there(
    model_coverage: ModuleType, tmp_path: Path
) -> None:
    """A sweep of one model per run into one folder: the document keeps every model's rows, and
    a model measured again replaces its own entry."""
    path = tmp_path / "model_coverage.json"

    def report(model: str, replayed: float) -> object:
        row = model_coverage.RowOutcome("Add", 2, 1.0, 1, replayed)
        return model_coverage.ModelReport(model, trace_kernel_us=1.0, rows=[row])

    first = model_coverage.merged_document(path, [report("mixtral/auto", 1.0)], {"models": "mixtral"})
    path.write_text(json.dumps(first))
    second = model_coverage.merged_document(path, [report("olmoe/auto", 1.5)], {"models": "olmoe"})
    assert sorted(second["rows"]) == ["mixtral/auto", "olmoe/auto"]
    assert [entry["settings"]["models"] for entry in second["summary"]] == ["mixtral", "olmoe"]
    path.write_text(json.dumps(second))
    again = model_coverage.merged_document(path, [report("mixtral/auto", 2.0)], {"models": "mixtral"})
    assert [entry["model"] for entry in again["summary"]] == ["olmoe/auto", "mixtral/auto"]
    assert again["rows"]["mixtral/auto"][0]["replayed_us"] == 2.0
    assert again["rows"]["olmoe/auto"][0]["replayed_us"] == 1.5


def test_the_rows_out_of_the_band_are_listed_most_time_first(model_coverage: ModuleType) -> None:
    rows = [model_coverage.RowOutcome("Mul", 2, 2.0, 10, 1.5, key=("Mul", '"1,16,1,128;1,1,1,128"', "DT_BF16;DT_BF16")),
            model_coverage.RowOutcome("GroupedMatmul", 3, 90.0, 2, 105.0, key=("GroupedMatmul", '"2,14336"', "")),
            model_coverage.RowOutcome("Add", 4, 5.0, 1, 5.2, key=("Add", '"8"', "INT64")),  # within the band
            model_coverage.RowOutcome("Cast", 5, 1.0, 1, None, key=("Cast", '"8"', "INT64"))]  # not replayed
    report = model_coverage.ModelReport("m/auto", trace_kernel_us=200.0, rows=rows)
    lines = model_coverage.out_of_band_lines(report)
    assert "(2 rows, 100.0% of the time)" in lines[0]
    assert "90.00%  ratio 1.167  GroupedMatmul line 3" in lines[1] and '"2,14336"' in lines[1]
    assert "10.00%  ratio 0.750  Mul line 2  2.00 us x10" in lines[2]
    assert len(lines) == 3
    assert model_coverage.out_of_band_lines(model_coverage.ModelReport("m/auto", 1.0, rows=rows[2:])) == []


def test_dimensions_a_configuration_leaves_open_are_set_as_its_model_usually_has_them(model_coverage: ModuleType) -> None:
    from types import SimpleNamespace

    open_ = SimpleNamespace(hidden_size=4096, num_attention_heads=32, num_key_value_heads=None, head_dim=None)
    model_coverage.fill_open_defaults(open_)
    assert (open_.num_key_value_heads, open_.head_dim) == (32, 128)
    given = SimpleNamespace(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=64)
    model_coverage.fill_open_defaults(given)
    assert (given.num_key_value_heads, given.head_dim) == (8, 64)
    without = SimpleNamespace(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8)
    model_coverage.fill_open_defaults(without)
    assert not hasattr(without, "head_dim")  # a configuration without the field is left so


def test_what_a_configuration_leaves_open_its_model_needs_is_set_as_published(model_coverage: ModuleType) -> None:
    """DeepSeek-V2's and dots.llm1's defaults route to no top-k (the model cannot build), LFM2-MoE's
    give no layer kinds, DeepSeek-V2's expert width is odd; a model of two layers keeps one of
    routed experts."""
    pytest.importorskip("transformers")  # the benchmark's own dependency, not the project's
    deepseek = model_coverage.architecture_config("deepseek_v2", tiny=False)
    assert deepseek.num_experts_per_tok == 6
    assert deepseek.moe_intermediate_size == 1408  # its default 1407 rows are no 16-byte stride for grouped_mm
    dots = model_coverage.architecture_config("dots1", tiny=False)
    assert (dots.n_routed_experts, dots.num_experts_per_tok, dots.n_shared_experts) == (128, 6, 2)
    lfm = model_coverage.architecture_config("lfm2_moe", tiny=True)
    assert set(lfm.layer_types) == {"conv", "full_attention"}
    model = model_coverage.build_model("hf:lfm2_moe", layers=2, device="cpu", tiny=True, tokens=16)
    assert model.config.num_dense_layers == 1 and sorted(model.config.layer_types) == ["conv", "full_attention"]
    assert any("Experts" in type(module).__name__ for module in model.modules())


def test_a_hybrid_models_few_layers_keep_each_kind_it_has(model_coverage: ModuleType) -> None:
    qwen3_next = ["linear_attention"] * 3 + ["full_attention"]
    assert model_coverage.kept_layer_types(qwen3_next * 12, 2) == ["linear_attention", "full_attention"]
    assert model_coverage.kept_layer_types(["sliding_attention", "full_attention"] * 13, 2) == [
        "sliding_attention", "full_attention"]  # Gemma 2: its first two already
    assert model_coverage.kept_layer_types(qwen3_next, 3) == ["linear_attention"] * 2 + ["full_attention"]
    assert model_coverage.kept_layer_types(qwen3_next, 1) == ["full_attention"]  # a cache needs an attention layer
    nemotron_h = ["linear_attention", "moe", "full_attention", "mlp"]
    assert model_coverage.kept_layer_types(nemotron_h, 2) == ["full_attention", "moe"]
    granite_h = ["linear_attention"] * 32  # the defaults: state-keeping layers alone
    assert model_coverage.kept_layer_types(granite_h, 2) == ["linear_attention", "full_attention"]
    llama4 = ["chunked_attention"] * 3 + ["full_attention"]
    assert model_coverage.kept_layer_types(llama4 * 12, 2) == ["chunked_attention", "full_attention"]


def test_a_hybrid_model_whose_layer_kinds_are_derived_gets_them_through_its_own_fields(model_coverage: ModuleType) -> None:
    """Jamba's layer kinds follow an attention period and offset, Bamba's attention indices."""

    class Derived:
        def __init__(self, **fields: object) -> None:
            self.__dict__.update(fields)

        @property
        def layer_types(self) -> list[str]:  # read-only, as Jamba's and Bamba's configurations have it
            period, offset, indices = (getattr(self, n, None) for n in ("attn_layer_period", "attn_layer_offset",
                                                                       "attn_layer_indices"))
            return ["full_attention" if (i in (indices or ()) if period is None else i % period == offset)
                    else "linear_attention" for i in range(32)]

    jamba = Derived(attn_layer_period=8, attn_layer_offset=4)
    model_coverage.fit_hybrid_layers(jamba, 2)
    assert (jamba.attn_layer_period, jamba.attn_layer_offset) == (2, 1)
    bamba = Derived(attn_layer_indices=None)
    model_coverage.fit_hybrid_layers(bamba, 2)
    assert bamba.attn_layer_indices == [1]


def test_a_hybrid_models_prefill_cache_holds_the_states_its_configuration_names(model_coverage: ModuleType) -> None:
    transformers = pytest.importorskip("transformers")  # the benchmark's own dependency, not the project's
    AutoConfig, DynamicCache = transformers.AutoConfig, transformers.DynamicCache
    config = AutoConfig.for_model("qwen3_next", num_hidden_layers=2, layer_types=["linear_attention", "full_attention"])
    assert len(model_coverage.new_cache(config).layers) == 2  # a linear-attention layer's state too
    assert isinstance(model_coverage.new_cache(AutoConfig.for_model("llama")), DynamicCache)
    assert len(model_coverage.new_cache(AutoConfig.for_model("llama")).layers) == 0  # keys and values, made as they come


def test_the_replay_is_judged_against_each_other_profile_it_was_given(
    model_coverage: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--second-process`` and ``--reference-spread`` each give a profile the replay is judged
    against: another process's, and one with the parameters moved to new allocations."""
    row = model_coverage.RowOutcome("Add", 2, 1.0, 1, 1.0)
    report = model_coverage.ModelReport("m/auto", trace_kernel_us=1.0, rows=[row])
    report.against_replaced = {"time_within": 0.5, "rows_within": 0.25, "rows_matched": 4, "rows_replayed": 4}
    model_coverage.print_against_other_profiles(report)
    printed = capsys.readouterr().out
    assert "parameters re-placed: within (0.9, 1.1) for 50.0% of its time, 25.0% of 4 matched rows" in printed
    assert "another process" not in printed
    assert report.summary()["against_replaced_parameters"]["time_within"] == 0.5
