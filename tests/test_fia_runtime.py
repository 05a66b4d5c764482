"""``perfdb fia-runtime``: the real FusedInferAttentionScore rows filled from runtime metadata.

The rows are the real database file ``db_row_FusedInferAttentionScore.csv`` (paged TND decode,
contiguous TND prefill, MLA ``BNSD_NBSD`` decode); the JSONL lines are written in the format the
seed's instrumentation of vllm-ascend writes (one object per ``npu_fused_infer_attention_score``
call, the fields of msmodeling's ``fill_fia_runtime_metadata.py`` usage notes).  No NPU and no
serving run were involved.
"""

from __future__ import annotations

import json
import shutil
from itertools import accumulate
from pathlib import Path
from typing import Any

import pytest

from perf_plugin.cli import main as perfdb
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.table import CsvTable
from perf_plugin.ingest import fia_runtime as fr
from perf_plugin.replay.kernels.fused_infer_attention import fia_plan
from perf_plugin.replay.tensors import kernel_row_from_cells

FIXTURE = Path(__file__).parent / "fixtures" / "ascend" / "db_row_FusedInferAttentionScore.csv"
DECODE_ROWS = (0, 8, 9)  # query [128,4,128] over the paged [12307,128,128] caches, block table [128,512]
PREFILL_ROW = 4  # contiguous TND, query [24624,4,128], 7 requests
MLA_ROW = 6  # BNSD_NBSD, query [4,16,1,512], latent cache [1135,1,128,512], block table [4,1135]


