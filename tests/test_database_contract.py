"""Shapes, signatures, kernel-type names, directory contract, schema placement and the lock."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.kernel_types import validate_kernel_type
from perf_plugin.database.lock import database_lock
from perf_plugin.database.paths import (
    ascend_version_dir,
    cuda_version_dir,
    derive_location,
    explicit_location,
    sanitise_device_name,
)
from perf_plugin.database.schema import (
    MICROBENCH_AVERAGE,
    ensure_added_columns,
    ensure_microbench_average_column,
    ensure_microbench_counter_column,
    format_number,
    parse_duration,
)
from perf_plugin.database.shapes import QuoteStyle, detect_quote_style, format_shape_cell, parse_shape_cell
from perf_plugin.database.signature import PLAIN, SignatureRule, row_signature
from perf_plugin.replay.registry import signature_of
from perf_plugin.database.table import CsvTable
from tests.conftest import ASCEND


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ('"136,7168;7168,3584"', [(136, 7168), (7168, 3584)]),
        ("136,7168;7168,3584", [(136, 7168), (7168, 3584)]),
        ('"1024;"', [(1024,), None]),
        ('"128,4,128;;2048,2048"', [(128, 4, 128), None, (2048, 2048)]),
        ("", []),
    ],
)
def test_shape_cells_in_both_quoting_forms(cell: str, expected: list) -> None:
    assert parse_shape_cell(cell) == expected


@pytest.mark.parametrize("cell", ["4096,x", "4096,,2", "1.5,2", "4096,-1"])
def test_malformed_shapes_are_rejected(cell: str) -> None:
    with pytest.raises(DatabaseError, match="shape"):
        parse_shape_cell(cell)


def test_format_shape_cell_follows_the_file_style() -> None:
    slots = [(4096, 1024), None, (8,)]
    assert format_shape_cell(slots, QuoteStyle.PLAIN) == "4096,1024;;8"
    assert format_shape_cell(slots, QuoteStyle.EMBEDDED) == '"4096,1024;;8"'
    assert detect_quote_style(['"1,2"', "x"]) is QuoteStyle.EMBEDDED
    assert detect_quote_style(["1,2"]) is QuoteStyle.PLAIN


def _row(inputs: str, in_dtypes: str, in_formats: str, outputs: str, out_dtypes: str) -> dict[str, str]:
    return {
        "Input Shapes": inputs,
        "Input Data Types": in_dtypes,
        "Input Formats": in_formats,
        "Output Shapes": outputs,
        "Output Data Types": out_dtypes,
    }


def test_signature_normalises_spellings_quotes_and_trailing_slots() -> None:
    real = _row('"128,4,128;;"', "DT_BF16;DT_UNDEFINED;DT_UNDEFINED", "FORMAT_ND;NULL;NULL", '"128,4,128"', "DT_BF16")
    plain = _row("128,4,128", "BF16", "ND", "128,4,128", "BF16")
    assert signature_of("FusedInferAttentionScore", real) == signature_of("FusedInferAttentionScore", plain)


def test_signature_keeps_inner_empty_slots() -> None:
    inner = _row("1,2;;3", "FLOAT;FLOAT;FLOAT", "ND;ND;ND", "1", "FLOAT")
    squeezed = _row("1,2;3", "FLOAT;FLOAT", "ND;ND", "1", "FLOAT")
    assert signature_of("X", inner) != signature_of("X", squeezed)
    # the dtype of an empty slot is blanked
    assert signature_of("X", inner).input_dtypes == ("FLOAT", "", "FLOAT")


def test_matmul_family_compares_in_canonical_mk_nk_form() -> None:
    nn = _row('"4096,1024;1024,2048"', "DT_BF16;DT_BF16", "ND;ND", '"4096,2048"', "DT_BF16")
    nt = _row('"4096,1024;2048,1024"', "DT_BF16;DT_BF16", "ND;ND", '"4096,2048"', "DT_BF16")
    tn = _row('"1024,4096;1024,2048"', "DT_BF16;DT_BF16", "ND;ND", '"4096,2048"', "DT_BF16")
    for kernel_type in ("MatMulV2", "MatMulV3", "MatMulCommon"):
        signatures = {signature_of(kernel_type, r) for r in (nn, nt, tn)}
        assert len(signatures) == 1
        assert next(iter(signatures)).input_shapes == ("4096,1024", "2048,1024")
    assert signature_of("Add", nn) != signature_of("Add", nt)


def test_slice_and_transpose_compare_slot_zero_only() -> None:
    a = _row('"4096,8,512;3;3"', "DT_BF16;INT64;INT64", "ND;ND;ND", '"4096,8,128"', "DT_BF16")
    b = _row('"4096,8,512;3;3"', "DT_BF16;INT32;INT32", "ND;ND;ND", '"4096,8,128"', "DT_BF16")
    assert signature_of("Slice", a) == signature_of("Slice", b)
    assert signature_of("Transpose", a) == signature_of("Transpose", b)
    assert signature_of("Add", a) != signature_of("Add", b)


def test_a_rule_can_add_columns_to_the_signature() -> None:
    row = _row("16,7168", "DT_BF16", "ND", "16,7168", "DT_BF16")
    rule = SignatureRule(extra_columns=("EP Size",))
    assert row_signature({**row, "EP Size": "16"}, rule) != row_signature({**row, "EP Size": "8"}, rule)
    assert row_signature({**row, "EP Size": "16"}, PLAIN) == row_signature({**row, "EP Size": "8"}, PLAIN)


def test_real_fixture_signatures_group_repeated_launches() -> None:
    table = CsvTable.read(ASCEND / "kernel_details_level2_llm_train.csv")
    rows = [table.row_dict(i) for i in range(len(table)) if table.get(i, "Type") == "MatMulV3"]
    distinct_cells = {(r["Input Shapes"], r["Output Shapes"]) for r in rows}
    distinct_signatures = {signature_of("MatMulV3", r) for r in rows}
    assert len(rows) == 280
    # transposed layouts of one product share a signature, so there are at most as many
    assert 0 < len(distinct_signatures) <= len(distinct_cells)


@pytest.mark.parametrize("name", ["MatMulV3", "hcom_allReduce_", "split_qkv_rmsnorm_rope_kernel", "aten.mm"])
def test_plain_kernel_type_names_pass(name: str) -> None:
    assert validate_kernel_type(name) == name


@pytest.mark.parametrize("name", ["", "../etc", "a/b", "a\\b", "..", "x..y", "Mat Mul", "a;b"])
def test_unsafe_kernel_type_names_are_rejected(name: str) -> None:
    with pytest.raises(DatabaseError):
        validate_kernel_type(name)


def test_directory_contract() -> None:
    assert ascend_version_dir("0.18.0", "2.9.0", "8.5") == "vllm0.18.0_torch2.9.0_cann8.5"
    assert cuda_version_dir("2.11.0", "13.0") == "torch2.11.0_cuda13.0"
    assert cuda_version_dir("2.11.0", "13.0", "0.11.0") == "vllm0.11.0_torch2.11.0_cuda13.0"
    assert sanitise_device_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3"
    location = derive_location(Path("db"), "ATLAS_800_A3_752T_128G_DIE", "vllm_ascend", "vllm0.18.0_torch2.9.0_cann8.5")
    assert location.directory == Path("db/ATLAS_800_A3_752T_128G_DIE/vllm_ascend/vllm0.18.0_torch2.9.0_cann8.5")
    assert location.kernel_csv("MatMulV3").name == "MatMulV3.csv"
    with pytest.raises(DatabaseError):
        location.kernel_csv("../MatMulV3")
    with pytest.raises(DatabaseError):
        derive_location(Path("db"), "../x", "torch", "v")
    assert not explicit_location("/tmp/x").derived


def test_microbench_columns_are_placed_as_the_contract_says() -> None:
    table = CsvTable.new(
        [
            "OP State", "Accelerator Core", "Input Shapes", "Input Data Types", "Input Formats",
            "Output Shapes", "Output Data Types", "Output Formats",
            "Profiling Average Duration(us)", "Profiling Median Duration(us)", "Profiling Std Duration(us)",
            "Profiling Average aicore_time(us)", "Custom",
        ]
    )
    ensure_microbench_average_column(table)
    ensure_microbench_counter_column(table, "aicore_time(us)")
    ensure_added_columns(table)
    header = table.header
    assert header.index(MICROBENCH_AVERAGE) == header.index("Profiling Average Duration(us)") - 1
    assert header.index("MicroBench aicore_time(us)") == header.index("Profiling Average aicore_time(us)") - 1
    assert header.index("Custom") < header.index("MicroBench Median Duration(us)")
    assert header[-1] == "Row Origin"


def test_microbench_average_without_profiling_columns_goes_after_identity() -> None:
    table = CsvTable.read(ASCEND / "db_row_TransposeBatchMatMul.csv")
    # this older database already has "Average Duration(us)": nothing moves
    before = list(table.header)
    ensure_microbench_average_column(table)
    assert table.header == before
    bare = CsvTable.new(["Input Shapes", "Input Data Types", "Output Shapes", "Output Data Types", "Note"])
    ensure_microbench_average_column(bare)
    assert bare.header == ["Input Shapes", "Input Data Types", "Output Shapes", "Output Data Types", MICROBENCH_AVERAGE, "Note"]


@pytest.mark.parametrize(("text", "value"), [("12.5", 12.5), ("N/A", None), ("", None), ("0", None), ("nan", None), ("-1", None)])
def test_parse_duration(text: str, value: float | None) -> None:
    assert parse_duration(text) == value


def test_format_number() -> None:
    assert format_number(12.5) == "12.5"
    assert format_number(3.0) == "3"
    assert format_number(1.23456) == "1.235"


def _hold_lock(directory: str, ready: "multiprocessing.synchronize.Event", release: "multiprocessing.synchronize.Event") -> None:
    with database_lock(directory, timeout_s=5):
        ready.set()
        release.wait(10)


def test_lock_serialises_sessions(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    ready, release = context.Event(), context.Event()
    holder = context.Process(target=_hold_lock, args=(str(tmp_path), ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        started = time.monotonic()
        with pytest.raises(DatabaseError, match="another session"):
            with database_lock(tmp_path, timeout_s=0.3):
                pass
        assert time.monotonic() - started >= 0.3
    finally:
        release.set()
        holder.join(10)
    with database_lock(tmp_path, timeout_s=1):
        pass  # free again once the other session is gone
