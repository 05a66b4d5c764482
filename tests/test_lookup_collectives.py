"""``lookup_collective``: durations of collectives from ``hcom_{op}_.csv`` files the project's own
collective writer (``perf_plugin.comm.writer.upsert_result``) wrote: exact rows, alpha-beta
interpolation between two sizes, a fitted fallback outside the measured sizes, and no answer.

No real collective CSV is among the fixtures (the Ascend profiles' ``hcom_*`` kernels carry no
message sizes), so every file here is written by the writer, as a benchmark run writes it.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import lsq_linear

from perf_plugin.comm import record
from perf_plugin.comm.ccl import output_directory, select_ccl
from perf_plugin.comm.collectives import COLLECTIVES, COMM_DTYPES
from perf_plugin.comm.plan import CommCase
from perf_plugin.comm.record import COLUMNS, CommResult
from perf_plugin.comm.settings import build_settings
from perf_plugin.comm.writer import upsert_result
from perf_plugin.database.errors import DatabaseError
from perf_plugin.lookup import collectives
from perf_plugin.lookup.answer import CollectiveQuery
from perf_plugin.lookup.collectives import file_name, fit_alpha_beta, lookup_collective, normalise_comm_dtype
from tests.conftest import ASCEND

ALL_REDUCE = "hcom_allReduce_.csv"


def measure(directory: Path, op: str, n: int, nccl_tests_bytes: int, duration: float, tier: int = 1,
            dtype: str = "bf16", mode: str = "kernel") -> None:
    """One row through the writer; two equal samples, so ``Duration(us)`` is ``duration``."""
    case = CommCase(COLLECTIVES[op], n, COMM_DTYPES[dtype], nccl_tests_bytes, tier)
    upsert_result(directory, CommResult(case, (duration, duration), mode, "hccl", 16, "2026-01-01T00:00:00Z"))


def line_of(path: Path, **cells: str) -> int:
    """The CSV line (header = 1) of the first row with these cells."""
    with path.open(newline="", encoding="utf-8") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            if all(row[k] == v for k, v in cells.items()):
                return line
    raise AssertionError(cells)


def q(message_bytes: int, devices: int, op: str = "allreduce", tier: str = "", dtype: str = "") -> CollectiveQuery:
    return CollectiveQuery(op, message_bytes, devices, tier, dtype)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("hccl") / "v8.5"
    for size, duration in ((1024, 20.0), (4096, 26.0), (65536, 50.0), (1048576, 400.0)):
        measure(directory, "all_reduce", 8, size, duration)
    for size, duration in ((1024, 8.0), (4096, 9.0)):
        measure(directory, "all_reduce", 2, size, duration, tier=2)
    measure(directory, "all_reduce", 16, 4096, 100.0, tier=0)
    # t = 10 us + bytes / (2 GB/s): 2 GB/s is 2000 B/us
    for size in (4096, 65536, 1048576):
        measure(directory, "all_reduce", 4, size, 10.0 + size / 2000.0)
    # the same sizes over 8 devices at another tier, and in another dtype, after the rows above
    for size, duration in ((1024, 30.0), (4096, 36.0)):
        measure(directory, "all_reduce", 8, size, duration, tier=0)
    for size, duration in ((1024, 40.0), (4096, 52.0)):
        measure(directory, "all_reduce", 8, size, duration, dtype="fp32")
    # all_gather over 8: nccl-tests' sizes 8192 and 32768 are 1024 and 4096 B per rank
    for size, duration in ((8192, 11.0), (32768, 17.0)):
        measure(directory, "all_gather", 8, size, duration)
    return directory


# ----------------------------------------------------------------------------- exact
@pytest.mark.parametrize("op", ["allreduce", "all_reduce", "allReduce", "hcom_allReduce_", "hcom_allReduce_.csv"])
def test_a_row_at_the_query_size_answers_exactly(db: Path, op: str) -> None:
    answer = lookup_collective(db, q(4096, 8, op))
    assert (answer.provenance, answer.duration_us, answer.column) == ("exact", 26.0, "Duration(us)")
    assert answer.rows == (line_of(db / ALL_REDUCE, message_bytes="4096", num_devices="8", dtype="DT_BF16",
                                   topology_tier="1"),)
    # the only row of its group answers too: an exact answer needs no second size
    single = lookup_collective(db, q(4096, 16))
    assert (single.provenance, single.duration_us) == ("exact", 100.0)


def test_of_several_rows_at_one_size_the_first_in_the_file_answers(tmp_path: Path) -> None:
    measure(tmp_path, "all_reduce", 8, 4096, 31.0, mode="event")  # mode is no key of the reader's
    measure(tmp_path, "all_reduce", 8, 4096, 27.0, mode="kernel")
    answer = lookup_collective(tmp_path, q(4096, 8))
    assert (answer.provenance, answer.duration_us, answer.rows) == ("exact", 31.0, (2,))


def test_the_reader_preferred_duration_column_is_read(tmp_path: Path) -> None:
    """An Ascend microbenchmark file with ``Average Duration(us)``: read first, ``Duration(us)`` where
    it is empty; the writer fills both for its own rows."""
    path = tmp_path / ALL_REDUCE
    path.write_text("message_bytes,num_devices,dtype,topology_tier,Duration(us),bandwidth_gbps,Average Duration(us)\n"
                    "1024,8,DT_BF16,1,99.0,0.01,\n"
                    "2048,8,DT_BF16,1,99.0,0.02,77.0\n")
    measure(tmp_path, "all_reduce", 8, 4096, 30.0)
    found = {size: lookup_collective(tmp_path, q(size, 8)) for size in (1024, 2048, 4096)}
    assert [(a.duration_us, a.column, a.rows) for a in found.values()] == [
        (99.0, "Duration(us)", (2,)), (77.0, "Average Duration(us)", (3,)), (30.0, "Average Duration(us)", (4,)),
    ]


# ----------------------------------------------------------------------------- interpolated
def test_between_two_sizes_the_alpha_beta_line_through_them(db: Path) -> None:
    answer = lookup_collective(db, q(2048, 8, tier="1"))
    # by hand: slope (26 - 20) / (4096 - 1024) = 1/512 us/B; 20 + 1024/512 = 22 us;
    # alpha = 20 - 1024/512 = 18 us; beta = 512 B/us = 0.512 GB/s
    assert (answer.provenance, answer.duration_us) == ("interpolated", pytest.approx(22.0))
    assert answer.column == "alpha-beta through 1024 B and 4096 B: alpha 18 us, beta 0.512 GB/s"
    assert answer.details == {"alpha_us": pytest.approx(18.0), "beta_gbps": pytest.approx(0.512)}
    path = db / ALL_REDUCE
    assert answer.rows == (line_of(path, message_bytes="1024", num_devices="8", topology_tier="1", dtype="DT_BF16"),
                           line_of(path, message_bytes="4096", num_devices="8", topology_tier="1", dtype="DT_BF16"))
    # further up, between 65536 (50 us) and 1048576 B (400 us): 50 + (100000 - 65536) * 350 / 983040
    upper = lookup_collective(db, q(100000, 8, tier="1"))
    assert upper.duration_us == pytest.approx(50 + 34464 * 350 / 983040)
    assert "65536 B and 1048576 B" in upper.column


def test_sizes_are_the_readers_message_bytes(db: Path) -> None:
    """all_gather rows count one rank's input (nccl-tests' size / 8): 1024 and 4096 B."""
    answer = lookup_collective(db, q(2048, 8, "all_gather"))
    assert (answer.provenance, answer.duration_us) == ("interpolated", pytest.approx(11.0 + 1024 * 6 / 3072))


# ----------------------------------------------------------------------------- fallback
@pytest.mark.parametrize("size", [1024, 4194304])
def test_outside_the_measured_sizes_a_fitted_line_says_so(db: Path, size: int) -> None:
    answer = lookup_collective(db, q(size, 4))
    # the rows lie on 10 us + bytes / 2 GB/s, so the fit is that line: 10.512 us and 2107.152 us
    assert (answer.provenance, answer.duration_us) == ("fallback", pytest.approx(10.0 + size / 2000.0))
    assert "outside the measured message sizes [4096, 1048576] B" in answer.reason
    assert answer.reason.endswith("fitted over 3 rows: alpha 10 us, beta 2 GB/s")
    assert answer.column == "alpha-beta least-squares fit on relative error"
    path = db / ALL_REDUCE
    assert answer.rows == tuple(line_of(path, message_bytes=str(s), num_devices="4") for s in (4096, 65536, 1048576))


def _reference_fit(sizes: list[int], durations: list[float]) -> tuple[float, float]:
    """scipy's bounded least squares on the relative error: (alpha us, us per byte)."""
    x, t = np.array(sizes, dtype=float), np.array(durations, dtype=float)
    result = lsq_linear(np.column_stack([1 / t, x / t]), np.ones_like(t), bounds=([0, 0], [np.inf, np.inf]))
    return float(result.x[0]), float(result.x[1])


