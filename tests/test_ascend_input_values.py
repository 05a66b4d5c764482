"""``perfdb ingest`` of an Ascend profile taken with the input-value capture: the values reach the
GroupedMatmul kernel rows through trace_view.json's ``torch_to_npu`` links.

No public profile holds grouped GEMM kernels, let alone a capture's ranges, so the profile is built
from real files and formats, as ``tests/test_fia_bundle.py`` builds its FIA profile:

* the values file is written by a real capture run: torch_npu's ``npu_grouped_matmul`` called on
  the CPU through its real schema (``tests/npu_standin.py``) under ``torch.profiler``; its token and
  call numbers name the ranges below;
* ``kernel_details.csv``: the header and two rows of the real Level1 fixture, unaltered, then one
  row per grouped GEMM launch made from that fixture's MatMulV2 row with its name, type, identity,
  start and duration cells replaced (identity cells in the GroupedMatmul layout of
  ``perf_plugin/replay/kernels/grouped_matmul.py``; empty slots spelled ``DT_UNDEFINED`` / ``NULL``
  as the real FIA database rows spell them);
* ``trace_view.json``: torch_npu's layout (``tests/test_fia_bundle.py``'s process names and two
  verbatim events of the public Level1 trace), and per launch the capture's range and the
  ``npu::npu_grouped_matmul`` operator as ``cpu_op`` events on the Python thread (torch_npu's
  profiler records every ``RecordFunction`` scope, user scopes too, as a ``cpu_op`` named as the
  scope), the device task, and the ``torch_to_npu`` flow pair from the operator to the task, with
  ``ts`` as text (torch_npu's ``convert_ns2us_str``) or as floats (its ``convert_ns2us_float``).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.profiler as tp

from perf_plugin.capture import capture_input_values
from perf_plugin.capture.selection_depth import depth_histogram
from perf_plugin.cli import main
from perf_plugin.database.depths_cell import parse_depths_cell
from perf_plugin.database.quantiles_cell import parse_quantiles_cell
from perf_plugin.database.schema import (
    INPUT_VALUES,
    INPUT_VALUES_SOURCE,
    PROFILING_INPUT_QUANTILES,
    PROFILING_INPUT_ZERO_SHARES,
    PROFILING_SELECTION_DEPTHS,
)
from perf_plugin.database.shapes import parse_shape_cell
from perf_plugin.database.shares_cell import parse_shares_cell as parse_zero_shares_cell
from perf_plugin.ingest.ascend_trace_view import to_ns
from perf_plugin.ingest.ascend_values import AscendValues, DataKernel, link_values, values_cell
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.trace.values_file import CapturedCall, CapturedValues, mark_name, read_values_file, write_values_file
from tests import ascend_profile
from tests.kernels.support import kernel_row, replay_of
from tests.npu_standin import TORCH_NPU, standin
from tests.test_fia_bundle import ASCEND, CANN_PID, HW_PID, PY_PID, REAL_CPU_OP, REAL_TASK

pytestmark = pytest.mark.skipif(standin() is None, reason="a real torch_npu defines these operators")

KERNEL_NAME = "aclnnGroupedMatmulV4_GroupedMatmul_GroupedMatmul"  # <API>_<kernel>_<kernel>, as the FIA kernels' names
OPERATOR = "npu::npu_grouped_matmul"
EVEN, SKEWED = (4, 4, 4, 4), (9, 1, 0, 6)  # rows per expert of 16 rows
UP, DOWN = (16, 32, 8), (16, 8, 32)  # (M, K, N) of the two GEMMs


def ends_of(sizes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sum(sizes[: i + 1]) for i in range(len(sizes)))


@dataclass(frozen=True)
class Launch:
    gemm: tuple[int, int, int]
    mark: str | None  # the capture range around the call (None: called outside the capture)
    op_ts: str  # the operator's start, microseconds with three decimals
    start: str  # the kernel's start
    duration: str


def capture_calls(values_path: Path) -> CapturedValues:
    """A real capture of three grouped GEMM calls (the second gives counts), and one call after it."""
    generator = torch.Generator().manual_seed(0)
    weights = {gemm: torch.randn(4, gemm[1], gemm[2], generator=generator) for gemm in (UP, DOWN)}
    x = {gemm: torch.randn(gemm[0], gemm[1], generator=generator) for gemm in (UP, DOWN)}
    with tp.profile(activities=[tp.ProfilerActivity.CPU], record_shapes=True):
        with capture_input_values(values_path):
            TORCH_NPU.npu_grouped_matmul([x[UP]], [weights[UP]], group_list=torch.tensor(ends_of(SKEWED)), split_item=2)
            TORCH_NPU.npu_grouped_matmul(x=[x[DOWN]], weight=[weights[DOWN]], group_list=torch.tensor(SKEWED),
                                         split_item=2, group_list_type=1)
            TORCH_NPU.npu_grouped_matmul([x[UP]], [weights[UP]], group_list=torch.tensor(ends_of(EVEN)), split_item=2)
        TORCH_NPU.npu_grouped_matmul([x[UP]], [weights[UP]], group_list=torch.tensor(ends_of(EVEN)), split_item=2)
    return read_values_file(values_path)


def launches(token: str) -> list[Launch]:
    return [
        Launch(UP, mark_name(token, 0), "1736408883710011.250", "1736408883716197.363", "58.214"),
        Launch(DOWN, mark_name(token, 1), "1736408883710350.420", "1736408883716402.881", "27.905"),
        Launch(UP, mark_name(token, 2), "1736408883710702.930", "1736408883716600.104", "41.196"),
        Launch(UP, None, "1736408883711040.610", "1736408883716900.517", "40.337"),
    ]


def row_cells(gemm: tuple[int, int, int]) -> dict[str, str]:
    m, k, n = gemm
    empty = ["DT_UNDEFINED"] * 5
    return {"Input Shapes": f'"{m},{k};4,{k},{n};;;;;;4"', "Input Data Types": ";".join(["DT_BF16"] * 2 + empty + ["INT64"]),
            "Input Formats": ";".join(["FORMAT_ND"] * 2 + ["NULL"] * 5 + ["FORMAT_ND"]),
            "Output Shapes": f'"{m},{n}"', "Output Data Types": "DT_BF16", "Output Formats": "FORMAT_ND"}


def kernel_details_text(calls: list[Launch]) -> str:
    return ascend_profile.kernel_details_text(
        {**row_cells(launch.gemm), "Name": KERNEL_NAME, "Type": "GroupedMatmul", "Start Time(us)": launch.start + "\t",
         "Duration(us)": launch.duration} for launch in calls)


def _ts(text: str, floats: bool) -> str | float:
    return float(text) if floats else text


def launch_events(number: int, launch: Launch, floats: bool, operator: str = OPERATOR,
                  kernel: str = KERNEL_NAME) -> list[dict[str, object]]:
    """The range (when captured), the operator inside it, the device task and the flow between them."""
    m, k, n = launch.gemm
    op_ns = to_ns(launch.op_ts)
    assert op_ns is not None
    range_ts = f"{(op_ns - 12_345) // 1000}.{(op_ns - 12_345) % 1000:03d}"
    dims, types = [""] * 2 + [""] * 6 + ["4"], ["TensorList"] * 2 + ["None"] * 6 + ["long int"]
    if operator != OPERATOR:  # aten::topk(self, k, dim, largest, sorted)
        dims, types = [f"{m},{k}", "", "", "", ""], ["float", "Scalar", "Scalar", "Scalar", "Scalar"]
    events: list[dict[str, object]] = [] if launch.mark is None else [
        {"ph": "X", "name": launch.mark, "pid": PY_PID, "tid": PY_PID, "ts": _ts(range_ts, floats), "dur": 131.5,
         "cat": "cpu_op", "args": {"Sequence number": -1, "Fwd thread id": 0}}]
    return events + [
        {"ph": "X", "name": operator, "pid": PY_PID, "tid": PY_PID, "ts": _ts(launch.op_ts, floats), "dur": 96.84,
         "cat": "cpu_op", "args": {"Sequence number": -1, "Fwd thread id": 0, "Input Dims": ";\r\n".join(dims),
                                   "Input type": ";\r\n".join(types), "Call stack": f"moe.py({m}{k}{n}): forward"}},
        {"name": kernel, "pid": HW_PID, "tid": 2, "ts": launch.start, "dur": float(launch.duration),
         "args": {"Model Id": 4294967295, "Task Type": "AI_CORE", "Physic Stream Id": 2, "Task Id": 11300 + number,
                  "Batch Id": 0, "Subtask Id": 4294967295, "connection_id": 1700 + number}, "ph": "X"},
        {"ph": "s", "bp": "e", "name": "torch_to_npu", "id": number + 1, "pid": PY_PID, "tid": PY_PID,
         "ts": _ts(launch.op_ts, floats), "cat": "async_npu"},
        {"ph": "f", "bp": "e", "name": "torch_to_npu", "id": number + 1, "pid": HW_PID, "tid": 2,
         "ts": _ts(launch.start, floats), "cat": "async_npu"},
    ]  # fmt: skip


def trace_events(calls: list[Launch], floats: bool = False) -> list[dict[str, object]]:
    events: list[dict[str, object]] = [
        {"ph": "M", "name": "process_name", "pid": PY_PID, "tid": 0, "args": {"name": "Python"}},
        {"ph": "M", "name": "process_name", "pid": CANN_PID, "tid": 0, "args": {"name": "CANN"}},
        {"ph": "M", "name": "process_name", "pid": HW_PID, "tid": 0, "args": {"name": "Ascend Hardware"}},
        REAL_CPU_OP,
        REAL_TASK,
    ]
    for number, launch in enumerate(calls):
        events += launch_events(number, launch, floats)
    return events


def write_profile(root: Path, calls: list[Launch], *, trace: bool = True, floats: bool = False) -> Path:
    """``root/rank0_ascend_pt/ASCEND_PROFILER_OUTPUT/...``, as tensorboard_trace_handler(root) leaves it."""
    output = root / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    output.mkdir(parents=True)
    (output / "kernel_details.csv").write_text(kernel_details_text(calls), encoding="utf-8")
    if trace:
        (output / "trace_view.json").write_text(json.dumps(trace_events(calls, floats)), encoding="utf-8")
    return root / "rank0_ascend_pt"


def gmm_rows(database: Path) -> list[dict[str, str]]:
    with (database / "GroupedMatmul.csv").open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def recorded(row: dict[str, str]) -> tuple[int, ...] | None:
    return parse_shape_cell(row[INPUT_VALUES])[7] if row.get(INPUT_VALUES) else None


@pytest.mark.parametrize("floats", [False, True], ids=["ts as text", "ts as floats"])
def test_ingest_gives_each_grouped_gemm_row_the_routing_its_call_saw(tmp_path: Path, floats: bool,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    captured = capture_calls(tmp_path / "prof" / "rank0.values.json")  # the directory given to the trace handler
    write_values_file(tmp_path / "prof" / "rank1.values.json", CapturedValues("0ther0rank0", {}))  # another rank's
    profile = write_profile(tmp_path / "prof", launches(captured.token), floats=floats)
    database = tmp_path / "db"
    assert main(["ingest", "--profiling-path", str(profile), "--database-path", str(database)]) == 0
    out = capsys.readouterr().out
    kernel_details = profile / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
    assert (f"input values for {kernel_details} ({tmp_path / 'prof' / 'rank0.values.json'}): 3 of 3 captured call(s) "
            "attached, to 3 kernel launch(es)") in out
    assert "rows whose time depends on input values: 3 measured, 1 with a default" in out
    assert "GroupedMatmul: 1 row(s) replay even groups" in out

    rows = gmm_rows(database)
    by_values = {(row["Input Shapes"], recorded(row)): row for row in rows}
    up, down = row_cells(UP)["Input Shapes"], row_cells(DOWN)["Input Shapes"]
    assert set(by_values) == {(up, ends_of(SKEWED)), (down, ends_of(SKEWED)), (up, ends_of(EVEN)), (up, None)}
    assert by_values[(down, ends_of(SKEWED))][INPUT_VALUES] == '";;;;;;;9,10,10,16"'  # counts recorded as ends
    assert {row[INPUT_VALUES_SOURCE] for key, row in by_values.items() if key[1]} == {"measured"}
    assert by_values[(up, None)][INPUT_VALUES_SOURCE] == "default: even groups"
    assert all(row["Profiling Count"] == "1" for row in rows)


def test_the_replay_builds_the_groups_the_profile_recorded(tmp_path: Path) -> None:
    captured = capture_calls(tmp_path / "rank0.values.json")
    profile = write_profile(tmp_path / "elsewhere", launches(captured.token))  # the values file is not near it
    ingest_path(profile, tmp_path / "db", tmp_path / "rank0.values.json")  # --input-values
    replay = replay_of("GroupedMatmul")
    built = []
    for cells in gmm_rows(tmp_path / "db"):
        row = kernel_row("GroupedMatmul", cells)
        replay.check(row)
        built.append(replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))[7].sizes)
    assert sorted(built) == sorted([SKEWED, SKEWED, EVEN, (4, 4, 4, 4)])  # the last: drawn even, none recorded


def test_without_trace_view_the_values_cannot_reach_the_kernels(tmp_path: Path) -> None:
    captured = capture_calls(tmp_path / "rank0.values.json")
    profile = write_profile(tmp_path, launches(captured.token), trace=False)
    report = ingest_path(profile, None)
    text = "\n".join(report.lines())
    assert "0 of 3 captured call(s) attached" in text
    assert "trace_view.json not found beside it: the captured calls cannot be linked to kernels" in text
    assert report.value_sources.measured == 0 and sum(report.value_sources.defaulted.values()) == 2


def test_a_values_file_of_another_run_is_said_to_be_one(tmp_path: Path) -> None:
    profile = write_profile(tmp_path / "prof", launches("aaaaaaaaaaaa"))
    other = write_values_file(tmp_path / "other.values.json", CapturedValues("bbbbbbbbbbbb", {"0": CapturedCall("x", {})}))
    text = "\n".join(ingest_path(profile, None, other).lines())
    assert "0 of 1 captured call(s) attached" in text and "no capture range of trace_view.json carries" in text
    assert "input values for" not in "\n".join(ingest_path(profile, None).lines())  # none near it: defaults, no report


TOPK_KERNEL = "aclnnTopk_TopkV2_TopKV2"  # the real Level1 profile's TopKV2 row's name
# that row's identity cells: top-5 of 1000 classes for 32 images
TOPK_CELLS = {"Input Shapes": '"32,1000;"', "Input Data Types": "FLOAT;INT32", "Input Formats": "FORMAT_ND;FORMAT_ND",
              "Output Shapes": '"32,5;32,5"', "Output Data Types": "FLOAT;INT32", "Output Formats": "FORMAT_ND;FORMAT_ND"}


def test_a_top_k_row_gets_the_quantiles_its_calls_saw_and_the_replay_draws_from_them(tmp_path: Path) -> None:
    """``torch.topk`` captured (a softmax of near-equal logits: close values), its ``TopKV2`` kernel
    linked through trace_view.json: the row carries the call's quantiles, a call outside the
    capture adds none, and the replay draws its input from them."""
    scores = torch.softmax(torch.randn(32, 1000, generator=torch.Generator().manual_seed(0)) * 0.01, dim=-1)
    with tp.profile(activities=[tp.ProfilerActivity.CPU], record_shapes=True):
        with capture_input_values(tmp_path / "prof" / "rank0.values.json"):
            torch.topk(scores, 5, dim=-1)
    captured = read_values_file(tmp_path / "prof" / "rank0.values.json")
    (call,) = captured.calls.values()
    assert set(call.quantiles) == {0}
    calls = [Launch((32, 1000, 5), mark_name(captured.token, 0), "1736408883710011.250", "1736408883716197.363", "11.9"),
             Launch((32, 1000, 5), None, "1736408883711040.610", "1736408883716900.517", "12.3")]
    output = tmp_path / "prof" / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    output.mkdir(parents=True)
    (output / "kernel_details.csv").write_text(ascend_profile.kernel_details_text(
        {**TOPK_CELLS, "Name": TOPK_KERNEL, "Type": "TopKV2", "Start Time(us)": launch.start + "\t",
         "Duration(us)": launch.duration} for launch in calls), encoding="utf-8")
    events = trace_events([])
    for number, launch in enumerate(calls):
        events += launch_events(number, launch, False, operator="aten::topk", kernel=TOPK_KERNEL)
    (output / "trace_view.json").write_text(json.dumps(events), encoding="utf-8")
    report = ingest_path(output.parent, tmp_path / "db")
    assert "1 of 1 captured call(s) attached, to 1 kernel launch(es)" in "\n".join(report.lines())

    with (tmp_path / "db" / "TopKV2.csv").open(newline="", encoding="utf-8") as handle:
        (row,) = [r for r in csv.DictReader(handle) if r["Input Shapes"] == TOPK_CELLS["Input Shapes"]]
    assert row["Profiling Count"] == "2"  # one row: quantiles do not tell calls apart
    (quantiles,) = parse_quantiles_cell(row[PROFILING_INPUT_QUANTILES])
    assert quantiles == pytest.approx(call.quantiles[0], rel=1e-5)
    x, k = replay_of("TopKV2").make_inputs(kernel_row("TopKV2", row), torch.device("cpu"), torch.Generator().manual_seed(0))
    assert k == 5 and call.quantiles[0][0] <= x.min().item() and x.max().item() <= call.quantiles[0][-1]
    # and its rows' selection depths, to which the replay rebuilds its 32 rows
    assert parse_depths_cell(row[PROFILING_SELECTION_DEPTHS]) == (call.depths[0],)
    assert depth_histogram(x.tolist(), 5, True, "float32") == call.depths[0]


DIV_KERNEL = "aclnnDivs_RealDivAiCore_RealDiv"  # the real Level1 profile's RealDiv rows' name
DIV_CELLS = {"Input Shapes": '"64,16;64,16"', "Input Data Types": "FLOAT;FLOAT", "Input Formats": "FORMAT_ND;FORMAT_ND",
             "Output Shapes": '"64,16"', "Output Data Types": "FLOAT", "Output Formats": "FORMAT_ND"}


def linked_row(tmp_path: Path, token: str, cells: dict[str, str], kernel: str, operator: str) -> dict[str, str]:
    """The database row of one kernel (``cells``: its identity, ``Type`` included) launched by
    ``operator`` inside the capture's first range (``token``), after ``perfdb ingest`` of its
    Ascend profile; the capture's values file is ``tmp_path/prof/rank0.values.json``."""
    launch = Launch((64, 16, 1), mark_name(token, 0), "1736408883728218.784", "1736408883728300.100", "2.1")
    output = tmp_path / "prof" / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    output.mkdir(parents=True)
    (output / "kernel_details.csv").write_text(ascend_profile.kernel_details_text(
        [{**cells, "Name": kernel, "Start Time(us)": launch.start + "\t", "Duration(us)": launch.duration}]),
        encoding="utf-8")
    events = trace_events([]) + launch_events(0, launch, False, operator=operator, kernel=kernel)
    (output / "trace_view.json").write_text(json.dumps(events), encoding="utf-8")
    report = ingest_path(output.parent, tmp_path / "db")
    assert "1 of 1 captured call(s) attached, to 1 kernel launch(es)" in "\n".join(report.lines())
    with (tmp_path / "db" / f"{cells['Type']}.csv").open(newline="", encoding="utf-8") as handle:
        (row,) = csv.DictReader(handle)
    return row