def decode_call(kv_lens: list[int]) -> dict[str, Any]:
    """A standard-path (attention_v1.py) record of a 128-request decode step."""
    return {
        "op_name": "npu_fused_infer_attention_score", "attn_variant": "standard", "source_file": "attention_v1.py",
        "timestamp_ns": 1774356338436082859, "query_shape": [128, 4, 128], "key_shape": [12307, 128, 128],
        "value_shape": [12307, 128, 128], "atten_mask_shape": [2048, 2048], "block_table_shape": [128, 512],
        "actual_seq_lengths": list(range(1, 129)), "actual_seq_lengths_kv": kv_lens,
        "block_table_valid_blocks": [(n + 127) // 128 for n in kv_lens], "num_heads": 4, "num_key_value_heads": 1,
        "input_layout": "TND", "sparse_mode": 3, "block_size": 128, "scale": 0.08838834764831845,
    }  # fmt: skip


PREFILL_Q = [3518, 3518, 3518, 3518, 3518, 3518, 3516]  # 24624 tokens, cumulative in the call
PREFILL_CALL = {
    "op_name": "npu_fused_infer_attention_score", "attn_variant": "standard", "source_file": "attention_v1.py",
    "timestamp_ns": 1774356338436099000, "query_shape": [24624, 4, 128], "key_shape": [24624, 1, 128],
    "value_shape": [24624, 1, 128], "atten_mask_shape": [2048, 2048], "block_table_shape": None,
    "actual_seq_lengths": list(accumulate(PREFILL_Q)), "actual_seq_lengths_kv": list(accumulate(PREFILL_Q)),
    "block_table_valid_blocks": None, "num_heads": 4, "num_key_value_heads": 1, "input_layout": "TND",
    "sparse_mode": 3, "block_size": None, "scale": 0.08838834764831845,
}  # fmt: skip
MLA_CALL = {
    "op_name": "npu_fused_infer_attention_score", "attn_variant": "mla", "source_file": "mla_v1.py",
    "timestamp_ns": 1774356338436123000, "query_shape": [4, 16, 1, 512], "key_shape": [1135, 1, 128, 512],
    "value_shape": [1135, 1, 128, 512], "atten_mask_shape": None, "block_table_shape": [4, 1135],
    "actual_seq_lengths": [1, 2, 3, 4], "actual_seq_lengths_kv": [700, 1500, 3000, 5000],
    "block_table_valid_blocks": [6, 12, 24, 40], "num_heads": 16, "num_key_value_heads": 1,
    "input_layout": "BNSD_NBSD", "sparse_mode": 0, "block_size": 128, "scale": 0.0416,
}  # fmt: skip
# Three decode steps: their mean KV lengths are 2000, 1000, 3000; the median step is the first.
DECODE_KV = ([2000] * 128, [1000] * 64 + [1000] * 64, [2500] * 64 + [3500] * 64)


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture()
def database(tmp_path: Path) -> Path:
    target = tmp_path / "FusedInferAttentionScore.csv"
    shutil.copyfile(FIXTURE, target)
    return target


@pytest.fixture()
def jsonl(tmp_path: Path) -> Path:
    records = [decode_call(DECODE_KV[0]), PREFILL_CALL, decode_call(DECODE_KV[1]), MLA_CALL,
               decode_call(DECODE_KV[2])]  # fmt: skip
    return write_jsonl(tmp_path / fr.JSONL_NAME, records)


def without_runtime_columns(table: CsvTable) -> str:
    """The table's text with the Runtime columns removed, as the original file would write it."""
    keep = [i for i, name in enumerate(table.header) if name not in fr.RUNTIME_COLUMNS]
    stripped = CsvTable.new([table.header[i] for i in keep], newline=table.newline)
    for index in range(len(table)):
        cells = table.row_dict(index)
        stripped.append_row({table.header[i]: cells[table.header[i]] for i in keep})
    return stripped.to_text()


def test_median_mode_fills_matching_rows_and_changes_nothing_else(database: Path, jsonl: Path) -> None:
    original = FIXTURE.read_text(encoding="utf-8")
    result = fr.fill_csv(database, jsonl)
    assert (result.rows, result.matched, result.appended, result.calls, result.unused_calls) == (10, 5, 0, 5, 0)
    table = CsvTable.read(database)
    assert table.header[-len(fr.RUNTIME_COLUMNS):] == list(fr.RUNTIME_COLUMNS)
    assert without_runtime_columns(table) == original  # every original cell, quoting and number kept
    for row in DECODE_ROWS:
        cells = table.row_dict(row)
        assert cells[fr.KV_LENS] == ",".join(["2000"] * 128)  # the median step, not the mean of steps
        assert cells[fr.AVG_SEQ_LEN] == "2000.000000"
        assert cells[fr.Q_LENS] == ",".join(map(str, range(1, 129))) and cells[fr.Q_LENS_SHAPE] == "128"
        assert cells[fr.VALID_BLOCKS] == ",".join(["16"] * 128)
        assert (cells[fr.INPUT_LAYOUT], cells[fr.SPARSE_MODE], cells[fr.BLOCK_SIZE]) == ("TND", "3", "128")
        assert (cells[fr.NUM_HEADS], cells[fr.NUM_KV_HEADS], cells[fr.COMPLETENESS]) == ("4", "1", fr.DEFAULT_TAG)
        assert cells["avg_seq_len"] == CsvTable.read(FIXTURE).get(row, "avg_seq_len")  # the older column stays
    assert table.get(MLA_ROW, fr.INPUT_LAYOUT) == "BNSD_NBSD"
    assert table.get(PREFILL_ROW, fr.KV_LENS_SHAPE) == "7"
    for row in (1, 2, 3, 5, 7):  # shapes no call had
        assert all(table.get(row, name) == "" for name in fr.RUNTIME_COLUMNS)


def test_replay_plan_reads_the_filled_lengths(database: Path, jsonl: Path) -> None:
    fr.fill_csv(database, jsonl)
    table = CsvTable.read(database)
    decode = fia_plan(kernel_row_from_cells(fr.KERNEL_TYPE, table.row_dict(DECODE_ROWS[0])))
    assert decode.kv_lens == (2000,) * 128 and decode.q_lens == (1,) * 128 and decode.layout == "TND"
    prefill = fia_plan(kernel_row_from_cells(fr.KERNEL_TYPE, table.row_dict(PREFILL_ROW)))
    assert prefill.q_lens == tuple(PREFILL_Q) and prefill.kv_lens == tuple(PREFILL_Q)
    mla = fia_plan(kernel_row_from_cells(fr.KERNEL_TYPE, table.row_dict(MLA_ROW)))
    assert mla.kv_lens == (700, 1500, 3000, 5000) and mla.api_layout == "BNSD_NBSD"


def test_expand_mode_appends_one_row_per_distinct_length_set(database: Path, tmp_path: Path) -> None:
    records = [decode_call(DECODE_KV[0]), decode_call(DECODE_KV[1]), decode_call(DECODE_KV[0])]  # 2 distinct
    result = fr.fill_csv(database, write_jsonl(tmp_path / "calls.jsonl", records), mode="expand")
    assert (result.matched, result.appended) == (3, 3)  # each of the three decode rows gains one copy
    table = CsvTable.read(database)
    assert len(table) == 13
    for original, copy in zip(DECODE_ROWS, (10, 11, 12)):
        first, extra = table.row_dict(original), table.row_dict(copy)
        assert first[fr.AVG_SEQ_LEN] == "2000.000000" and extra[fr.AVG_SEQ_LEN] == "1000.000000"
        assert {k: v for k, v in extra.items() if k not in fr.RUNTIME_COLUMNS} == \
               {k: v for k, v in first.items() if k not in fr.RUNTIME_COLUMNS}  # fmt: skip
    # the original record is kept as it was written, the Runtime cells follow it
    assert table.to_text().splitlines()[1].startswith(FIXTURE.read_text(encoding="utf-8").splitlines()[1] + ",")


def test_no_matching_call_leaves_the_file_byte_for_byte(database: Path, tmp_path: Path) -> None:
    other = {**decode_call([10] * 64), "query_shape": [64, 4, 128], "block_table_shape": [64, 512]}
    before = database.read_bytes()
    result = fr.fill_csv(database, write_jsonl(tmp_path / "other.jsonl", [other]))
    assert (result.matched, result.unused_calls) == (0, 1) and result.unused_example is not None
    assert database.read_bytes() == before


def test_request_count_is_part_of_the_key(database: Path, tmp_path: Path) -> None:
    """Same query/cache/table shapes but 127 KV lengths: not the row's 128-request call."""
    short = decode_call([2000] * 127)
    result = fr.fill_csv(database, write_jsonl(tmp_path / "short.jsonl", [short]))
    assert result.matched == 0


@pytest.mark.parametrize(("line", "message"), [
    ("{not json", "line 2: not JSON"),
    ("[1, 2]", "line 2: expected a JSON object, got list"),
    (json.dumps({**decode_call([1] * 128), "query_shape": "128,4,128"}),
     "line 2, field 'query_shape': expected a list of non-negative integers, got \"128,4,128\""),
    (json.dumps({k: v for k, v in decode_call([1] * 128).items() if k != "key_shape"}),
     "line 2, field 'key_shape': expected a list of non-negative integers, got null"),
    (json.dumps({**decode_call([1] * 128), "actual_seq_lengths_kv": [1, -2]}),
     "line 2, field 'actual_seq_lengths_kv': expected a list of non-negative integers or null"),
    (json.dumps({**decode_call([1] * 128), "num_heads": "4"}), "line 2, field 'num_heads': expected an integer or null"),
    (json.dumps({**decode_call([1] * 128), "block_table_valid_blocks": [1]}),
     "line 2, field 'block_table_valid_blocks': expected one count per request (128)"),
    (json.dumps({**decode_call([1] * 128), "input_layout": 3}), "line 2, field 'input_layout': expected a non-empty"),
])  # fmt: skip
def test_bad_jsonl_names_file_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(decode_call([1] * 128)) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(DatabaseError) as info:
        fr.read_calls(path)
    assert str(info.value).startswith(f"{path}: {message}")


def test_empty_jsonl_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n", encoding="utf-8")
    with pytest.raises(DatabaseError, match="no records"):
        fr.read_calls(path)


def test_malformed_row_is_named_by_line_and_column(database: Path, jsonl: Path) -> None:
    text = database.read_text(encoding="utf-8").splitlines(keepends=True)
    text[3] = text[3].replace('"""496,4,128;', '"""496,x,128;', 1)
    database.write_text("".join(text), encoding="utf-8")
    with pytest.raises(DatabaseError) as info:
        fr.fill_csv(database, jsonl)
    assert f"{database}, row 4, column 'Input Shapes'" in str(info.value)


def test_cli_fills_a_database_directory(database: Path, jsonl: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert perfdb(["fia-runtime", str(database.parent), "--jsonl", str(jsonl)]) == 0
    out = capsys.readouterr().out
    assert "filled 5 of 10 row(s) from 5 call(s)" in out and f"wrote {database}" in out
    assert CsvTable.read(database).get(0, fr.COMPLETENESS) == fr.DEFAULT_TAG


def test_cli_seed_option_names_and_output_path(database: Path, jsonl: Path, tmp_path: Path) -> None:
    before = database.read_bytes()
    out = tmp_path / "filled.csv"
    assert perfdb(["fia-runtime", "--csv-path", str(database), "--jsonl-path", str(jsonl), "--output-path", str(out),
                   "--metadata-tag", "dumped_0320"]) == 0  # fmt: skip
    assert database.read_bytes() == before
    assert CsvTable.read(out).get(PREFILL_ROW, fr.COMPLETENESS) == "dumped_0320"


def test_cli_bad_jsonl_is_one_line_and_exit_2(database: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query_shape": [1]}\n', encoding="utf-8")
    before = database.read_bytes()
    assert perfdb(["fia-runtime", str(database), "--jsonl", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{bad}: line 1, field 'key_shape'" in err and "Traceback" not in err
    assert database.read_bytes() == before


def test_cli_missing_csv(tmp_path: Path, jsonl: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert perfdb(["fia-runtime", str(tmp_path / "nowhere"), "--jsonl", str(jsonl)]) == 2
    assert "no such file" in capsys.readouterr().err
