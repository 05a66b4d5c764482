"""Collective CSVs this project writes, read the way the Ascend performance model reads them.

The reader (``CommReader`` below) is re-implemented from msmodeling, repository Ascend/msmodeling:

* ``tensor_cast/performance_model/profiling_database/profiling_data_source.py`` at commits
  8a2288d1905a70a3b566668044eb9a6c4ffd31eb and a1c842ec67e2877c046f7d109bd63fdcbc114c77
  (the communication path is the same in both): ``ProfilingDataSource.__init__`` resolves
  ``communication_data_ref`` of ``op_mapping.yaml`` against the op_mapping's directory;
  ``_load_csv`` reads ``hcom_*`` kernel types from that directory first, then from the
  op_mapping's, with ``pandas.read_csv``; ``_latency_col`` prefers ``Average Duration(us)``, then
  ``Profiling Average Duration(us)``, else ``Duration(us)``, and ``_row_latency_value`` (a1c842e)
  takes a row's first finite positive value in that order; ``_query_comm_csv`` needs
  ``message_bytes`` and ``num_devices`` columns and matches them exactly, ``topology_tier`` too
  when the model has a communication grid and the file the column, the first matching row
  winning, and only then interpolates; ``_lookup_comm`` computes ``message_bytes`` as
  ``args[0].nelement() * args[0].element_size()`` of the model's call, divided by
  ``len(rank_group)`` for ``tensor_cast.reduce_scatter.default`` (whose ``args[0]`` is the full
  input), and reads no dtype.
* ``tools/perf_data_collection/comm_bench/generate_comm_microbench.py`` at commit
  56a17ec8b04fb2402c68615acf31ee1805fd7da2: the HCCL microbenchmark that writes the files the
  model reads, its ``_DTYPE_TO_CSV`` spellings and the same sizes per op.
* ``tensor_cast/performance_model/calibration/comm_build.py`` at commit
  402db6f0a1b2e78b78d6a8f6a68ca9c692dc22f4: the calibration reader of the same files, which needs
  ``message_bytes, num_devices, dtype, topology_tier, Duration(us)``, a dtype of ``DT_BF16,
  DT_FP16, DT_FLOAT``, a group of more than one device and one row per (dtype, group size, tier,
  message_bytes).

The op_mapping.yaml files are the real ones of tests/fixtures/ascend (SOURCES.md).
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from perf_plugin.comm.ccl import output_directory, select_ccl
from perf_plugin.comm.collectives import COLLECTIVES, COMM_DTYPES, Collective, CommDtype
from perf_plugin.comm.plan import CommCase
from perf_plugin.comm.record import CommResult
from perf_plugin.comm.settings import build_settings
from perf_plugin.comm.writer import upsert_result
from tests.ascend_reader import first_latency
from tests.conftest import ASCEND

DEVICE = "ATLAS_800_A3_752T_128G_DIE"
OP_MAPPINGS = {
    "vllm0.18.0_torch2.9.0_cann8.5": ASCEND / "op_mapping_vllm0.18.0_torch2.9.0_cann8.5.yaml",
    "vllm0.13.0_torch2.8.0_cann8.3": ASCEND / "op_mapping_vllm0.13.0_torch2.8.0_cann8.3.yaml",
}
LATENCY_COLUMNS = ("Average Duration(us)", "Profiling Average Duration(us)", "Duration(us)")
TC_OPS = {  # the model's operator of each collective (keys of op_mapping.yaml)
    "all_reduce": "tensor_cast.all_reduce.default",
    "all_gather": "tensor_cast.all_gather.default",
    "reduce_scatter": "tensor_cast.reduce_scatter.default",
    "all_to_all": "tensor_cast.all_to_all.default",
}
# generate_comm_microbench.py _DTYPE_TO_CSV
MICROBENCH_DTYPES = {
    "torch.bfloat16": "DT_BF16",
    "torch.float16": "DT_FP16",
    "torch.float32": "DT_FLOAT",
    "torch.int8": "DT_INT8",
}
CALIBRATION_DTYPES = {"DT_BF16", "DT_FP16", "DT_FLOAT"}  # comm_build.py _DTYPES
CALIBRATION_COLUMNS = {"message_bytes", "num_devices", "dtype", "topology_tier", "Duration(us)"}


class CommReader:
    """ProfilingDataSource's communication lookup, exact matches only (no interpolation)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        op_mapping = yaml.safe_load((data_dir / "op_mapping.yaml").read_text(encoding="utf-8")) or {}
        self.mappings: dict[str, dict[str, object]] = op_mapping.get("operator_mappings", {})
        ref = op_mapping.get("communication_data_ref")
        self.comm_dir = (data_dir / ref).resolve() if ref else data_dir

    def load_csv(self, kernel_type: str) -> pd.DataFrame | None:
        path = self.data_dir / f"{kernel_type}.csv"
        if kernel_type.startswith("hcom_"):
            preferred = self.comm_dir / f"{kernel_type}.csv"
            path = preferred if preferred.exists() else path
        return pd.read_csv(path) if path.exists() else None

    @staticmethod
    def row_latency(row: pd.Series, preferred: str) -> float | None:
        found = first_latency(row, preferred)  # the same per-row fallback as the kernel lookup
        return found[1] if found is not None else None

    def query(self, kernel_type: str, message_bytes: int, num_devices: int, tier: int | None) -> float | None:
        df = self.load_csv(kernel_type)
        if df is None or not {"message_bytes", "num_devices"} <= set(df.columns):
            return None
        preferred = next((c for c in LATENCY_COLUMNS if c in df.columns), LATENCY_COLUMNS[-1])
        mask = (df["message_bytes"] == message_bytes) & (df["num_devices"] == num_devices)
        if tier is not None and "topology_tier" in df.columns:
            mask = mask & (df["topology_tier"] == tier)
        for _, row in df[mask].iterrows():
            latency = self.row_latency(row, preferred)
            if latency is not None:
                return latency
        return None

    def lookup(self, func: str, first_arg: torch.Tensor, rank_group: list[int], tier: int | None) -> float | None:
        mapping = self.mappings[func]
        assert mapping.get("category") == "communication"
        message_bytes = first_arg.nelement() * first_arg.element_size()
        if func == "tensor_cast.reduce_scatter.default" and len(rank_group) > 1:
            message_bytes //= len(rank_group)
        return self.query(str(mapping["kernel_type"]), message_bytes, len(rank_group), tier)


