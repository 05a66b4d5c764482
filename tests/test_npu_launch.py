"""On an NPU a case runs the API its replay names, not the portable ``run``: the launch path with a
stand-in ``torch_npu`` module (the real one needs an Ascend device).

The stand-in implements the two APIs on the CPU with the documented signatures and counts its
calls; the backend is the CPU's with ``launches_named_apis`` on, as the NPU backend declares.
"""

from __future__ import annotations

import csv
import sys
import types
from pathlib import Path

import pytest
import torch

from perf_plugin.backends.cpu import CpuBackend
from perf_plugin.backends.npu import NpuBackend
from perf_plugin.profiling.msprof import MsprofCollector, read_measured
from perf_plugin.replay.api_call import (
    ACL_FORMATS,
    ApiCall,
    NpuFormat,
    bind_call,
    provider_of,
    resolve_api,
)
from perf_plugin.replay.registry import get_replay
from perf_plugin.run.cases import load_case_set
from perf_plugin.run.runner import CaseFailure, CaseSkip, ReplayRunner
from tests.kernels.support import level2_rows

HEADER = "OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats"


class StandInNpu(CpuBackend):
    """The CPU, launching kernels through the named APIs as the NPU backend does."""

    name = "npu"
    launches_named_apis = True

    def format_cast(self, tensor: torch.Tensor, acl_format: int) -> torch.Tensor:
        return sys.modules["torch_npu"].npu_format_cast(tensor, acl_format)


