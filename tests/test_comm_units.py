"""Unit tests of the collective benchmarks: options, plans, tiers, factors, cells, launch, HCCL set-up."""

from __future__ import annotations

import importlib.util
from datetime import timedelta
from pathlib import Path

import pytest

from perf_plugin.comm.ccl import CCL_SPECS, activate, ccl_version, device_dir_name, output_directory, select_ccl
from perf_plugin.comm.collectives import COLLECTIVES, parse_dtype, parse_op
from perf_plugin.comm.execute import build_buffers, check_result
from perf_plugin.comm.launch import check_visible_devices, rank_info, torchrun_command
from perf_plugin.comm.plan import CommCase, plan_cases
from perf_plugin.comm.record import COLUMNS, CommResult
from perf_plugin.comm.settings import CommConfigError, build_settings, parse_bytes_grid, parse_size
from perf_plugin.comm.timing import MeasurementError, NoDeviceWork, _per_iteration
from perf_plugin.comm.topology import group_tier, parse_grid_shape, run_tier


# ----------------------------------------------------------------------------- sizes
@pytest.mark.parametrize(
    ("text", "expected"),
    [("1024", 1024), ("1K", 1024), ("4k", 4096), ("4KB", 4096), ("1MiB", 1048576), ("512M", 536870912), ("1G", 1073741824)],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["1.5K", "abc", "0", "-4", "4T", ""])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_bytes_grid_lists_ranges_and_repeats() -> None:
    assert parse_bytes_grid("1K,4K,1M") == (1024, 4096, 1048576)
    assert parse_bytes_grid(["1K,4K", "1M", "4096"]) == (1024, 4096, 1048576)  # repeats dropped, order kept
    assert parse_bytes_grid("1K..8K") == (1024, 2048, 4096, 8192)
    assert parse_bytes_grid("512,1K..2K") == (512, 1024, 2048)
    assert parse_bytes_grid("1K 4K, 16K") == (1024, 4096, 16384)  # the seed's space-separated lists, quoted
    assert parse_bytes_grid(None) is None
    with pytest.raises(ValueError):
        parse_bytes_grid("8K..1K")


def test_settings_name_the_bad_option() -> None:
    with pytest.raises(CommConfigError, match=r"^--comm-dtypes: unknown dtype 'bf17'"):
        build_settings(dtypes="bf16,bf17")
    with pytest.raises(CommConfigError, match=r"^--comm-ops: unknown collective 'broadcast'"):
        build_settings(ops="all_reduce,broadcast")
    with pytest.raises(CommConfigError, match=r"^--bytes-grid: '1\.5K' is not a byte size"):
        build_settings(bytes_grid="1.5K")
    with pytest.raises(CommConfigError, match=r"^--topology-tier: '3'"):
        build_settings(topology_tier="3")
    with pytest.raises(CommConfigError, match=r"^--comm-iters: 0 is below 1"):
        build_settings(iters="0")
    with pytest.raises(CommConfigError, match=r"^--grid-shape: grid shape 8 must have 2 dimensions"):
        build_settings(grid_shape="8")


def test_dtype_and_op_spellings() -> None:
    assert [parse_dtype(t).db_name for t in ("bf16", "torch.bfloat16", "DT_BF16", "fp16", "float32", "int8")] == [
        "DT_BF16", "DT_BF16", "DT_BF16", "DT_FP16", "DT_FLOAT", "DT_INT8",
    ]
    assert [parse_op(t).name for t in ("allReduce", "hcom_allGather_", "reduce_scatter_tensor", "alltoallv")] == [
        "all_reduce", "all_gather", "reduce_scatter", "all_to_all",
    ]
    assert [c.file_name for c in COLLECTIVES.values()] == [
        "hcom_allReduce_.csv", "hcom_allGather_.csv", "hcom_reduceScatter_.csv", "hcom_alltoallv_.csv",
    ]