def model_first_arg(op: Collective, dtype: CommDtype, nccl_tests_bytes: int, n: int) -> torch.Tensor:
    """``args[0]`` of the model's call for a case of nccl-tests' size: all_gather passes one rank's
    input; all_reduce its buffer, reduce_scatter its full input, all_to_all all it sends."""
    elements = nccl_tests_bytes // dtype.itemsize
    if op.name == "all_gather":
        elements //= n
    return torch.empty(elements, dtype=getattr(torch, dtype.torch_name), device="meta")


def ascend_database(root: Path, version_dir: str) -> Path:
    """A database root with the real op_mapping.yaml of ``version_dir`` in its place."""
    data_dir = root / DEVICE / "vllm_ascend" / version_dir
    data_dir.mkdir(parents=True)
    shutil.copy(OP_MAPPINGS[version_dir], data_dir / "op_mapping.yaml")
    return data_dir


def measure(directory: Path, op: str, n: int, dtype: str, nccl_tests_bytes: int, tier: int, duration: float) -> CommResult:
    case = CommCase(COLLECTIVES[op], n, COMM_DTYPES[dtype], nccl_tests_bytes, tier)
    result = CommResult(case, (duration, duration + 2.0), "kernel", "hccl", 16, "2026-01-01T00:00:00Z")
    upsert_result(directory, result)
    return result


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize("version_dir", list(OP_MAPPINGS))
def test_hccl_results_go_where_the_op_mapping_points(tmp_path: Path, version_dir: str) -> None:
    cann = yaml.safe_load(OP_MAPPINGS[version_dir].read_text(encoding="utf-8"))["cann_version"]
    reader = CommReader(ascend_database(tmp_path / "database" / "data", version_dir))
    written_to = output_directory(select_ccl("hccl"), build_settings(cann_version=cann), tmp_path)
    assert written_to.resolve() == reader.comm_dir
    assert written_to.name == f"v{cann}"  # v8.5, v8.3.RC1


@pytest.mark.parametrize("dtype", list(COMM_DTYPES))
def test_every_written_row_is_found_at_the_size_the_model_computes(tmp_path: Path, dtype: str) -> None:
    """One database per dtype: the reader reads no dtype, so two dtypes of one size are one row to it."""
    root = tmp_path / "database" / "data"
    reader = CommReader(ascend_database(root, "vllm0.18.0_torch2.9.0_cann8.5"))
    directory = output_directory(select_ccl("hccl"), build_settings(cann_version="8.5"), tmp_path)
    written = []
    duration = 10.0
    for op in COLLECTIVES:
        for n, tier in ((2, 2), (8, 1), (16, 1)):
            for size in (4096, 65536, 1048576):  # nccl-tests' size: whole elements per rank for every n
                duration += 1.0  # every row its own duration, so a wrong row cannot pass
                written.append(measure(directory, op, n, dtype, size, tier, duration))
    for result in written:
        case = result.case
        first_arg = model_first_arg(case.op, case.dtype, case.message_bytes, case.num_devices)
        found = reader.lookup(TC_OPS[case.op.name], first_arg, list(range(case.num_devices)), case.topology_tier)
        assert found == float(result.cells()["Duration(us)"]), case.id
        # a model without a communication grid queries without a tier: still this row
        assert reader.lookup(TC_OPS[case.op.name], first_arg, list(range(case.num_devices)), None) is not None


