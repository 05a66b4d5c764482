"""The FIA bundle check of ``perfdb ingest``: kernel_details + operator_details.csv + trace_view.json.

No public profile holds FusedInferAttentionScore kernels together with their operator_details
and trace_view, so the profile directory here is built from real files and rows:

* ``kernel_details.csv``: the header and two rows of the real Level1 kernel_details fixture,
  unaltered; the FIA launches are that fixture's MatMulV2 row with its name, type, identity,
  start and duration cells replaced by FusedInferAttentionScore ones, the identity cells taken
  from the real database rows of ``db_row_FusedInferAttentionScore.csv``;
* ``operator_details.csv``: the header and the first rows of the real Level1 operator_details
  fixture, unaltered, then per FIA launch the two rows torch_npu writes for a call (as the
  fixture does for its ``aten::addmm`` / ``aclnnAddmm`` pair): the framework operator
  ``npu::npu_fused_infer_attention_score`` with its ``Input Shapes`` (slots ending in ``;\\n`` as
  in the fixture) and the ``aclnnFusedInferAttentionScoreV3`` API row, which records no shapes;
* ``trace_view.json``: torch_npu's Chrome trace layout, as in msinsight's public Level1 trace
  (``test/data/pytorch/text/level1/rank0_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json``):
  one of its ``cpu_op`` events and one of its device tasks verbatim, process names, and per FIA
  launch a ``cpu_op`` event, the device task and the ``torch_to_npu`` flow pair between them,
  with the fields and value formats of that trace.

The operator's shapes are the kernel's tensor shapes, with the two integer-list arguments
(``actual_seq_lengths``, ``actual_seq_lengths_kv``) recorded without a shape as the profiler
records lists (``ScalarList`` in the real trace), and 14 scalar arguments after the tensors.  One
launch uses the pair of kernel and operator shapes of msmodeling's regression test for the same
check (an MLA call whose operator takes 4-D BNSD tensors that the kernel records as TND).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from perf_plugin.cli import main
from perf_plugin.database.errors import DatabaseError
from perf_plugin.ingest.ascend_trace_view import launching_operators, read_events, to_ns
from perf_plugin.ingest.fia_bundle import (
    BLOCK_TABLE_SHAPE,
    OPERATOR_SHAPES,
    PROFILE_TAG,
    SOURCE_PROFILE,
    is_fia_operator,
    operator_slots,
)
from perf_plugin.ingest.fia_runtime import COMPLETENESS, KV_LENS_SHAPE, Q_LENS_SHAPE
from perf_plugin.ingest.pipeline import ingest_path
from tests import ascend_profile

ASCEND = Path(__file__).parent / "fixtures" / "ascend"
FIA = "FusedInferAttentionScore"
KERNEL_NAME = "aclnnFusedInferAttentionScoreV3_FusedInferAttentionScore_FusedInferAttentionScore"
PY_PID, HW_PID, CANN_PID = 3096504, 3170820512, 3170820320
# msmodeling tests/benchmark/ops/perf_database/test_fia_common.py: an MLA row's kernel and operator shapes
MLA_KERNEL = "4099,16,128;4099,16,128;4099,16,128;;2048,2048;1;1;;;;;;;;1,512;;;;;;;;;;4099,16,64;4099,16,64;;;;;"
MLA_OPERATOR = "16,1,1,512;4099,1,128,512;4099,1,128,512;;;1;1;;;;;;;;1,512;;;;;;;;;;16,1,1,64;4099,1,128,64;;;;;"
# One framework operator and one device task of the public Level1 trace, verbatim.
REAL_CPU_OP = json.loads(
    '{"ph": "X", "name": "aten::lift_fresh", "pid": 3096504, "tid": 3096504, "ts": "1736408883688464.980", '
    '"dur": 104.08, "cat": "cpu_op", "args": {"Sequence number": -1, "Fwd thread id": 0, "Input Dims": "0", '
    '"Input type": "float", "Call stack": "'
    "/home/z30057886/.local/lib/python3.9/site-packages/torch/_utils.py(180): _rebuild_tensor;\\r\\n"
    "/home/z30057886/.local/lib/python3.9/site-packages/torch/multiprocessing/reductions.py(110): rebuild_tensor;\\r\\n"
    "/home/z30057886/miniconda3/lib/python3.9/multiprocessing/queues.py(122): get;\\r\\n"
    "/home/z30057886/.local/lib/python3.9/site-packages/torch/utils/data/dataloader.py(1132): _try_get_data;\\r\\n"
    "/home/z30057886/.local/lib/python3.9/site-packages/torch/utils/data/dataloader.py(1294): _get_data;\\r\\n"
    "/home/z30057886/.local/lib/python3.9/site-packages/torch/utils/data/dataloader.py(1328): _next_data;\\r\\n"
    "/home/z30057886/.local/lib/python3.9/site-packages/torch/utils/data/dataloader.py(630): __next__;\\r\\n"
    "/home/z30057886/imagenet_script/main.py(345): train;\\r\\n"
    "/home/z30057886/imagenet_script/main.py(282): main_worker;\\r\\n"
    "/home/z30057886/.local/lib/python3.9/site-packages/torch/multiprocessing/spawn.py(74): _wrap;\\r\\n"
    "/home/z30057886/miniconda3/lib/python3.9/multiprocessing/process.py(108): run;\\r\\n"
    "/home/z30057886/miniconda3/lib/python3.9/multiprocessing/process.py(315): _bootstrap;\\r\\n"
    "/home/z30057886/miniconda3/lib/python3.9/multiprocessing/spawn.py(129): _main;\\r\\n"
    "/home/z30057886/miniconda3/lib/python3.9/multiprocessing/spawn.py(116): spawn_main;\\r\\n"
    '<string>(1): <module>"}}'
)
REAL_TASK = json.loads(
    '{"name": "trans_TransData_24", "pid": 3170820512, "tid": 2, "ts": "1736408883744660.012", "dur": 70.80140625, '
    '"args": {"Model Id": 4294967295, "Task Type": "AI_CORE", "Physic Stream Id": 2, "Task Id": 11232, "Batch Id": 0, '
    '"Subtask Id": 4294967295, "connection_id": 1569}, "ph": "X"}'
)


def db_rows() -> list[dict[str, str]]:
    with (ASCEND / "db_row_FusedInferAttentionScore.csv").open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def mla_row() -> dict[str, str]:
    """The MLA pair's kernel row: slot dtypes and formats as the real rows give them for such slots."""
    slots = MLA_KERNEL.split(";")
    dtypes = {0: "DT_BF16", 1: "DT_BF16", 2: "DT_BF16", 4: "INT8", 5: "INT64", 6: "INT64", 14: "INT32", 24: "DT_BF16", 25: "DT_BF16"}
    return dict(
        db_rows()[0],
        **{
            "Input Shapes": f'"{MLA_KERNEL}"',
            "Input Data Types": ";".join(dtypes.get(i, "DT_UNDEFINED") for i in range(len(slots))),
            "Input Formats": ";".join("ND" if i in dtypes else "NULL" for i in range(len(slots))),
            "Output Shapes": '"4099,16,128;"',
        },
    )


