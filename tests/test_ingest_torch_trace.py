"""PyTorch profiler traces -> database rows, on a trace produced here with torch.profiler.

The model is small but uses the operators the mapping covers; expected durations are taken
from the exported Chrome trace with the json module.
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from perf_plugin.database.errors import DatabaseError  # noqa: E402
from perf_plugin.database.schema import format_number  # noqa: E402
from perf_plugin.trace.args import Tensor, broadcast, concrete_value, promote  # noqa: E402
from perf_plugin.ingest.pipeline import ingest_path, ingest_profiler  # noqa: E402
from perf_plugin.ingest import torch_trace  # noqa: E402
from perf_plugin.ingest.torch_trace import read_live_profiler, read_trace_file  # noqa: E402
from perf_plugin.replay.tensors import kernel_row_from_cells  # noqa: E402

ITERATIONS = 3
# Live events expose the dims of tensor lists (cat's inputs) in newer releases (2.13 does, 2.11 not).


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)
        self.norm_weight = torch.nn.Parameter(torch.ones(32))

    def forward(self, ids: Any) -> Any:
        x = self.emb(ids)  # [2, 4, 16]
        h = torch.nn.functional.gelu(self.fc1(x))  # linear on a 3-D input
        h = torch.nn.functional.rms_norm(h, (32,), self.norm_weight)
        y = self.fc2(h)
        p = torch.softmax(y, dim=-1)
        c = torch.cat([p, p], dim=-1)
        s = torch.bmm(h, h.transpose(1, 2))
        t = y * 0.5 + y
        u = t.to(torch.bfloat16)
        v = h[:, :2].contiguous()
        return c, s, u, v


def profile_model(device: str, record_shapes: bool = True) -> Any:
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    model = Tiny().to(device)
    ids = torch.randint(0, 50, (2, 4), device=device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.no_grad():
        model(ids)
        with profile(activities=activities, record_shapes=record_shapes) as prof:
            for _ in range(ITERATIONS):
                model(ids)
            if device == "cuda":
                torch.cuda.synchronize()
    return prof


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    prof = profile_model("cpu")
    path = tmp_path_factory.mktemp("trace") / "tiny.pt.trace.json"
    prof.export_chrome_trace(str(path))
    return prof, path


def rows_by_type(rows: list[Any]) -> dict[str, list[Any]]:
    grouped: dict[str, list[Any]] = {}
    for row in rows:
        grouped.setdefault(row.kernel_type, []).append(row)
    return grouped


def trace_durations(path: Path, name: str, dims: list[Any] | None = None) -> list[float]:
    events = json.loads(path.read_text(encoding="utf-8"))["traceEvents"]
    return [
        float(e["dur"])
        for e in events
        if e.get("cat") == "cpu_op"
        and e.get("name") == name
        and (dims is None or e["args"].get("Input Dims") == dims)
    ]


def test_cpu_trace_rows(cpu_profile: tuple[Any, Path]) -> None:
    _, path = cpu_profile
    report = ingest_path(path, None)
    by_type = rows_by_type(report.rows)
    assert report.discovery is not None and report.discovery.kind == "torch_trace"
    assert set(by_type) == {
        "GatherV2",
        "MatMulV2",
        "aten.gelu",
        "RmsNorm",
        "SoftmaxV2",
        "ConcatD",
        "BatchMatMulV2",
        "Muls",
        "Add",
        "Cast",
        "TensorMove",
    }
    cells = {t: [dict(r.cells) for r in rows] for t, rows in by_type.items()}
    assert {(c["Input Shapes"], c["Output Shapes"]) for c in cells["MatMulV2"]} == {
        ('"8,16;32,16;32"', '"8,32"'),  # linear on [2, 4, 16] runs one [8, 16] GEMM
        ('"8,32;8,32;8"', '"8,8"'),
    }
    (gather,) = cells["GatherV2"]
    assert (gather["Input Shapes"], gather["Input Data Types"], gather["Output Shapes"]) == (
        '"50,16;2,4;1"',
        "FLOAT;INT64;INT64",
        '"2,4,16"',
    )
    (norm,) = cells["RmsNorm"]
    assert (norm["Input Shapes"], norm["Output Shapes"], norm["Output Data Types"]) == (
        '"2,4,32;32"',
        '"2,4,32;2,4,1"',
        "FLOAT;FLOAT",
    )
    (cast,) = cells["Cast"]
    assert (cast["Input Data Types"], cast["Output Data Types"]) == ("FLOAT", "DT_BF16")
    (muls,) = cells["Muls"]
    assert (muls["Input Shapes"], muls["Output Shapes"]) == ('"2,4,8"', '"2,4,8"')
    (bmm,) = cells["BatchMatMulV2"]
    assert (bmm["Input Shapes"], bmm["Output Shapes"]) == ('"2,4,32;2,32,4"', '"2,4,4"')
    (concat,) = cells["ConcatD"]
    assert (concat["Input Shapes"], concat["Input Data Types"], concat["Output Shapes"]) == (
        '"2,4,8;2,4,8"',
        ";",  # the profiler records no dtypes for tensor lists
        '"2,4,16"',
    )
    (move,) = cells["TensorMove"]
    assert move["Input Shapes"] == move["Output Shapes"] == '"2,2,32"'
    for row in report.rows:
        assert row.cells["Accelerator Core"] == "CPU" and row.cells["OP State"] == "dynamic"
        assert row.count == ITERATIONS
        if row.kernel_type != "ConcatD":
            kernel_row_from_cells(row.kernel_type, row.cells)  # replays can parse every slot
    assert report.traces[0].unknown_dtype_rows == ITERATIONS


@pytest.mark.parametrize(
    ("kernel_type", "operator", "dims"),
    [
        ("aten.gelu", "aten::gelu", None),
        ("SoftmaxV2", "aten::softmax", None),
        ("BatchMatMulV2", "aten::bmm", None),
        ("ConcatD", "aten::cat", None),
        ("MatMulV2", "aten::linear", [[2, 4, 16], [32, 16], [32]]),
    ],
)
def test_cpu_durations_are_the_operators_own_time(
    cpu_profile: tuple[Any, Path], kernel_type: str, operator: str, dims: list[Any] | None
) -> None:
    _, path = cpu_profile
    durations = trace_durations(path, operator, dims)
    assert len(durations) == ITERATIONS
    report = ingest_path(path, None)
    candidates = [r for r in report.rows if r.kernel_type == kernel_type]
    if dims is not None:
        candidates = [r for r in candidates if r.cells["Input Shapes"] == '"8,16;32,16;32"']
    (row,) = candidates
    values = row.profiling_values()
    assert values["Profiling Average Duration(us)"] == format_number(statistics.fmean(durations), 6)
    assert values["Profiling Median Duration(us)"] == format_number(statistics.median(durations), 6)
    assert values["Profiling Count"] == str(ITERATIONS)


def test_views_and_allocations_are_not_rows(cpu_profile: tuple[Any, Path]) -> None:
    _, path = cpu_profile
    types = {r.kernel_type for r in ingest_path(path, None).rows}
    for view in ("aten.transpose", "aten.slice", "aten.t", "aten.view", "aten.empty", "aten.as_strided"):
        assert view not in types


@pytest.mark.skipif(
    not torch_trace.live_events_record_strides(),
    reason="this torch's live events record no strides: its profiles are read through an export (next test)",
)
def test_live_profiler_equals_exported_trace(cpu_profile: tuple[Any, Path]) -> None:
    prof, path = cpu_profile
    from_file, _ = read_trace_file(path)
    live, summary = read_live_profiler(prof)
    assert not summary.device_trace
    from_file_rows = ingest_path(path, None).rows
    live_rows = ingest_profiler(prof, None).rows
    assert [(r.kernel_type, dict(r.cells), r.count) for r in live_rows] == [
        (r.kernel_type, dict(r.cells), r.count) for r in from_file_rows
    ]
    for a, b in zip(live_rows, from_file_rows):
        assert a.average == pytest.approx(b.average, abs=1e-3)  # the file keeps nanoseconds
    assert len(live.frame) == len(from_file.frame)


def test_a_torch_whose_live_events_lack_strides_reads_the_exported_trace(
    cpu_profile: tuple[Any, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, path = cpu_profile
    monkeypatch.setattr(torch_trace, "live_events_record_strides", lambda: False)
    live_rows = ingest_profiler(profile_model("cpu"), None).rows
    strided = [r for r in live_rows if r.cells.get("Input Strides")]
    assert strided  # the transposed operand of the batched matmul keeps its strides
    assert [(r.kernel_type, dict(r.cells)) for r in live_rows] == [
        (r.kernel_type, dict(r.cells)) for r in ingest_path(path, None).rows
    ]


def test_an_exported_profile_without_live_strides_is_read_live_with_a_warning(
    cpu_profile: tuple[Any, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    prof, _ = cpu_profile  # already exported by the fixture
    monkeypatch.setattr(torch_trace, "live_events_record_strides", lambda: False)
    with pytest.warns(UserWarning, match="ingest the exported trace file"):
        live_rows = ingest_profiler(prof, None).rows
    assert {r.kernel_type for r in live_rows} >= {"MatMulV2", "BatchMatMulV2"}


def test_ingest_profiler_writes_a_database(cpu_profile: tuple[Any, Path], tmp_path: Path) -> None:
    prof, _ = cpu_profile
    report = ingest_profiler(prof, tmp_path / "db")
    assert report.merge is not None
    with (tmp_path / "db" / "MatMulV2.csv").open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2
    assert all(r["Profiling Count"] == str(ITERATIONS) for r in rows)
    assert (tmp_path / "db" / "aten.gelu.csv").exists()


def test_trace_without_shapes_is_refused(tmp_path: Path) -> None:
    prof = profile_model("cpu", record_shapes=False)
    path = tmp_path / "noshapes.json"
    prof.export_chrome_trace(str(path))
    with pytest.raises(DatabaseError, match="record_shapes=True") as info:
        ingest_path(path, None)
    assert info.value.path == path


def test_not_a_trace(tmp_path: Path) -> None:
    path = tmp_path / "broken.pt.trace.json"
    path.write_text("{ not json", encoding="utf-8")
    with pytest.raises(DatabaseError, match="not a JSON trace"):
        ingest_path(path, None)


def test_shape_and_dtype_rules() -> None:
    assert broadcast((4, 1, 8), (3, 1)) == (4, 3, 8)
    assert broadcast((4, 2), (3,)) is None
    assert promote(Tensor((2,), "DT_BF16"), "FLOAT", b_is_dimensioned=True) == "FLOAT"
    assert promote(Tensor((2,), "FLOAT16"), "DT_BF16", b_is_dimensioned=True) == "FLOAT"
    assert promote(Tensor((2,), "DT_BF16"), "DOUBLE", b_is_dimensioned=False) == "DT_BF16"
    assert promote(Tensor((2,), "INT64"), "DOUBLE", b_is_dimensioned=False) == "FLOAT"
    assert concrete_value("[4, 32]") == [4, 32] and concrete_value("15") == 15 and concrete_value("") is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_trace_file_and_live_object_agree(tmp_path: Path) -> None:
    prof = profile_model("cuda")
    path = tmp_path / "cuda.pt.trace.json"
    prof.export_chrome_trace(str(path))
    file_report = ingest_path(path, None)
    live_report = ingest_profiler(prof, None)
    assert file_report.traces[0].device_trace and file_report.traces[0].device_name
    file_rows = {(r.kernel_type, r.cells["Input Shapes"]): r for r in file_report.rows}
    live_rows = {(r.kernel_type, r.cells["Input Shapes"]): r for r in live_report.rows}
    assert ("MatMulV2", '"8,16;32,16;32"') in file_rows
    for key, row in file_rows.items():
        assert row.cells["Accelerator Core"] == "CUDA"
        assert row.average > 0
        if key in live_rows:
            assert live_rows[key].average == pytest.approx(row.average, abs=1e-3)