def test_rows_state_nccl_tests_size_and_both_bandwidths(tmp_path: Path) -> None:
    for op, n in (("all_reduce", 4), ("all_gather", 8), ("reduce_scatter", 2), ("all_to_all", 16)):
        measure(tmp_path, op, n, "bf16", 1048576, 1, 14.0)
    for op in COLLECTIVES.values():
        (row,) = read_rows(tmp_path / op.file_name)
        size, n, nccl = int(row["message_bytes"]), int(row["num_devices"]), int(row["nccl_tests_bytes"])
        assert nccl == 1048576
        assert size == (nccl // n if op.name in ("all_gather", "reduce_scatter") else nccl)
        duration = float(row["Duration(us)"])
        assert row["bandwidth_gbps"] == f"{size / (duration * 1e3):.6f}".rstrip("0").rstrip(".")
        # nccl-tests' busbw: its size over the time, times 2(n-1)/n for all_reduce, (n-1)/n otherwise
        factor = 2 * (n - 1) / n if op.name == "all_reduce" else (n - 1) / n
        assert row["bus_bandwidth_gbps"] == f"{nccl / (duration * 1e3) * factor:.6f}".rstrip("0").rstrip(".")


def test_a_stale_average_never_shadows_the_fresh_measurement(tmp_path: Path) -> None:
    """The reader prefers ``Average Duration(us)``: a file that has it gets the new mean there too."""
    root = tmp_path / "database" / "data"
    reader = CommReader(ascend_database(root, "vllm0.18.0_torch2.9.0_cann8.5"))
    directory = root / DEVICE / "hccl" / "v8.5"
    directory.mkdir(parents=True)
    # an existing row of the Ascend microbenchmark's format, with an enriched average: 1 MiB gathered over 8
    (directory / "hcom_allGather_.csv").write_text(
        "message_bytes,num_devices,dtype,topology_tier,Duration(us),bandwidth_gbps,Average Duration(us)\n"
        "131072,8,DT_BF16,1,99.0,1.32,98.0\n"
    )
    result = measure(directory, "all_gather", 8, "bf16", 1048576, 1, 30.0)
    rows = read_rows(directory / "hcom_allGather_.csv")
    assert len(rows) == 1 and rows[0]["Average Duration(us)"] == rows[0]["Duration(us)"] == "31"
    first_arg = model_first_arg(result.case.op, result.case.dtype, 1048576, 8)
    assert reader.lookup(TC_OPS["all_gather"], first_arg, list(range(8)), 1) == 31.0


def test_dtype_spellings_are_the_ascend_microbenchmarks(tmp_path: Path) -> None:
    for dtype in COMM_DTYPES.values():
        assert dtype.db_name == MICROBENCH_DTYPES[f"torch.{dtype.torch_name}"]
    for dtype in COMM_DTYPES:
        measure(tmp_path, "all_reduce", 2, dtype, 4096, 2, 5.0)
    assert [row["dtype"] for row in read_rows(tmp_path / "hcom_allReduce_.csv")] == [
        "DT_BF16", "DT_FP16", "DT_FLOAT", "DT_INT8",
    ]


def test_the_calibration_reader_accepts_a_float_database(tmp_path: Path) -> None:
    """comm_build.py refuses a whole file for one row it cannot take: none of ours may be one."""
    for op in COLLECTIVES:
        for dtype in ("bf16", "fp16", "fp32"):
            for n, tier in ((2, 2), (16, 1)):
                for size in (4096, 65536):
                    measure(tmp_path, op, n, dtype, size, tier, 7.0)
    for op in COLLECTIVES.values():
        rows = read_rows(tmp_path / op.file_name)
        assert CALIBRATION_COLUMNS <= set(rows[0])
        keys = set()
        for row in rows:
            assert row["dtype"] in CALIBRATION_DTYPES
            assert int(row["message_bytes"]) > 0 and int(row["num_devices"]) > 1 and int(row["topology_tier"]) >= 0
            assert float(row["Duration(us)"]) >= 0
            keys.add((row["dtype"], row["num_devices"], row["topology_tier"], row["message_bytes"]))
        assert len(keys) == len(rows) == 12