def operator_shapes_of(kernel_input_shapes: str) -> list[str]:
    """The framework operator's recorded input slots for a kernel row: tensors as the kernel's,
    the two integer lists without a shape, 14 scalar arguments after the 27 tensor arguments."""
    slots = kernel_input_shapes.strip('"').split(";")[:27]
    slots += [""] * (27 - len(slots))
    slots[5] = slots[6] = ""
    return slots + [""] * 14


class Launch:
    def __init__(self, row: dict[str, str], op_slots: list[str], start: str, duration: str, op_ts: str) -> None:
        self.row, self.op_slots, self.start, self.duration, self.op_ts = row, op_slots, start, duration, op_ts


def launches() -> list[Launch]:
    rows = db_rows()
    mla_op = MLA_OPERATOR.split(";") + [""] * 10
    return [
        Launch(rows[0], operator_shapes_of(rows[0]["Input Shapes"]), "1736408883716197.363", "58.214", "1736408883710011.250"),
        Launch(rows[6], operator_shapes_of(rows[6]["Input Shapes"]), "1736408883716402.881", "27.905", "1736408883710350.420"),
        Launch(rows[0], operator_shapes_of(rows[0]["Input Shapes"]), "1736408883716600.104", "58.196", "1736408883710702.930"),
        Launch(mla_row(), mla_op, "1736408883716900.517", "412.337", "1736408883711040.610"),
    ]


def kernel_details_text(fia: list[Launch]) -> str:
    return ascend_profile.kernel_details_text(
        {**launch.row, "Name": KERNEL_NAME, "Type": FIA, "Start Time(us)": launch.start + "\t",
         "Duration(us)": launch.duration} for launch in fia)


