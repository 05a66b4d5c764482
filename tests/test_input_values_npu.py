"""The input-value capture on torch_npu's MoE operators, run on the CPU.

The operators are the stand-ins of ``tests/npu_standin.py``: torch_npu's real schemas (the
2.14.0 wheel's, ``tests/fixtures/torch_npu/schemas.txt``) defined in the ``npu`` namespace, with
CPU kernels.  They are called the ways a model calls them: through the operator packet
(``torch.ops.npu.npu_grouped_matmul``), through torch_npu's binding of it
(``torch_npu.npu_grouped_matmul``, the same object), through an overload (``.default``,
``.List``), with the keywords vllm-ascend passes (``x=[...], weight=[...], group_list_type=1``).
The side-stream copy that an NPU tensor takes cannot run here: its calls are checked against
stand-ins of torch.npu's stream API.
"""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.profiler as tp

from perf_plugin.backends import streams
from perf_plugin.capture import WATCHED, capture_input_values
from perf_plugin.capture.input_values import _resolve
from perf_plugin.trace.values_file import mark_name, parse_mark, read_values_file, sidecar_path
from tests.npu_schemas import load_schemas
from tests.npu_standin import TORCH_NPU, standin

pytestmark = pytest.mark.skipif(standin() is None, reason="a real torch_npu defines these operators")

GMM = "torch.ops.npu.npu_grouped_matmul"
SWIGLU = "torch.ops.npu.npu_grouped_matmul_swiglu_quant"
SIZES = (5, 0, 9, 2)  # rows per expert: uneven, one expert without rows
ENDS = (5, 5, 14, 16)