def test_a_division_row_gets_the_share_of_zero_operands_its_call_saw_and_the_replay_zeroes_it(tmp_path: Path) -> None:
    """A router's ``(max - scores) / |scores|.clamp(max)`` captured (one zero numerator a row), its
    ``RealDiv`` kernel linked through trace_view.json: the row carries the shares, and the
    replay's numerator holds that share of zeros."""
    scores = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
    top = scores.max(dim=-1, keepdim=True).values
    with tp.profile(activities=[tp.ProfilerActivity.CPU], record_shapes=True):
        with capture_input_values(tmp_path / "prof" / "rank0.values.json") as capture:
            torch.div(top - scores, scores.abs().clamp(min=top))
    (call,) = capture.values.calls.values()
    assert call.zeros == {0: 1 / 16, 1: 0.0}
    row = linked_row(tmp_path, capture.values.token, {**DIV_CELLS, "Type": "RealDiv"}, DIV_KERNEL, "aten::div")
    assert parse_zero_shares_cell(row[PROFILING_INPUT_ZERO_SHARES]) == (1 / 16, 0.0)
    x, y = replay_of("RealDiv").make_inputs(kernel_row("RealDiv", row), torch.device("cpu"), torch.Generator().manual_seed(0))
    assert int((x == 0).sum()) == 64 and int((y == 0).sum()) == 0


