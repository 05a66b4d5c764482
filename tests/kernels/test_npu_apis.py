"""Every replay names the API that launches its kernel on an NPU, as the real op_mapping.yaml does.

A replay either overrides ``npu_call`` (it calls a torch_npu or custom-operator API there), or its
portable ``run`` is that call: then ``npu_api`` must be a plain ``torch`` API, and the tests of
its module check that ``run`` dispatches the API's aten operator.
"""

from __future__ import annotations

import pytest

from perf_plugin.replay.base import OpReplay
from perf_plugin.replay.registry import build_catalog
from tests.kernels.support import op_mapping_api

CATALOG = build_catalog()
KERNEL_TYPES = CATALOG.kernel_types()


def _names_its_own_call(replay: OpReplay) -> bool:
    return type(replay).npu_call is not OpReplay.npu_call


@pytest.mark.parametrize("kernel_type", KERNEL_TYPES)
def test_the_api_is_the_one_op_mapping_names(kernel_type: str) -> None:
    expected = op_mapping_api(kernel_type)
    if expected is None:
        pytest.skip(f"the op_mapping files name no API for {kernel_type}")
    assert CATALOG.npu_api(kernel_type) == expected


@pytest.mark.parametrize("kernel_type", KERNEL_TYPES)
def test_a_replay_whose_run_is_the_npu_call_names_a_plain_torch_api(kernel_type: str) -> None:
    replay = CATALOG.replay(kernel_type)
    assert replay is not None and replay.npu_api, f"{kernel_type} declares no npu_api"
    if _names_its_own_call(replay):
        return
    assert replay.portable, f"{kernel_type}: a replay without a portable run must build its NPU call"
    if replay.npu_api == "torch.ops.aten":
        return  # a traced aten operator (``aten.<op>`` rows): run calls that very operator
    assert replay.npu_api.startswith("torch.") and not replay.npu_api.startswith("torch.ops."), (
        f"{kernel_type}: {replay.npu_api} is not reached by a torch operator; override npu_call"
    )


def test_rows_named_after_an_aten_operator_run_that_operator_everywhere() -> None:
    replay = CATALOG.replay("aten.rms_norm")
    assert replay is not None and replay.npu_api == "torch.ops.aten" and not _names_its_own_call(replay)


def test_torch_npu_is_not_needed_to_load_the_catalog() -> None:
    import sys

    assert "torch_npu" not in sys.modules