# ----------------------------------------------------------------------------- bus bandwidth factors
@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [
        ("all_reduce", 1, 0.0), ("all_reduce", 2, 1.0), ("all_reduce", 4, 1.5), ("all_reduce", 8, 1.75),
        ("all_gather", 2, 0.5), ("all_gather", 8, 0.875), ("reduce_scatter", 4, 0.75), ("all_to_all", 16, 0.9375),
    ],
)
def test_bus_factor_is_nccl_tests(op: str, n: int, factor: float) -> None:
    assert COLLECTIVES[op].bus_factor(n) == factor


# ----------------------------------------------------------------------------- topology tiers
def test_group_tier_on_a3_and_a2_grids() -> None:
    a3, a2 = (48, 8, 2), (128, 8)
    assert group_tier(a3, [0, 1]) == 2  # the two dies of one chip
    assert group_tier(a3, [1, 2]) == 1  # two chips of one pod
    assert group_tier(a3, list(range(16))) == 1
    assert group_tier(a3, list(range(16, 32))) == 1
    assert group_tier(a3, list(range(32))) == 0
    assert group_tier(a3, [15, 16]) == 0
    assert group_tier(a2, list(range(8))) == 1  # A2 has no die level
    assert group_tier(a2, [0, 1]) == 1
    assert group_tier(a2, list(range(16))) == 0
    with pytest.raises(ValueError, match="outside the grid"):
        group_tier((2, 2), [0, 4])


def test_run_tier_takes_the_lowest_group() -> None:
    assert run_tier((48, 8, 2), 32, 2) == 2
    assert run_tier((48, 8, 2), 32, 16) == 1
    assert run_tier((48, 8, 2), 6, 3) == 1  # [0,1,2] and [3,4,5] cross chips, stay in the pod
    assert run_tier((128, 8), 24, 3) == 0  # [6,7,8] crosses pods
    assert run_tier((2, 4), 8, 4) == 1 and run_tier((2, 4), 8, 8) == 0


def test_parse_grid_shape_spellings() -> None:
    assert parse_grid_shape("48 8 2") == parse_grid_shape("48,8,2") == parse_grid_shape("48x8x2") == (48, 8, 2)
    for bad in ("8", "1 2 3 4", "a b", "0 8"):
        with pytest.raises(ValueError):
            parse_grid_shape(bad)


# ----------------------------------------------------------------------------- plans
def test_plan_order_ids_and_default_grids() -> None:
    settings = build_settings(ops="all_reduce,all_to_all", dtypes="bf16,int8", num_devices="2,4", bytes_grid="1K,4K")
    plan = plan_cases(settings, world_size=4, local_world_size=4, ccl="gloo")
    ids = [case.id for case in plan.cases]
    assert ids[:4] == ["all_reduce-n2-bf16-1024B", "all_reduce-n2-bf16-4096B", "all_reduce-n2-int8-1024B", "all_reduce-n2-int8-4096B"]
    assert len(ids) == 2 * 2 * 2 * 2 and ids[-1] == "all_to_all-n4-int8-4096B"
    assert plan.grid == (1, 4) and {case.topology_tier for case in plan.cases} == {1}
    gloo = plan_cases(build_settings(), 2, 2, "gloo")
    assert [c.message_bytes for c in gloo.cases if c.op.name == "all_reduce"] == [2**k for k in range(10, 21)]
    nccl = plan_cases(build_settings(), 2, 2, "nccl")
    assert [c.message_bytes for c in nccl.cases if c.op.name == "all_reduce"] == [2**k for k in range(10, 30)]
    hccl = plan_cases(build_settings(num_devices="16,2"), 16, 16, "hccl")  # the seed's example
    assert hccl.grid == (48, 8, 2)
    assert {(c.num_devices, c.topology_tier) for c in hccl.cases} == {(16, 1), (2, 2)}


def test_default_grid_rounds_to_whole_chunks() -> None:
    plan = plan_cases(build_settings(ops="all_gather", dtypes="fp32"), 3, 3, "gloo")
    assert plan.cases[0].message_bytes == 1020  # 1024 rounded down to 12-byte multiples
    assert all(case.message_bytes % 12 == 0 for case in plan.cases)