# Named as the real Level1 profile names its MatMulV2 kernels (aclnnAddmm_MatMulCommon_MatMulV2).
BMM_KERNEL = "aclnnBatchMatMul_BatchMatMulCommon_BatchMatMulV2"
BMM_CELLS = {"Type": "BatchMatMulV2", "Input Shapes": '"4,16,64;4,64,32"', "Input Data Types": "FLOAT;FLOAT",
             "Input Formats": "FORMAT_ND;FORMAT_ND", "Output Shapes": '"4,16,32"', "Output Data Types": "FLOAT",
             "Output Formats": "FORMAT_ND"}


def test_a_batched_gemm_row_gets_its_operands_zero_shares_and_the_replay_zeroes_them(tmp_path: Path) -> None:
    """Llama 4's experts: every token times every expert, the tokens routed elsewhere zeroed (3 of
    4 rows), captured around ``torch.bmm``; its ``BatchMatMulV2`` kernel linked through trace_view.json."""
    generator = torch.Generator().manual_seed(0)
    routed = torch.randn(4, 16, 64, generator=generator) * (torch.arange(4).view(4, 1, 1) == torch.arange(16) % 4).view(4, 16, 1)
    with tp.profile(activities=[tp.ProfilerActivity.CPU], record_shapes=True):
        with capture_input_values(tmp_path / "prof" / "rank0.values.json") as capture:
            torch.bmm(routed, torch.randn(4, 64, 32, generator=generator))
    (call,) = capture.values.calls.values()
    assert call.zeros == {0: 0.75, 1: 0.0}
    row = linked_row(tmp_path, capture.values.token, BMM_CELLS, BMM_KERNEL, "aten::bmm")
    assert parse_zero_shares_cell(row[PROFILING_INPUT_ZERO_SHARES]) == (0.75, 0.0)
    a, b = replay_of("BatchMatMulV2").make_inputs(kernel_row("BatchMatMulV2", row), torch.device("cpu"),
                                                  torch.Generator().manual_seed(0))
    assert int((a == 0).sum()) == 4 * 16 * 64 * 3 // 4 and int((b == 0).sum()) == 0


