"""What a grouped GEMM's time depends on beyond its shapes: captured in a real routed MoE layer,
attached by ingest to the right rows, and replayed as exactly those groups.

The layer is ``examples/moe_trace.py``'s (router, top-k, sort, ``histc``/``cumsum`` offsets, two
``torch._grouped_mm``), scaled down for the CPU, profiled with ``torch.profiler`` and
``perf_plugin.capture.capture_input_values``.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from perf_plugin.capture import capture_input_values
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.schema import INPUT_VALUES, INPUT_VALUES_SOURCE
from perf_plugin.database.shapes import parse_shape_cell
from perf_plugin.ingest.input_values import attach_values
from perf_plugin.ingest.pipeline import ingest_path, ingest_profiler
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.trace.events import TraceData, TraceOp, ValueMark
from perf_plugin.trace.values_file import CapturedCall, CapturedValues, mark_name, read_values_file, sidecar_path
from tests.kernels.support import kernel_row, replay_of, replay_on_cpu
from tests.test_plugin import BENCH_TEST

SCRIPT = Path(__file__).parents[1] / "examples" / "moe_trace.py"
pytestmark = pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no _grouped_mm")


def moe_script() -> Any:
    spec = importlib.util.spec_from_file_location("moe_trace", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


SMALL = dict(hidden=128, intermediate=64, experts=4, top_k=2)


def layer_and_input(skew: float, tokens: int = 64, seed: int = 1) -> tuple[Any, Any, torch.Tensor]:
    script = moe_script()
    layer = script.build_layer(script.MoeShape(**SMALL), "cpu", skew)
    x = torch.randn(tokens, SMALL["hidden"], generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    return script, layer, x


def ends_of(sizes: list[int]) -> tuple[int, ...]:
    out, total = [], 0
    for size in sizes:
        total += size
        out.append(total)
    return tuple(out)


def gmm_rows(db: Path) -> list[dict[str, str]]:
    with (db / "GroupedMatmul.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def skewed_trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    script, layer, x = layer_and_input(skew=1.5)
    routing = script.rows_per_expert(layer, x)
    trace = tmp_path_factory.mktemp("moe") / "trace.json"
    script.profile_layer(layer, x, trace)
    return trace, routing


def test_the_capture_records_every_grouped_gemm_call_and_marks_it_in_the_trace(skewed_trace: tuple[Path, list[int]]) -> None:
    trace, routing = skewed_trace
    captured = read_values_file(sidecar_path(trace))
    grouped = [call for call in captured.calls.values() if call.function == "torch._grouped_mm"]
    assert len(grouped) == 2  # gate+up and down
    assert {call.values[2] for call in grouped} == {ends_of(routing)}
    # and the router's top-k, as the quantiles of its scores (tests/test_input_quantiles.py)
    assert [call.function for call in captured.calls.values() if call.quantiles] == ["torch.Tensor.topk"]
    assert len(set(routing)) > 1  # skewed: not even groups
    events = json.loads(trace.read_text())["traceEvents"]
    marks = [e for e in events if e.get("name", "").startswith("perf_values/")]
    assert sorted(e["name"] for e in marks) == sorted(mark_name(captured.token, key) for key in captured.calls)


def test_ingest_attaches_the_routing_to_the_grouped_gemm_rows(skewed_trace: tuple[Path, list[int]], tmp_path: Path) -> None:
    trace, routing = skewed_trace
    report = ingest_path(trace, tmp_path / "db")
    rows = gmm_rows(tmp_path / "db")
    assert len(rows) == 2
    for row in rows:
        assert parse_shape_cell(row[INPUT_VALUES])[7] == ends_of(routing)
        assert row[INPUT_VALUES_SOURCE] == "measured"
    lines = "\n".join(report.lines())
    # the two GEMMs, the router's softmax and its top-k, and the two gathers by the sorted order
    assert "6 of 6 captured call(s) attached" in lines
    assert "2 measured, 0 with a default" in lines
    # the capture's own host copies and reads add no rows
    assert not any(path.stem in ("aten.clone", "aten.copy_", "Identity") for path in (tmp_path / "db").glob("*.csv"))


def test_without_a_values_file_the_rows_say_they_replay_even_groups(skewed_trace: tuple[Path, list[int]], tmp_path: Path) -> None:
    trace, _ = skewed_trace
    bare = tmp_path / "trace.json"
    bare.write_bytes(trace.read_bytes())  # no trace.values.json beside it
    report = ingest_path(bare, tmp_path / "db")
    rows = gmm_rows(tmp_path / "db")
    assert INPUT_VALUES not in rows[0]  # no row has values: the column is not written
    assert {row[INPUT_VALUES_SOURCE] for row in rows} == {"default: even groups"}
    assert "GroupedMatmul: 2 row(s) replay even groups" in "\n".join(report.lines())


def test_an_explicit_values_file_is_used_for_a_trace_elsewhere(skewed_trace: tuple[Path, list[int]], tmp_path: Path) -> None:
    trace, routing = skewed_trace
    moved = tmp_path / "elsewhere.json"
    moved.write_bytes(trace.read_bytes())
    ingest_path(moved, tmp_path / "db", sidecar_path(trace))
    assert {parse_shape_cell(row[INPUT_VALUES])[7] for row in gmm_rows(tmp_path / "db")} == {ends_of(routing)}


def test_the_replay_builds_exactly_the_recorded_groups(skewed_trace: tuple[Path, list[int]], tmp_path: Path) -> None:
    trace, routing = skewed_trace
    ingest_path(trace, tmp_path / "db")
    for cells in gmm_rows(tmp_path / "db"):
        replay, row = replay_of("GroupedMatmul"), kernel_row("GroupedMatmul", cells)
        args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
        group_list, groups = args[4], args[7]
        assert groups.sizes == tuple(routing)
        assert tuple(group_list.tolist()) == ends_of(routing)
        replay_on_cpu("GroupedMatmul", cells)  # and its output is verified against the float64 reference


def test_calls_that_routed_differently_are_kept_apart(tmp_path: Path) -> None:
    """Two passes on different tokens: each GEMM becomes one row per routing, never an average."""
    import torch.profiler as tp

    script, layer, x = layer_and_input(skew=0.5)
    _, _, other = layer_and_input(skew=0.5, seed=7)
    routings = {ends_of(script.rows_per_expert(layer, x)), ends_of(script.rows_per_expert(layer, other))}
    assert len(routings) == 2
    with torch.no_grad(), tp.profile(activities=[tp.ProfilerActivity.CPU], record_shapes=True) as prof:
        with capture_input_values() as capture:
            layer(x)
            layer(other)
    report = ingest_profiler(prof, tmp_path / "db", capture.values)
    rows = gmm_rows(tmp_path / "db")
    assert len(rows) == 4 and {parse_shape_cell(r[INPUT_VALUES])[7] for r in rows} == routings
    assert all(r["Profiling Count"] == "1" for r in rows)
    assert report.value_sources.measured == 4


def test_pytest_bench_replays_the_captured_rows(skewed_trace: tuple[Path, list[int]], pytester: pytest.Pytester) -> None:
    trace, _ = skewed_trace
    db = pytester.path / "db"
    ingest_path(trace, db)
    pytester.makepyfile(test_kernels=BENCH_TEST)
    result = pytester.runpytest("--database-path", str(db), "--repeat-count", "2", "--warmup-count", "1",
                                "-p", "no:cacheprovider", "-k", "GroupedMatmul")
    result.assert_outcomes(passed=2)
    assert all(float(row["Average Duration(us)"]) > 0 for row in gmm_rows(db))


# ----------------------------------------------------------------------------- attaching, unit by unit
def _op(name: str, start: int, end: int, thread: tuple[int, int] = (1, 1)) -> TraceOp:
    return TraceOp(name, thread, start, end)


def test_a_range_attaches_to_the_outermost_operator_it_encloses_on_its_thread() -> None:
    outer, inner, other_thread = _op("aten::_grouped_mm", 10, 50), _op("aten::mm", 20, 30), _op("aten::add", 12, 40, (1, 2))
    before = _op("aten::copy_", 2, 8)
    captured = CapturedValues("tok", {"0": CapturedCall("torch._grouped_mm", {2: (3, 8)}),
                                      "1": CapturedCall("torch._grouped_mm", {2: (1, 1)})})
    marks = [ValueMark(mark_name("tok", 0), (1, 1), 9, 51), ValueMark(mark_name("other", 0), (1, 1), 9, 51),
             ValueMark(mark_name("tok", 5), (1, 1), 9, 51), ValueMark(mark_name("tok", 1), (1, 1), 60, 70)]
    trace = TraceData([before, outer, inner, other_thread], [], [], value_marks=marks)
    report = attach_values(trace, captured)
    assert outer.values == {2: (3, 8)} and not inner.values and not other_thread.values and not before.values
    assert (report.attached, report.other_capture, report.without_entry, report.without_operator) == (1, 1, 1, 1)
    assert "calls missing from the trace" in "\n".join(report.lines())


def test_a_broken_values_file_is_one_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "run.values.json"
    path.write_text('{"format": "perf-plugin input values", "version": 1, "token": "t", "calls": {"0": {"values": {}}}}')
    with pytest.raises(DatabaseError, match="call '0'") as error:
        read_values_file(path)
    assert str(path) in str(error.value)
    path.write_text("[1, 2]")
    with pytest.raises(DatabaseError, match="not an input values file"):
        read_values_file(path)


def test_input_values_for_a_profile_of_several_files_is_refused(tmp_path: Path, skewed_trace: tuple[Path, list[int]]) -> None:
    trace, _ = skewed_trace
    for name in ("a.pt.trace.json", "b.pt.trace.json"):
        (tmp_path / name).write_bytes(trace.read_bytes())
    with pytest.raises(DatabaseError, match="belongs to one PyTorch trace"):
        ingest_path(tmp_path, None, sidecar_path(trace))


@pytest.mark.parametrize(("values", "match"), [
    (";;;;;;;5,10,12", "3 values"),  # not one end per expert
    (";;;;;;;5,4,10,12", "non-decreasing"),
    (";;;;;;;5,6,7,8", "ending at the 12 rows"),
])
def test_a_values_cell_that_is_not_a_group_list_is_refused_naming_the_column(values: str, match: str) -> None:
    cells = {"Input Shapes": '"12,32;4,32,16;;;;;;4"', "Input Data Types": "BF16;BF16;;;;;;INT64",
             "Output Shapes": '"12,16"', "Output Data Types": "BF16", INPUT_VALUES: f'"{values}"'}
    with pytest.raises(CaseBuildError, match=match) as error:
        replay_of("GroupedMatmul").check(kernel_row("GroupedMatmul", cells))
    assert INPUT_VALUES in str(error.value)


def test_the_ascend_reader_reads_rows_that_differ_only_in_their_values(tmp_path: Path) -> None:
    """Two routings of the same GEMMs: the reader (every version) reads the file and returns the
    first row of each shape, as docs/ascend-reader-contract.md says."""
    import shutil

    import pandas as pd
    import torch.profiler as tp

    from tests.ascend_reader import GENERATIONS, AscendReader, query_of
    from tests.conftest import ASCEND

    _, layer, x = layer_and_input(skew=0.5)
    _, _, other = layer_and_input(skew=0.5, seed=7)
    with torch.no_grad(), tp.profile(activities=[tp.ProfilerActivity.CPU], record_shapes=True) as prof:
        with capture_input_values() as capture:
            layer(x)
            layer(other)
    db = tmp_path / "db"
    ingest_profiler(prof, db, capture.values)
    shutil.copy(ASCEND / "op_mapping_vllm0.18.0_torch2.9.0_cann8.5.yaml", db / "op_mapping.yaml")
    frame = pd.read_csv(db / "GroupedMatmul.csv")
    first_of_shape = {}
    for position, shapes in enumerate(frame["Input Shapes"]):
        first_of_shape.setdefault(shapes, position)
    assert len(frame) == 4 and len(first_of_shape) == 2
    for generation in GENERATIONS:
        reader = AscendReader(db, generation)
        for position in range(len(frame)):
            hit = reader.lookup("tensor_cast.grouped_matmul.default", query_of(frame.iloc[position]))
            assert hit is not None and hit.kernel_type == "GroupedMatmul", generation.name
            assert hit.row == first_of_shape[frame["Input Shapes"][position]], generation.name