def operator_details_text(fia: list[Launch]) -> str:
    with (ASCEND / "operator_details_level1.csv").open(newline="", encoding="utf-8-sig") as handle:
        records = list(csv.reader(handle))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerows(records[:12])
    for launch in fia:
        stack = "vllm_ascend/attention/attention_v1.py(612): forward_impl;\nvllm/attention/layer.py(517): unified_attention_with_output"
        writer.writerow(["npu::npu_fused_infer_attention_score", ";\n".join(launch.op_slots), stack, "41.2", "96.84", "0", launch.duration, "0", launch.duration])
        writer.writerow(["aclnnFusedInferAttentionScoreV3", "", "", "30.7", "30.7", launch.duration, launch.duration, launch.duration, launch.duration])
    return out.getvalue()


def trace_events(fia: list[Launch]) -> list[dict[str, object]]:
    events: list[dict[str, object]] = [
        {"ph": "M", "name": "process_name", "pid": PY_PID, "tid": 0, "args": {"name": "Python"}},
        {"ph": "M", "name": "process_name", "pid": CANN_PID, "tid": 0, "args": {"name": "CANN"}},
        {"ph": "M", "name": "process_name", "pid": HW_PID, "tid": 0, "args": {"name": "Ascend Hardware"}},
        REAL_CPU_OP,
        REAL_TASK,
    ]
    for number, launch in enumerate(fia):
        flow_id = to_ns(launch.start)
        types = ["c10::BFloat16"] * 3 + ["None"] * 2 + ["ScalarList"] * 2 + ["None"] * 20 + ["Scalar", "Scalar"] * 7
        events += [
            {"ph": "X", "name": "npu::npu_fused_infer_attention_score", "pid": PY_PID, "tid": PY_PID, "ts": launch.op_ts,
             "dur": 96.84, "cat": "cpu_op", "args": {"Sequence number": -1, "Fwd thread id": 0,
             "Input Dims": ";\r\n".join(launch.op_slots), "Input type": ";\r\n".join(types),
             "Call stack": "vllm_ascend/attention/attention_v1.py(612): forward_impl"}},
            {"name": KERNEL_NAME, "pid": HW_PID, "tid": 2, "ts": launch.start, "dur": float(launch.duration),
             "args": {"Model Id": 4294967295, "Task Type": "MIX_AIC", "Physic Stream Id": 2, "Task Id": 11300 + number,
                      "Batch Id": 0, "Subtask Id": 4294967295, "connection_id": 1700 + number}, "ph": "X"},
            {"ph": "s", "bp": "e", "name": "torch_to_npu", "id": flow_id, "pid": PY_PID, "tid": PY_PID, "ts": launch.op_ts, "cat": "async_npu"},
            {"ph": "f", "bp": "e", "name": "torch_to_npu", "id": flow_id, "pid": HW_PID, "tid": 2, "ts": launch.start, "cat": "async_npu"},
        ]  # fmt: skip
    return events


def write_profile(root: Path, fia: list[Launch], *, operator_details: bool = True, trace: bool = True) -> Path:
    output = root / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    output.mkdir(parents=True)
    (output / "kernel_details.csv").write_text(kernel_details_text(fia), encoding="utf-8")
    if operator_details:
        (output / "operator_details.csv").write_text(operator_details_text(fia), encoding="utf-8")
    if trace:
        (output / "trace_view.json").write_text(json.dumps(trace_events(fia)), encoding="utf-8")
    return root / "rank0_ascend_pt"