# ----------------------------------------------------------------------------- linking, unit by unit
def _kernel(start: str, slots: str, kernel_type: str = "GroupedMatmul", data: tuple[int, ...] = (7,)) -> DataKernel:
    start_ns = to_ns(start)
    assert start_ns is not None
    return DataKernel((start_ns, KERNEL_NAME), kernel_type, parse_shape_cell(slots), data)


def test_ranges_are_counted_by_what_became_of_them() -> None:
    calls = launches("tok") + [Launch(UP, mark_name("zzz", 0), "1736408883711300.000", "1736408883717100.000", "9.0"),
                               Launch(UP, mark_name("tok", 7), "1736408883711500.000", "1736408883717300.000", "9.0"),
                               Launch(UP, mark_name("tok", 3), "1736408883711700.000", "1736408883717500.000", "9.0")]
    captured = CapturedValues("tok", {"0": CapturedCall("g", {8: ends_of(SKEWED)}), "1": CapturedCall("g", {8: (1, 2, 3)}),
                                      "2": CapturedCall("g", {}), "3": CapturedCall("g", {8: ends_of(EVEN)}),
                                      "4": CapturedCall("g", {8: ends_of(EVEN)})})
    kernels = [_kernel(c.start, '"16,32;4,32,8;;;;;;4"') for c in calls[:-1]]  # the last range's kernel is another type
    report = AscendValues(Path("kernel_details.csv"), captured=5)
    linked = link_values(report, kernels, trace_events(calls), {"tok": captured})
    assert list(linked.values.values()) == ['";;;;;;;9,10,10,16"'] and not linked.quantiles
    assert (report.attached, report.kernels, report.without_slot, report.without_values) == (1, 1, 1, 1)
    assert (report.other_capture, report.without_entry, report.without_kernel) == (1, 1, 1)
    text = "\n".join(report.lines())
    assert "kernels whose row has no data slot (group list, sequence lengths) of the values' length: 1" in text
    assert "calls missing from the profile" in text