def _gmm_operands(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(16, 32, generator=generator), torch.randn(4, 32, 8, generator=generator)


def _swiglu_operands() -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randint(-8, 8, (16, 32), generator=generator, dtype=torch.int8)
    w = torch.randint(-8, 8, (4, 32, 16), generator=generator, dtype=torch.int8)
    return x, w, torch.rand(4, 16, generator=generator), torch.rand(16, generator=generator)


def test_the_watched_arguments_are_where_torch_npus_schemas_put_them() -> None:
    schemas = load_schemas()
    for watched in (w for w in WATCHED if w.function.startswith("torch.ops.npu.")):
        for schema in schemas[watched.function.rpartition(".")[2]]:
            names = [p.name for p in schema.params]
            for position, (keyword, python_position) in watched.arguments.items():
                param = schema.params[position]
                assert param.name == keyword, (schema, position)
                assert python_position == (None if param.keyword_only else names.index(keyword)), schema
            if watched.list_type is not None:
                keyword, python_position, _ = watched.list_type
                assert keyword in names and python_position is None and schema.params[names.index(keyword)].keyword_only


def test_an_operator_is_watched_as_its_packet_and_every_overload() -> None:
    packet = torch.ops.npu.npu_grouped_matmul
    assert _resolve(GMM) == [packet, packet.default, packet.List]
    assert TORCH_NPU.npu_grouped_matmul is packet  # torch_npu.<op> is the packet: one object to watch
    assert _resolve("torch.ops.npu.no_such_operator") == [] and _resolve("torch.no_such_function") == []


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Each way of calling, under torch.profiler with the capture; the trace and the results."""
    x, w = _gmm_operands()
    counts, ends = torch.tensor(SIZES), torch.tensor(ENDS)
    sx, sw, ws, xs = _swiglu_operands()
    trace = tmp_path_factory.mktemp("npu") / "trace.json"
    with tp.profile(activities=[tp.ProfilerActivity.CPU], record_shapes=True) as prof:
        with capture_input_values(sidecar_path(trace)):
            results = {
                "packet": torch.ops.npu.npu_grouped_matmul([x], [w], group_list=ends, split_item=2, group_type=0),
                "torch_npu, counts": TORCH_NPU.npu_grouped_matmul(x=[x], weight=[w], group_list=counts, split_item=2,
                                                                  group_type=0, group_list_type=1),
                "overload": torch.ops.npu.npu_grouped_matmul.default([x], [w], group_list=ends, group_list_type=0),
                "int list": torch.ops.npu.npu_grouped_matmul.List([x], [w], group_list=list(SIZES), group_list_type=1),
                "other layout": torch.ops.npu.npu_grouped_matmul([x], [w], group_list=ends, group_list_type=2),
                "swiglu": TORCH_NPU.npu_grouped_matmul_swiglu_quant(sx, sw, ends, ws, xs),
                "no groups": torch.ops.npu.npu_grouped_matmul([x[:4]], [w[0]]),  # group_list None
            }
    prof.export_chrome_trace(str(trace))
    return trace, results


def test_every_call_is_recorded_as_cumulative_ends_whatever_its_layout(captured: tuple[Path, dict[str, Any]]) -> None:
    trace, results = captured
    values = read_values_file(sidecar_path(trace))
    calls = [values.calls[str(n)] for n in range(len(values.calls))]
    assert [c.function for c in calls] == [GMM] * 5 + [SWIGLU] + [GMM]
    assert [c.values for c in calls] == [{8: ENDS}] * 4 + [{}] + [{2: ENDS}] + [{}]
    # the calls ran and returned what the operators compute, counts read as counts
    x, w = _gmm_operands()
    for name in ("packet", "torch_npu, counts", "overload", "int list"):
        assert torch.allclose(results[name][0][5:14], x[5:14] @ w[2], atol=1e-5), name


def test_each_call_runs_inside_its_range_on_its_thread(captured: tuple[Path, dict[str, Any]]) -> None:
    trace, _ = captured
    token = read_values_file(sidecar_path(trace)).token
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    ranges = sorted((e for e in events if parse_mark(e["name"])), key=lambda e: e["ts"])
    assert [e["name"] for e in ranges] == [mark_name(token, n) for n in range(7)]
    operators = [e for e in events if e["name"] in ("npu::npu_grouped_matmul", "npu::npu_grouped_matmul_swiglu_quant")]
    for mark in ranges:
        inside = [op for op in operators if op["tid"] == mark["tid"] and mark["ts"] <= op["ts"]
                  and op["ts"] + op["dur"] <= mark["ts"] + mark["dur"]]
        assert len(inside) == 1, mark["name"]
    assert len(operators) == 7  # each call once: the mode does not see the operator's own dispatch again


# ----------------------------------------------------------------------------- the device's streams
@dataclass(frozen=True)
class FakeDevice:
    type: str
    index: int = 0


class FakeStreamApi:
    """torch.npu's stream API as the copy uses it, recording the calls in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        api = self

        class Stream:
            def __init__(self, device: Any) -> None:
                api.calls.append(("Stream", device))

            def wait_stream(self, other: Any) -> None:
                api.calls.append(("wait_stream", other))

            def synchronize(self) -> None:
                api.calls.append(("synchronize", self))

        self.Stream = Stream
        self.current = object()

    def current_stream(self, device: Any) -> Any:
        self.calls.append(("current_stream", device))
        return self.current

    def stream(self, side: Any) -> Any:
        api = self

        class Context:
            def __enter__(self) -> None:
                api.calls.append(("enter", side))

            def __exit__(self, *exc: Any) -> None:
                api.calls.append(("exit", side))

        return Context()


class OnDevice(torch.Tensor):
    """A CPU tensor that says it lives on ``FakeDevice`` and records the streams it is recorded on."""

    recorded: list[Any] = []

    @property
    def device(self) -> Any:  # type: ignore[override]
        return FakeDevice("npu")

    def record_stream(self, stream: Any) -> None:
        OnDevice.recorded.append(stream)


def test_an_npu_tensor_takes_torch_npus_stream_api(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.SimpleNamespace(Stream=object)
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    monkeypatch.setattr(torch, "npu", fake, raising=False)
    assert streams.stream_api(FakeDevice("npu")) is fake  # type: ignore[arg-type]
    assert streams.stream_api(torch.device("cuda")) is torch.cuda


def test_the_copy_waits_for_the_producer_on_a_side_stream_and_keeps_the_block(monkeypatch: pytest.MonkeyPatch) -> None:
    api = FakeStreamApi()
    monkeypatch.setattr(streams, "stream_api", lambda device: api)
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, pin_memory=False, **k: empty(*a, **k))  # no pinned memory here
    OnDevice.recorded = []
    tensor = torch.tensor([3, 5, 5], dtype=torch.int64).as_subclass(OnDevice)
    side_streams: dict[Any, Any] = {}
    hosts = [streams.copy_to_host(tensor, side_streams) for _ in range(2)]
    side = side_streams[FakeDevice("npu")]
    assert [c[0] for c in api.calls] == ["Stream", "current_stream", "wait_stream", "enter", "exit",
                                        "current_stream", "wait_stream", "enter", "exit"]  # one side stream per device
    assert api.calls[2] == ("wait_stream", api.current) and api.calls[3] == ("enter", side)
    assert OnDevice.recorded == [side, side]
    assert [h.tolist() for h in hosts] == [[3, 5, 5]] * 2 and type(hosts[0]) is torch.Tensor