def test_the_fit_is_the_bounded_least_squares_one(db: Path) -> None:
    alpha, slope = _reference_fit([1024, 4096, 65536, 1048576], [20.0, 26.0, 50.0, 400.0])
    answer = lookup_collective(db, q(4194304, 8, tier="1", dtype="bf16"))
    assert answer.provenance == "fallback"
    assert answer.duration_us == pytest.approx(alpha + slope * 4194304, rel=1e-6)
    assert answer.details["beta_gbps"] == pytest.approx(1e-3 / slope, rel=1e-6)
    assert answer.details["rows_fitted"] == 4.0


def test_the_fit_keeps_alpha_non_negative_and_needs_a_positive_bandwidth() -> None:
    sizes, durations = [1024, 2048, 4096], [1.0, 3.0, 7.5]
    free = np.linalg.lstsq(np.column_stack([1 / np.array(durations), np.array(sizes) / np.array(durations)]),
                           np.ones(3), rcond=None)[0]
    assert free[0] < 0  # unbounded, this line would start below zero
    fit = fit_alpha_beta(sizes, durations)
    assert fit is not None and fit[0] == 0.0
    assert fit[1] == pytest.approx(_reference_fit(sizes, durations)[1], rel=1e-9)
    assert fit_alpha_beta([1024, 4096], [50.0, 40.0]) is None