def test_the_values_go_to_the_one_data_slot_that_can_hold_them() -> None:
    call = CapturedCall("torch.ops.npu.npu_grouped_matmul_swiglu_quant", {2: (3, 3, 8)})
    swiglu = ("GroupedMatmulSwigluQuant", (4, 5))
    assert values_cell(_kernel("1.0", '"8,32;3,32,16;3,16;8;3"', *swiglu), call) == '";;;;3,3,8"'
    # the A8W4 layout: weight_assistance_matrix (empty) before the group list
    assert values_cell(_kernel("1.0", '"8,32;3,32,16;3,16;8;;3"', *swiglu), call) == '";;;;;3,3,8"'
    assert values_cell(_kernel("1.0", '"8,32;3,32,16;;;;;;4"'), call) is None  # 4 experts, 3 values


# ----------------------------------------------------------------------------- varlen flash attention
TND_SHAPES = '"96,8,64;160,2,64;160,2,64;;;;2048,2048;;3;3;;;;;"'  # a chunked prefill of 3 requests


def test_flash_attention_lengths_go_to_slots_8_and_9_in_argument_order(tmp_path: Path) -> None:
    """A real capture of ``npu_fusion_attention`` in TND: its host lists ``actual_seq_qlen`` and
    ``actual_seq_kvlen`` (arguments 14 and 15) become the row's slots 8 and 9, which the replay reads."""
    from perf_plugin.replay.kernels._flash_varlen import varlen_plan, varlen_reference

    generator = torch.Generator().manual_seed(0)
    q = torch.randn(96, 8, 64, generator=generator).bfloat16()
    k, v = (torch.randn(160, 2, 64, generator=generator).bfloat16() for _ in range(2))
    mask = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
    with capture_input_values(tmp_path / "run.values.json"):
        out, smax, ssum, *_ = TORCH_NPU.npu_fusion_attention(
            q, k, v, 8, "TND", atten_mask=mask, scale=0.125, sparse_mode=3, actual_seq_qlen=[10, 40, 96],
            actual_seq_kvlen=[30, 80, 160])
    (call,) = read_values_file(tmp_path / "run.values.json").calls.values()
    assert call.values == {14: (10, 40, 96), 15: (30, 80, 160)}
    cell = values_cell(_kernel("1.0", TND_SHAPES, "FlashAttentionScore", (8, 9)), call)
    assert cell == '";;;;;;;;10,40,96;30,80,160"'
    # the real Level2 row (SBH) has no length slots: nothing to hold them
    level2 = '"4096,1,2048;4096,1,1024;4096,1,1024;;;;2048,2048;;;;;;;;"'
    assert values_cell(_kernel("1.0", level2, "FlashAttentionScore", (8, 9)), call) is None
    # the row the replay builds from them computes what the operator computed
    cells = {"Input Shapes": TND_SHAPES, "Output Shapes": '"96,8,8;96,8,8;;96,8,64"', INPUT_VALUES: cell,
             "Input Data Types": "DT_BF16;DT_BF16;DT_BF16;DT_BF16;UINT8;DT_BF16;BOOL;INT64;INT64;INT64;INT64;INT64;FLOAT;FLOAT;FLOAT",
             "Output Data Types": "FLOAT;FLOAT;DT_BF16;DT_BF16"}
    plan = varlen_plan(kernel_row("FlashAttentionScore", cells))
    assert (plan.q_lens, plan.kv_lens, plan.scale) == ((10, 30, 56), (30, 50, 80), 0.125)
    reference, peak, total = varlen_reference(q, k, v, plan)
    assert torch.allclose(out.double(), reference, atol=2e-2)
    assert torch.allclose(smax[..., 0].double(), peak, atol=1e-4) and torch.allclose(ssum[..., 0].double(), total, rtol=1e-4)