@pytest.fixture
def torch_npu(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    calls: dict[str, int] = {}

    def npu_rms_norm(x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
        calls["npu_rms_norm"] = calls.get("npu_rms_norm", 0) + 1
        rstd = x.float().square().mean(-1, keepdim=True).add(epsilon).rsqrt()
        return (x.float() * rstd * gamma.float()).to(x.dtype), rstd

    def npu_swiglu(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        calls["npu_swiglu"] = calls.get("npu_swiglu", 0) + 1
        a, b = x.chunk(2, dim)
        return torch.nn.functional.silu(a) * b

    module = types.ModuleType("torch_npu")
    module.npu_rms_norm = npu_rms_norm  # type: ignore[attr-defined]
    module.npu_swiglu = npu_swiglu  # type: ignore[attr-defined]
    module.npu_format_cast = lambda tensor, acl_format: tensor.clone()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    return types.SimpleNamespace(module=module, calls=calls)


def _cases(tmp_path: Path, kernel_type: str, cells: dict[str, str], named_apis: bool) -> list:
    with (tmp_path / f"{kernel_type}.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(HEADER.split(","))
        writer.writerow([cells[column] for column in HEADER.split(",")])
    return [c for c in load_case_set(tmp_path, get_replay, named_apis=named_apis).cases if c.runnable]


@pytest.mark.parametrize("kernel_type", ["RmsNorm", "SwiGlu"])
def test_a_case_on_an_npu_runs_the_named_api_every_time(
    tmp_path: Path, torch_npu: types.SimpleNamespace, kernel_type: str
) -> None:
    cells = min(level2_rows(kernel_type), key=lambda c: len(c["Input Shapes"]))
    (case,) = _cases(tmp_path, kernel_type, cells, named_apis=True)
    backend = StandInNpu()
    collector = MsprofCollector(backend, record_dir=tmp_path / "record")
    ReplayRunner(backend, collector, repeat_count=4, warmup_count=2).run(case)
    api = get_replay(kernel_type).npu_api.rsplit(".", 1)[1]
    assert torch_npu.calls == {api: 1 + 2 + 4}  # verification, warm-up, repeats: never the portable run
    (measured,) = read_measured(tmp_path / "record")
    assert (measured.ref, measured.repeats) == (case.ref, 4)


def test_a_wrong_result_from_the_api_fails_verification(tmp_path: Path, torch_npu: types.SimpleNamespace) -> None:
    torch_npu.module.npu_swiglu = lambda x, dim=-1: x.chunk(2, dim)[0].clone()
    (case,) = _cases(tmp_path, "SwiGlu", level2_rows("SwiGlu")[0], named_apis=True)
    backend = StandInNpu()
    with pytest.raises(CaseFailure, match="relative error"):
        ReplayRunner(backend, MsprofCollector(backend, record_dir=tmp_path), 2, 1).run(case)


def test_a_missing_provider_package_skips_the_case_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import torch_npu raises ImportError
    (case,) = _cases(tmp_path, "RmsNorm", level2_rows("RmsNorm")[0], named_apis=True)
    backend = StandInNpu()
    with pytest.raises(CaseSkip, match="torch_npu.npu_rms_norm needs the package torch_npu"):
        ReplayRunner(backend, MsprofCollector(backend, record_dir=tmp_path), 2, 1).run(case)


def test_npu_formats_are_cast_once_before_the_call() -> None:
    casts: list[int] = []

    def cast(tensor: torch.Tensor, acl_format: int) -> torch.Tensor:
        casts.append(acl_format)
        return tensor * 2

    call = ApiCall("torch.add", (NpuFormat(torch.ones(2), "FRACTAL_NZ"), [NpuFormat(torch.ones(2), "ND")]), {}, None)
    launch = bind_call(call, lambda a, b: a + b[0], cast)
    assert casts == [ACL_FORMATS["FRACTAL_NZ"], ACL_FORMATS["ND"]]
    assert torch.equal(launch(), torch.full((2,), 4.0)) and torch.equal(launch(), torch.full((2,), 4.0))
    assert casts == [29, 2]  # not again per call


def test_outputs_are_selected_in_the_row_order() -> None:
    call = ApiCall("torch.add", (), {}, outputs=(2, 0))
    assert call.select(("a", "b", "c")) == ("c", "a")
    assert ApiCall("torch.add", (), {}, outputs=(1,)).select(("a", "b")) == "b"


@pytest.mark.parametrize(
    ("api", "provider"),
    [
        ("torch_npu.npu_rms_norm", "torch_npu"),
        ("torch.ops._C_ascend.npu_add_rms_norm_bias", "vllm_ascend"),
        ("torch.ops.vllm.qkv_rmsnorm_rope", "vllm_ascend"),
        ("atb._npu_reshape_and_cache", "torch_npu"),
        ("torch.mm", "torch"),
    ],
)
def test_each_namespace_names_the_package_that_provides_it(api: str, provider: str) -> None:
    assert provider_of(api) == provider


def test_apis_resolve_through_their_provider_lazily() -> None:
    imported: list[str] = []
    fake_npu = types.SimpleNamespace(_npu_reshape_and_cache=lambda: "atb")

    def importer(name: str) -> object:
        imported.append(name)
        return {"torch_npu": fake_npu, "torch": torch}[name]

    assert resolve_api("atb._npu_reshape_and_cache", importer)() == "atb"
    assert resolve_api("torch.mm", importer) is torch.mm
    assert imported == ["torch_npu", "torch_npu", "torch", "torch"]


def test_the_npu_backend_declares_named_api_launches() -> None:
    assert NpuBackend.launches_named_apis and not CpuBackend.launches_named_apis


def test_a_replay_with_no_portable_run_is_unsupported_off_the_npu(tmp_path: Path) -> None:
    from perf_plugin.replay.kernels.norm import RmsNormReplay

    class NpuOnly(RmsNormReplay):
        portable = False

    cells = level2_rows("RmsNorm")[0]
    _cases(tmp_path, "RmsNorm", cells, named_apis=False)
    lookup = lambda kernel_type: NpuOnly()  # noqa: E731
    (off,) = load_case_set(tmp_path, lookup, named_apis=False).cases
    (on,) = load_case_set(tmp_path, lookup, named_apis=True).cases
    assert off.status == "unsupported" and "runs only through torch_npu.npu_rms_norm on an Ascend NPU" in off.reason
    assert on.runnable


def test_an_api_that_writes_into_its_arguments_returns_them_as_the_outputs() -> None:
    cache = torch.zeros(4)

    def write(*, cache: torch.Tensor, values: torch.Tensor) -> None:
        cache.copy_(values)

    call = ApiCall("torch.add", (), {"cache": NpuFormat(cache, "ND"), "values": torch.ones(4)}, written=("cache",))
    launch = bind_call(call, write, lambda tensor, acl_format: tensor.clone())  # the cast makes a new tensor
    assert torch.equal(launch(), torch.ones(4)) and torch.equal(cache, torch.zeros(4))  # the cast one was written
