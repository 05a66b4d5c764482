"""Back-fill FusedInferAttentionScore rows with the runtime metadata a serving run recorded.

Profiling gives a FusedInferAttentionScore row its shapes, dtypes and formats, not the values
of its host-side arguments: the per-request query and KV lengths, the blocks each request uses,
the head counts, layout and sparse mode.  Those decide what the kernel does, so the replay
(``perf_plugin.replay.kernels.fused_infer_attention``) reads them from the row's ``Runtime ...``
columns when they are there.

Where they come from (the seed's ``fill_fia_runtime_metadata.py`` and its usage notes in
msmodeling): vllm-ascend is instrumented right before each ``torch_npu.npu_fused_infer_attention_score``
call to append one JSON object per call to the file named by ``MSMODELING_FIA_DUMP_PATH``
(conventionally ``fia_runtime_metadata.jsonl``), from a serving run with the same model, code and
bench parameters as the profiled one.  Fields of a record::

    query_shape, key_shape, value_shape             lists of ints (required)
    atten_mask_shape, block_table_shape             list of ints or null
    actual_seq_lengths, actual_seq_lengths_kv       lists of ints as passed to the API, or null
    block_table_valid_blocks                        list of ints or null (ceil(kv_len / block_size))
    num_heads, num_key_value_heads, sparse_mode, block_size   int or null
    input_layout                                    string or null (TND, BNSD_NBSD, ...)
    op_name, attn_variant, source_file, timestamp_ns, scale   informative, not used

A record matches a row when the row's input slots agree with it: query (slot 0), key (1), value
(2), atten_mask (4), block_table (14) shapes, and the number of requests (the length of
actual_seq_lengths_kv against the 1-d shape of slot 6), the seed's join key.  The JSONL records
no dtypes, so dtypes take no part.

One row usually matches many calls (every decode step of one batch size has the row's shapes,
with other lengths).  ``median`` (default) fills the row with one real call: the one whose mean
KV length is the median over all matching calls, so the row stays one row and its lengths are a
consistent set the kernel really ran.  ``expand`` does what the seed's tool does: one row per
distinct (query lengths, KV lengths) pair, the first in the row itself, the others appended at
the end of the file as copies of the row; the copies carry the row's profiled durations, which
were averaged over all those calls together.

Nothing else in the CSV changes: missing ``Runtime ...`` columns are added at the end, rows that
match no record are left as they are.  None of this has run against an NPU: the tests use
records written in the format above.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.shapes import SlotShape, parse_shape_cell
from perf_plugin.database.table import CsvTable

KERNEL_TYPE = "FusedInferAttentionScore"
JSONL_NAME = "fia_runtime_metadata.jsonl"
DUMP_ENV = "MSMODELING_FIA_DUMP_PATH"
DEFAULT_TAG = "runtime_values_dumped"
MODES = ("median", "expand")

Q_LENS_SHAPE = "Runtime actual_seq_lengths_shape"
Q_LENS = "Runtime actual_seq_lengths_values"
KV_LENS_SHAPE = "Runtime actual_seq_lengths_kv_shape"
KV_LENS = "Runtime actual_seq_lengths_kv_values"
AVG_SEQ_LEN = "Runtime avg_seq_len"
VALID_BLOCKS = "Runtime block_table_valid_blocks"
NUM_HEADS = "Runtime num_heads"
NUM_KV_HEADS = "Runtime num_key_value_heads"
SPARSE_MODE = "Runtime sparse_mode"
INPUT_LAYOUT = "Runtime input_layout"
BLOCK_SIZE = "Runtime block_size"
COMPLETENESS = "Runtime metadata_completeness"
# The seed's column order; missing ones are appended in this order.
RUNTIME_COLUMNS = (Q_LENS_SHAPE, Q_LENS, KV_LENS_SHAPE, KV_LENS, AVG_SEQ_LEN, VALID_BLOCKS, NUM_HEADS,
                   NUM_KV_HEADS, SPARSE_MODE, INPUT_LAYOUT, BLOCK_SIZE, COMPLETENESS)  # fmt: skip

# Input slots of the aclnnFusedInferAttentionScore order that form the join key.
SLOT_QUERY, SLOT_KEY, SLOT_VALUE, SLOT_MASK, SLOT_KV_LENS, SLOT_BLOCK_TABLE = 0, 1, 2, 4, 6, 14

Shape = tuple[int, ...]
# (query, key, value, atten_mask, block_table shapes, number of requests)
JoinKey = tuple[Shape | None, Shape | None, Shape | None, Shape | None, Shape | None, int | None]


@dataclass(frozen=True)
class FiaCall:
    """One recorded FusedInferAttentionScore call (one JSONL line)."""

    line: int
    query: Shape
    key: Shape
    value: Shape
    mask: Shape | None
    block_table: Shape | None
    q_lens: tuple[int, ...] | None
    kv_lens: tuple[int, ...] | None
    valid_blocks: tuple[int, ...] | None
    num_heads: int | None
    num_kv_heads: int | None
    sparse_mode: int | None
    block_size: int | None
    input_layout: str | None

    @property
    def join_key(self) -> JoinKey:
        requests = len(self.kv_lens) if self.kv_lens is not None else None
        return self.query, self.key, self.value, self.mask, self.block_table, requests

    @property
    def mean_kv(self) -> float:
        return mean(self.kv_lens) if self.kv_lens else math.nan

    @property
    def lengths(self) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return self.q_lens, self.kv_lens


# ------------------------------------------------------------------ reading the JSONL
class _Line:
    """Typed access to one record's fields, each failure naming file, line and field."""

    def __init__(self, path: Path, line: int, record: dict[str, Any]) -> None:
        self.path, self.line, self.record = path, line, record

    def error(self, name: str, expected: str) -> DatabaseError:
        got = json.dumps(self.record.get(name))
        return DatabaseError(f"line {self.line}, field {name!r}: expected {expected}, got {got}", path=self.path)

    def ints(self, name: str, required: bool = False) -> tuple[int, ...] | None:
        value = self.record.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                  for v in value):  # fmt: skip
            raise self.error(name, "a list of non-negative integers" + ("" if required else " or null"))
        return tuple(value)

    def int_or_none(self, name: str) -> int | None:
        value = self.record.get(name)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.error(name, "an integer or null")
        return value

    def text_or_none(self, name: str) -> str | None:
        value = self.record.get(name)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.error(name, "a non-empty string or null")
        return value.strip()