def test_plan_rejects_what_cannot_run() -> None:
    with pytest.raises(CommConfigError, match="a group of 2 devices needs at least 2 ranks, but this run has 1"):
        plan_cases(build_settings(num_devices="2"), 1, 1, "gloo")
    with pytest.raises(CommConfigError, match="a group of 3 devices does not divide the world of 4 ranks"):
        plan_cases(build_settings(num_devices="3"), 4, 4, "gloo")
    with pytest.raises(CommConfigError, match="1026 bytes is not a multiple of 4 .all_gather of bf16 over 2 devices"):
        plan_cases(build_settings(ops="all_gather", bytes_grid="1026"), 2, 2, "gloo")
    with pytest.raises(CommConfigError, match="8 ranks do not fit the grid 2 2"):
        plan_cases(build_settings(grid_shape="2 2"), 8, 8, "gloo")
    plan = plan_cases(build_settings(ops="all_reduce", bytes_grid="1026"), 2, 2, "gloo")
    assert plan.cases[0].message_bytes == 1026  # all_reduce only needs whole elements


# ----------------------------------------------------------------------------- cells
def test_cells_agree_with_each_other() -> None:
    case = CommCase(COLLECTIVES["all_reduce"], 4, parse_dtype("bf16"), 1048576, 1)
    result = CommResult(case, (10.0, 12.0, 20.0), "kernel", "nccl", 8, "2026-01-01T00:00:00Z")
    cells = result.cells()
    assert list(cells) == list(COLUMNS)
    assert cells["Duration(us)"] == "14"
    assert cells["Median Duration(us)"] == "12"
    assert cells["bandwidth_gbps"] == f"{1048576 / 14e3:.6f}"  # 74.898286
    assert cells["bus_bandwidth_gbps"] == f"{1048576 / 14e3 * 1.5:.6f}".rstrip("0")
    assert cells["message_bytes"] == cells["nccl_tests_bytes"] == "1048576"
    assert (cells["dtype"], cells["iterations"], cells["mode"], cells["backend"], cells["world_size"]) == (
        "DT_BF16", "3", "kernel", "nccl", "8",
    )
    with pytest.raises(ValueError):
        CommResult(case, (1.0, 0.0), "kernel", "nccl", 8, "")


# ----------------------------------------------------------------------------- buffers (CPU, no process group)
def _case(op: str, n: int, dtype: str, count: int) -> CommCase:
    d = parse_dtype(dtype)
    return CommCase(COLLECTIVES[op], n, d, count * d.itemsize, 1)


def test_all_to_all_expects_its_chunk_of_every_sender() -> None:
    buffers = build_buffers(_case("all_to_all", 2, "fp32", 8), group_rank=1, device="cpu")
    assert buffers.send.tolist() == [float((8 + i) % 127 + 1) for i in range(8)]
    # sender 0 sends elements 4..7 of its pattern (starting at 0) to rank 1, sender 1 elements 4..7 of its own
    assert buffers.expected.tolist() == [5.0, 6.0, 7.0, 8.0, 13.0, 14.0, 15.0, 16.0]
    buffers.receive.copy_(buffers.expected)
    assert check_result(buffers) is None
    buffers.receive[6] = 0
    assert check_result(buffers) == "1 of 8 elements differ (exactly); first at index 6: got 0.0, expected 15.0"


def test_reductions_stay_exact_and_int8_wraps_beyond_127_ranks() -> None:
    buffers = build_buffers(_case("reduce_scatter", 4, "bf16", 8), group_rank=3, device="cpu")
    q = 127 // 4
    sums = [sum((r + i) % q + 1 for r in range(4)) for i in range(8)]
    assert buffers.expected.tolist() == [float(v) for v in sums[6:8]] and buffers.rtol == 0.0
    wide = build_buffers(_case("all_reduce", 200, "int8", 4), group_rank=0, device="cpu")
    assert wide.expected.tolist() == [200 - 256] * 4  # two's-complement int8 sum of 200 ones
    assert build_buffers(_case("all_reduce", 300, "bf16", 4), 0, "cpu").rtol == 300 * 2.0**-7