def test_durations_that_fall_with_size_give_no_fit(tmp_path: Path) -> None:
    measure(tmp_path, "all_reduce", 8, 1024, 50.0)
    measure(tmp_path, "all_reduce", 8, 4096, 40.0)
    answer = lookup_collective(tmp_path, q(8192, 8))
    assert (answer.provenance, answer.duration_us) == ("none", None)
    assert "outside the measured message sizes [1024, 4096] B" in answer.reason
    assert "no alpha-beta fit with a positive bandwidth" in answer.reason


# ----------------------------------------------------------------------------- none
def test_one_measured_size_is_no_answer(db: Path) -> None:
    answer = lookup_collective(db, q(8192, 16))
    assert (answer.provenance, answer.duration_us) == ("none", None)
    assert answer.reason == (f"only one measured message size (4096 B) in {ALL_REDUCE} with num_devices=16: "
                             "an alpha-beta fit needs two")


def test_no_answer_names_the_device_counts_and_tiers_that_exist(db: Path) -> None:
    devices = lookup_collective(db, q(4096, 32))
    assert devices.provenance == "none"
    assert devices.reason == f"no row of {ALL_REDUCE} has num_devices=32; measured: num_devices 2, 4, 8, 16"
    tier = lookup_collective(db, q(4096, 8, tier="2"))
    assert tier.reason == (f"no row of {ALL_REDUCE} with num_devices=8 has topology_tier=2; "
                           "measured with num_devices=8: topology_tier 0, 1")
    dtype = lookup_collective(db, q(4096, 8, tier="1", dtype="fp16"))
    assert dtype.reason == (f"no row of {ALL_REDUCE} with num_devices=8, topology_tier=1 has dtype=fp16; "
                            "measured with num_devices=8, topology_tier=1: dtype BF16, FLOAT")


# ----------------------------------------------------------------------------- filtering
def test_tier_selects_its_rows_and_without_one_the_first_counts(db: Path) -> None:
    assert lookup_collective(db, q(4096, 8)).duration_us == 26.0  # tier 1 rows come first in the file
    assert lookup_collective(db, q(4096, 8, tier="0")).duration_us == 36.0
    assert lookup_collective(db, q(4096, 8, tier="1.0")).duration_us == 26.0  # tiers compare as numbers
    assert lookup_collective(db, q(2048, 8, tier="0")).duration_us == pytest.approx(32.0)  # 30 + 1024 * 6 / 3072


@pytest.mark.parametrize("spelling", ["DT_FLOAT", "FLOAT", "fp32", "float32", "torch.float32"])
def test_dtype_selects_its_rows_in_any_spelling(db: Path, spelling: str) -> None:
    assert lookup_collective(db, q(4096, 8, tier="1", dtype=spelling)).duration_us == 52.0
    assert lookup_collective(db, q(2048, 8, tier="1", dtype=spelling)).duration_us == pytest.approx(44.0)
    assert lookup_collective(db, q(4096, 8, tier="1", dtype="bf16")).duration_us == 26.0


def test_a_tier_the_file_cannot_tell_is_said(tmp_path: Path) -> None:
    path = tmp_path / ALL_REDUCE
    path.write_text("message_bytes,num_devices,Duration(us)\n1024,8,5\n4096,8,8\n")
    answer = lookup_collective(tmp_path, q(4096, 8, tier="1"))
    assert (answer.provenance, answer.duration_us) == ("exact", 8.0)
    assert answer.reason == f"{ALL_REDUCE} has no topology_tier column: not matched"