def parse_call(path: Path, line: int, text: str) -> FiaCall:
    """One JSONL line -> FiaCall; DatabaseError naming file, line and field when it is not one."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatabaseError(f"line {line}: not JSON ({exc.msg} at column {exc.colno})", path=path) from None
    if not isinstance(record, dict):
        raise DatabaseError(f"line {line}: expected a JSON object, got {type(record).__name__}", path=path)
    fields = _Line(path, line, record)
    query, key, value = (fields.ints(name, required=True) for name in ("query_shape", "key_shape", "value_shape"))
    assert query is not None and key is not None and value is not None
    kv_lens = fields.ints("actual_seq_lengths_kv")
    blocks = fields.ints("block_table_valid_blocks")
    if blocks is not None and kv_lens is not None and len(blocks) != len(kv_lens):
        raise fields.error("block_table_valid_blocks", f"one count per request ({len(kv_lens)})")
    return FiaCall(
        line=line, query=query, key=key, value=value, mask=fields.ints("atten_mask_shape"),
        block_table=fields.ints("block_table_shape"), q_lens=fields.ints("actual_seq_lengths"), kv_lens=kv_lens,
        valid_blocks=blocks, num_heads=fields.int_or_none("num_heads"),
        num_kv_heads=fields.int_or_none("num_key_value_heads"), sparse_mode=fields.int_or_none("sparse_mode"),
        block_size=fields.int_or_none("block_size"), input_layout=fields.text_or_none("input_layout"),
    )  # fmt: skip


def read_calls(path: str | Path) -> list[FiaCall]:
    """Every call of a JSONL file, in file order (blank lines skipped)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise DatabaseError(f"cannot read runtime metadata: {exc.strerror}", path=path) from None
    except UnicodeDecodeError as exc:
        raise DatabaseError(f"not UTF-8 text (byte {exc.start})", path=path) from None
    calls = [parse_call(path, number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not calls:
        raise DatabaseError("no records: the serving run wrote no FusedInferAttentionScore calls", path=path)
    return calls


# ------------------------------------------------------------------ rows and records
def _slot(slots: Sequence[SlotShape], index: int) -> SlotShape:
    return slots[index] if index < len(slots) else None


def row_key(input_shapes: str) -> JoinKey:
    """The join key of a row's ``Input Shapes`` cell (DatabaseError without location when malformed)."""
    slots = parse_shape_cell(input_shapes)
    kv = _slot(slots, SLOT_KV_LENS)
    requests = kv[0] if kv is not None and len(kv) == 1 else None
    return (_slot(slots, SLOT_QUERY), _slot(slots, SLOT_KEY), _slot(slots, SLOT_VALUE), _slot(slots, SLOT_MASK),
            _slot(slots, SLOT_BLOCK_TABLE), requests)  # fmt: skip


def _ints(values: Sequence[int] | None) -> str:
    return ",".join(str(v) for v in values) if values else ""


def _int(value: int | None) -> str:
    return "" if value is None else str(value)


def runtime_cells(call: FiaCall, tag: str) -> dict[str, str]:
    """The ``Runtime ...`` cells one call gives a row (the seed's formatting)."""
    return {
        Q_LENS_SHAPE: str(len(call.q_lens)) if call.q_lens else "",
        Q_LENS: _ints(call.q_lens),
        KV_LENS_SHAPE: str(len(call.kv_lens)) if call.kv_lens else "",
        KV_LENS: _ints(call.kv_lens),
        AVG_SEQ_LEN: f"{call.mean_kv:.6f}" if call.kv_lens else "",
        VALID_BLOCKS: _ints(call.valid_blocks),
        NUM_HEADS: _int(call.num_heads),
        NUM_KV_HEADS: _int(call.num_kv_heads),
        SPARSE_MODE: _int(call.sparse_mode),
        INPUT_LAYOUT: call.input_layout or "",
        BLOCK_SIZE: _int(call.block_size),
        COMPLETENESS: tag,
    }


def median_call(calls: Sequence[FiaCall]) -> FiaCall:
    """The call whose mean KV length is the (lower) median of all ``calls``; ties by file order."""
    ordered = sorted(calls, key=lambda c: (math.inf if math.isnan(c.mean_kv) else c.mean_kv, c.line))
    return ordered[(len(ordered) - 1) // 2]


def distinct_calls(calls: Sequence[FiaCall]) -> list[FiaCall]:
    """The first call of each distinct (query lengths, KV lengths) pair, in file order."""
    seen: dict[tuple[Any, ...], FiaCall] = {}
    for call in calls:
        seen.setdefault(call.lengths, call)
    return list(seen.values())


# ------------------------------------------------------------------ back-fill
@dataclass(frozen=True)
class BackfillResult:
    rows: int  # data rows before back-fill
    matched: int  # rows filled
    appended: int  # copies appended (expand)
    calls: int
    unused_calls: int  # calls no row matched
    unused_example: FiaCall | None  # the first of them, to tell the user what did not match


def backfill(table: CsvTable, calls: Sequence[FiaCall], mode: str = "median", tag: str = DEFAULT_TAG) -> BackfillResult:
    """Fill the Runtime columns of every row a call matches; the table keeps everything else."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    by_key: dict[JoinKey, list[FiaCall]] = {}
    for call in calls:
        by_key.setdefault(call.join_key, []).append(call)
    fills: list[tuple[int, list[FiaCall]]] = []
    used: set[JoinKey] = set()
    shapes_at = table.index("Input Shapes")
    for index in range(len(table)):
        if table.is_blank(index):
            continue
        cells = table.rows[index]
        try:
            key = row_key(cells[shapes_at] if shapes_at < len(cells) else "")
        except DatabaseError as exc:
            raise exc.located(path=table.path, row=table.line_of(index), column="Input Shapes") from None
        matching = by_key.get(key)
        if matching:
            used.add(key)
            fills.append((index, [median_call(matching)] if mode == "median" else distinct_calls(matching)))
    for column in RUNTIME_COLUMNS:
        if fills and not table.has_column(column):
            table.insert_column(column)
    rows_before, appended = len(table), 0
    for index, chosen in fills:
        original = table.row_dict(index)
        for name, value in runtime_cells(chosen[0], tag).items():
            table.set(index, name, value)
        for extra in chosen[1:]:
            table.append_row({**original, **runtime_cells(extra, tag)})
            appended += 1
    unused = [call for call in calls if call.join_key not in used]
    return BackfillResult(rows_before, len(fills), appended, len(calls), len(unused), unused[0] if unused else None)


def describe_key(key: JoinKey) -> str:
    def text(shape: Shape | None) -> str:
        return "-" if shape is None else "[" + ",".join(map(str, shape)) + "]"

    q, k, v, mask, table, requests = key
    return (f"query {text(q)} key {text(k)} value {text(v)} atten_mask {text(mask)} block_table {text(table)} "
            f"requests {'-' if requests is None else requests}")  # fmt: skip


def fill_csv(csv_path: str | Path, jsonl_path: str | Path, output: str | Path | None = None,
             mode: str = "median", tag: str = DEFAULT_TAG) -> BackfillResult:  # fmt: skip
    """Read both files, back-fill, write ``output`` (default: the CSV itself, atomically) if anything matched."""
    calls = read_calls(jsonl_path)
    table = CsvTable.read(csv_path)
    if not table.has_column("Input Shapes"):
        raise DatabaseError(f"not a {KERNEL_TYPE} database file: no 'Input Shapes' column", path=csv_path)
    result = backfill(table, calls, mode, tag)
    if result.matched:
        table.write(output if output is not None else csv_path)
    return result