def test_per_iteration_spans() -> None:
    assert _per_iteration([(0.0, 5.0), (10.0, 12.0), (20.0, 21.5)], 3, "kernels") == [5.0, 2.0, 1.5]
    # two kernels per call: each iteration spans both
    assert _per_iteration([(0, 2), (3, 5), (10, 11), (11, 14)], 2, "kernels") == [5, 4]
    with pytest.raises(MeasurementError, match="the profile of 3 calls holds 2 kernels"):
        _per_iteration([(0, 1), (2, 3)], 3, "kernels")
    with pytest.raises(NoDeviceWork, match="the collective ran no device work"):
        _per_iteration([], 3, "kernels")


# ----------------------------------------------------------------------------- launch
def test_rank_info_and_torchrun_command() -> None:
    assert rank_info({}).launched is False and rank_info({}).world_size == 1
    env = {"TORCHELASTIC_RUN_ID": "x", "RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8"}
    info = rank_info(env)
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size, info.launched) == (5, 16, 1, 8, True)
    with pytest.raises(CommConfigError):
        rank_info({"TORCHELASTIC_RUN_ID": "x", "RANK": "a", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    command = torchrun_command(4, ["bench", "-m", "comm"], python="/usr/bin/python3")
    assert command == [
        "/usr/bin/python3", "-m", "perf_plugin.comm.torchrun_agent", "--standalone", "--nproc-per-node", "4",
        "-m", "pytest", "bench", "-m", "comm",
    ]


# ----------------------------------------------------------------------------- HCCL (no NPU, no torch_npu needed)
def test_hccl_process_group_and_device_construction(tmp_path: Path) -> None:
    spec = select_ccl("auto", "npu")
    assert spec is CCL_SPECS["hccl"]
    assert spec.init_kwargs(30) == {"backend": "hccl", "init_method": "env://", "timeout": timedelta(seconds=30)}
    assert spec.device_string(3) == "npu:3"
    assert spec.visible_devices_var == "ASCEND_RT_VISIBLE_DEVICES"
    settings = build_settings(cann_version="8.5")
    assert ccl_version(spec, settings) == "8.5"
    assert device_dir_name(spec, settings) == "ATLAS_800_A3_752T_128G_DIE"
    assert output_directory(spec, settings, tmp_path) == tmp_path / "database/data/ATLAS_800_A3_752T_128G_DIE/hccl/v8.5"
    with pytest.raises(CommConfigError, match="ASCEND_RT_VISIBLE_DEVICES lists 2"):
        check_visible_devices(spec.visible_devices_var, 4, {"ASCEND_RT_VISIBLE_DEVICES": "4,5"})
    check_visible_devices(spec.visible_devices_var, 2, {"ASCEND_RT_VISIBLE_DEVICES": "4,5"})
    assert select_ccl("gloo", "npu") is CCL_SPECS["gloo"]  # --comm-backend wins
    assert select_ccl("auto", "cuda").init_kwargs(5)["backend"] == "nccl"


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="torch_npu is installed here")
def test_hccl_without_torch_npu_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(CommConfigError, match="hccl backend cannot bind LOCAL_RANK 0: the npu backend needs torch_npu"):
        activate(CCL_SPECS["hccl"], 0)
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(tmp_path))  # a toolkit directory with no version.info
    with pytest.raises(CommConfigError, match="give --cann-version"):
        ccl_version(CCL_SPECS["hccl"], build_settings())


def test_gloo_directory_names(tmp_path: Path) -> None:
    import platform

    import torch

    spec = CCL_SPECS["gloo"]
    expected = tmp_path / "database" / "data" / f"CPU_{platform.machine().upper()}" / "gloo" / torch.__version__.split("+")[0]
    assert output_directory(spec, build_settings(), tmp_path) == expected
    assert output_directory(spec, build_settings(output_dir=tmp_path / "x"), tmp_path) == tmp_path / "x"
    assert output_directory(spec, build_settings(device="MY_BOX", ccl_version="9"), tmp_path) == (
        tmp_path / "database" / "data" / "MY_BOX" / "gloo" / "9"
    )
    with pytest.raises(CommConfigError, match="cannot be a directory name"):
        output_directory(spec, build_settings(device="../x"), tmp_path)