# ----------------------------------------------------------------------------- files
def test_a_missing_file_is_an_error_naming_it(db: Path, tmp_path: Path) -> None:
    with pytest.raises(DatabaseError) as info:
        lookup_collective(db, q(4096, 8, "all_to_all"))
    assert str(info.value) == f"{db / 'hcom_alltoallv_.csv'}: no CSV of collective all_to_all"
    with pytest.raises(DatabaseError, match="hcom_broadcast_.csv"):
        lookup_collective(db, q(4096, 8, "broadcast"))
    with pytest.raises(DatabaseError, match=str(tmp_path / "nowhere" / ALL_REDUCE)):
        lookup_collective(tmp_path / "nowhere", q(4096, 8))


def test_a_compute_database_finds_its_collectives_where_op_mapping_points(tmp_path: Path) -> None:
    root = tmp_path / "database" / "data"
    compute = root / "ATLAS_800_A3_752T_128G_DIE" / "vllm_ascend" / "vllm0.18.0_torch2.9.0_cann8.5"
    compute.mkdir(parents=True)
    shutil.copy(ASCEND / "op_mapping_vllm0.18.0_torch2.9.0_cann8.5.yaml", compute / "op_mapping.yaml")
    with pytest.raises(DatabaseError, match=f"nor {compute / ALL_REDUCE}"):
        lookup_collective(compute, q(4096, 8))
    directory = output_directory(select_ccl("hccl"), build_settings(cann_version="8.5"), tmp_path)
    measure(directory, "all_reduce", 8, 4096, 21.5)
    answer = lookup_collective(compute, q(4096, 8))
    assert (answer.provenance, answer.duration_us) == ("exact", 21.5)


def test_rows_with_nccl_tests_sizes_are_refused(tmp_path: Path) -> None:
    legacy = [c for c in COLUMNS if c != record.NCCL_TESTS_BYTES]
    path = tmp_path / "hcom_allGather_.csv"
    path.write_text(",".join(legacy) + "\n" + "8192,8,DT_BF16,1,11,0.7,0.6,11,2,kernel,hccl,16,2026-01-01T00:00:00Z\n")
    with pytest.raises(DatabaseError, match="row 2, column 'message_bytes'.*perfdb upgrade-comm"):
        lookup_collective(tmp_path, q(1024, 8, "all_gather"))


# ----------------------------------------------------------------------------- agreement with comm
def test_the_restated_contract_is_the_writers() -> None:
    assert (collectives.MESSAGE_BYTES, collectives.NUM_DEVICES, collectives.DTYPE, collectives.TOPOLOGY_TIER,
            collectives.BACKEND, collectives.NCCL_TESTS_BYTES) == (
        record.MESSAGE_BYTES, record.NUM_DEVICES, record.DTYPE, record.TOPOLOGY_TIER, record.BACKEND,
        record.NCCL_TESTS_BYTES)
    for op in COLLECTIVES.values():
        names = {op.name, op.name.replace("_", ""), op.hcom_name, op.file_name.removesuffix(".csv"), op.file_name}
        assert {file_name(name) for name in names} == {op.file_name}, op.name
    spellings = [{normalise_comm_dtype(s) for s in (d.db_name, *d.legacy_names, d.key, d.torch_name)}
                 for d in COMM_DTYPES.values()]
    assert all(len(s) == 1 for s in spellings) and len(set().union(*spellings)) == len(COMM_DTYPES)


def test_a_row_at_the_size_without_a_duration_is_said(tmp_path: Path) -> None:
    measure(tmp_path, "all_reduce", 8, 1024, 20.0)
    measure(tmp_path, "all_reduce", 8, 4096, 26.0)
    path = tmp_path / ALL_REDUCE
    path.write_text(path.read_text() + "2048,8,DT_BF16,1,,,,,,kernel,,,,2048\n")
    answer = lookup_collective(tmp_path, q(2048, 8))
    assert (answer.provenance, answer.duration_us) == ("interpolated", pytest.approx(22.0))
    assert answer.reason == "row 4 has this size but no duration"


def test_perfdb_lookup_answers_a_collective(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from perf_plugin.cli import main as perfdb

    assert perfdb(["lookup", "--database-path", str(db), "--collective", "all_reduce", "--message-bytes", "2048",
                   "--devices", "8", "--tier", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("all_reduce of 2048 B over 8 devices: 22.000 us (interpolated: row ")
    assert perfdb(["lookup", "--database-path", str(db), "--collective", "all_reduce", "--devices", "8"]) == 2
    assert "--message-bytes" in capsys.readouterr().err