def fia_csv(database: Path) -> list[dict[str, str]]:
    with (database / f"{FIA}.csv").open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def by_query(rows: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    return {row["Input Shapes"].strip('"').split(";")[0]: row for row in rows}


def test_the_bundle_gives_each_row_the_shapes_of_the_operator_that_launched_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = write_profile(tmp_path, launches())
    database = tmp_path / "db"
    assert main(["ingest", "--profiling-path", str(profile), "--database-path", str(database)]) == 0
    out = capsys.readouterr().out
    kernel_details = profile / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
    assert f"{FIA} bundle check of {kernel_details}: 4 kernel(s)" in out
    assert f"  operator_details.csv: 4 {FIA} operator call(s) with shapes" in out
    assert "  operator shapes for 4 of 4 kernel(s) (linked to the operator that launched each through trace_view.json)" in out
    assert (f"{FIA} rows: 3 given Runtime columns (profile_shapes_only), 3 with the operator's shapes in "
            f"'{OPERATOR_SHAPES}'; 1 whose operator shapes differ from the kernel's") in out  # fmt: skip

    rows = by_query(fia_csv(database))
    tnd, mla_decode, mla = rows["128,4,128"], rows["4,16,1,512"], rows["4099,16,128"]
    assert int(tnd["Profiling Count"]) == 2
    assert tnd[OPERATOR_SHAPES] == "128,4,128;12307,128,128;12307,128,128;;2048,2048;;;;;;;;;;128,512"
    assert (tnd[Q_LENS_SHAPE], tnd[KV_LENS_SHAPE], tnd[BLOCK_TABLE_SHAPE]) == ("128", "128", "128,512")
    assert mla[OPERATOR_SHAPES] == MLA_OPERATOR.rstrip(";")  # the operator's 4-D tensors, not the kernel's TND
    assert (mla[Q_LENS_SHAPE], mla[KV_LENS_SHAPE], mla[BLOCK_TABLE_SHAPE]) == ("1", "1", "1,512")
    assert mla_decode[BLOCK_TABLE_SHAPE] == "4,1135"
    for row in (tnd, mla_decode, mla):
        assert row[SOURCE_PROFILE] == "rank0_ascend_pt" and row[COMPLETENESS] == PROFILE_TAG
    assert list(fia_csv(database)[0])[-6:] == [SOURCE_PROFILE, OPERATOR_SHAPES, Q_LENS_SHAPE, KV_LENS_SHAPE, BLOCK_TABLE_SHAPE, COMPLETENESS]


def test_the_trace_links_kernels_exactly_where_operator_details_and_kernels_disagree(tmp_path: Path) -> None:
    fia = launches()
    profile = write_profile(tmp_path, fia)
    details = profile / "ASCEND_PROFILER_OUTPUT" / "operator_details.csv"
    details.write_text(operator_details_text(fia[:1]), encoding="utf-8")  # one call recorded: the trace still links all four
    report = ingest_path(profile, None)
    text = "\n".join(report.lines())
    assert f"  operator_details.csv: 1 {FIA} operator call(s) with shapes" in text
    assert "  operator shapes for 4 of 4 kernel(s) (linked" in text
    rows = {row.cells["Input Shapes"].strip('"').split(";")[0]: row.runtime for row in report.rows if row.kernel_type == FIA}
    assert rows["4099,16,128"][OPERATOR_SHAPES] == MLA_OPERATOR.rstrip(";")


def test_without_a_trace_kernels_pair_with_operator_calls_by_order_only_when_the_counts_agree(tmp_path: Path) -> None:
    fia = launches()
    profile = write_profile(tmp_path / "agree", fia, trace=False)
    report = ingest_path(profile, None)
    text = "\n".join(report.lines())
    assert "  trace_view.json not found beside it: kernels cannot be linked to their operator calls" in text
    assert "operator shapes for 4 of 4 kernel(s) (paired with the operator calls of operator_details.csv in launch order" in text
    mla = next(row.runtime for row in report.rows if row.cells["Input Shapes"].startswith('"4099'))
    assert mla[OPERATOR_SHAPES] == MLA_OPERATOR.rstrip(";")

    profile = write_profile(tmp_path / "disagree", fia, trace=False)
    (profile / "ASCEND_PROFILER_OUTPUT" / "operator_details.csv").write_text(operator_details_text(fia[1:]), encoding="utf-8")
    report = ingest_path(profile, None)
    text = "\n".join(report.lines())
    assert (f"operator_details.csv has 3 {FIA} operator call(s) for 4 kernel(s) and there is no trace_view.json to "
            "link them: no operator shapes taken") in text  # fmt: skip
    assert "  the rows keep the kernel's shapes only" in text
    runtime = [row.runtime for row in report.rows if row.kernel_type == FIA]
    assert [cells[OPERATOR_SHAPES] for cells in runtime] == ["", "", ""]
    assert [cells[KV_LENS_SHAPE] for cells in runtime] == ["128", "4", "1"]  # the kernel's own slots still count


def test_a_kernel_details_file_alone_says_what_is_missing(tmp_path: Path) -> None:
    profile = write_profile(tmp_path, launches(), operator_details=False, trace=False)
    report = ingest_path(profile / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", None)
    text = "\n".join(report.lines())
    assert "operator_details.csv not found beside it (torch_npu writes it with record_shapes=True)" in text
    assert "trace_view.json not found beside it" in text and "the rows keep the kernel's shapes only" in text
    assert f"{FIA} rows: 3 given Runtime columns (profile_shapes_only), 0 with the operator's shapes" in text


def test_a_trace_that_is_not_json_is_one_error_naming_file_line_and_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = write_profile(tmp_path, launches())
    trace = profile / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    trace.write_text('[{"ph": "X",\n "name": }]', encoding="utf-8")
    assert main(["ingest", "--profiling-path", str(profile), "--database-path", str(tmp_path / "db")]) == 2
    err = capsys.readouterr().err
    assert err == f"perfdb ingest: error: {trace}: not JSON: Expecting value at line 2, column 10\n"
    assert not (tmp_path / "db").exists()


def test_a_later_ingest_keeps_the_values_a_serving_run_filled_in(tmp_path: Path) -> None:
    profile = write_profile(tmp_path, launches())
    database = tmp_path / "db"
    assert main(["ingest", "--profiling-path", str(profile), "--database-path", str(database)]) == 0
    path = database / f"{FIA}.csv"
    text = path.read_text(encoding="utf-8")
    rows = list(csv.reader(io.StringIO(text)))
    header = rows[0]
    rows[1][header.index(COMPLETENESS)] = "runtime_values_dumped"  # what perfdb fia-runtime writes
    rows[1][header.index(KV_LENS_SHAPE)] = "128"
    rows[1][header.index(OPERATOR_SHAPES)] = ""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    path.write_text(out.getvalue(), encoding="utf-8")
    before = path.read_bytes()
    assert main(["ingest", "--profiling-path", str(profile), "--database-path", str(database)]) == 0
    assert path.read_bytes() == before  # profiling cells unchanged, the filled row left as it is


def test_a_profile_without_fia_kernels_has_no_bundle_check(tmp_path: Path) -> None:
    output = tmp_path / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    output.mkdir(parents=True)
    (output / "kernel_details.csv").write_bytes((ASCEND / "kernel_details_level1.csv").read_bytes())
    (output / "operator_details.csv").write_bytes((ASCEND / "operator_details_level1.csv").read_bytes())
    report = ingest_path(tmp_path, None)
    assert report.fia_bundle is None and "bundle check" not in "\n".join(report.lines())
    assert all(not row.runtime for row in report.rows)


def test_trace_reader_follows_the_launch_link_to_the_innermost_operator(tmp_path: Path) -> None:
    fia = launches()[:1]
    events = trace_events(fia)
    # an enclosing operator of the same family on the same thread (a wrapper): the inner one launched it
    outer = dict(events[5], ts="1736408883709900.000", dur=400.0, args={"Input Dims": "9,9", "Input type": "float"})
    path = tmp_path / "trace_view.json"
    path.write_text(json.dumps({"traceEvents": [outer, *events]}), encoding="utf-8")
    start = to_ns(fia[0].start)
    assert start == 1736408883716197363  # exact: a float would lose the last digits
    found = launching_operators(read_events(path), [start, to_ns(REAL_TASK["ts"])], is_fia_operator)  # type: ignore[list-item]
    assert list(found) == [start]  # the TransData task has no link to an FIA operator
    assert found[start].name == "npu::npu_fused_infer_attention_score" and found[start].start_ns == to_ns(fia[0].op_ts)
    assert operator_slots(found[start].input_dims) == "128,4,128;12307,128,128;12307,128,128;;2048,2048;;;;;;;;;;128,512"


@pytest.mark.parametrize(("name", "fia"), [
    ("npu::npu_fused_infer_attention_score", True), ("npu::npu_fused_infer_attention_score_v2", True),
    ("aclnnFusedInferAttentionScoreV3", True), ("aten::scaled_dot_product_attention", False),
])  # fmt: skip
def test_fia_operator_names(name: str, fia: bool) -> None:
    assert is_fia_operator(name) is fia


def test_an_operator_details_without_its_columns_is_refused(tmp_path: Path) -> None:
    profile = write_profile(tmp_path, launches(), trace=False)
    (profile / "ASCEND_PROFILER_OUTPUT" / "operator_details.csv").write_text("Op,Shapes\nx,1\n", encoding="utf-8")
    with pytest.raises(DatabaseError, match="not an operator_details.csv: it needs the columns 'Name' and 'Input Shapes'"):
        ingest_path(profile, None)


def test_an_operator_details_that_is_not_text_is_one_error(tmp_path: Path) -> None:
    profile = write_profile(tmp_path, launches(), trace=False)
    details = profile / "ASCEND_PROFILER_OUTPUT" / "operator_details.csv"
    details.write_bytes(b"Name,Input Shapes\n\xff\xfe,1\n")
    with pytest.raises(DatabaseError, match=r"operator_details.csv: not UTF-8 text \(byte 18\)"):
        ingest_path(profile, None)
