"""JSON profile files, plain or gzip-compressed, and the one error each kind of bad file gets."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from perf_plugin.database.errors import DatabaseError
from perf_plugin.ingest.json_file import load_json_file


def test_plain_and_compressed_files_read_the_same(tmp_path: Path) -> None:
    text = '\ufeff{"traceEvents": [{"name": "aten::mm"}]}'  # a byte-order mark is allowed
    (tmp_path / "trace.json").write_text(text, encoding="utf-8")
    (tmp_path / "trace.json.gz").write_bytes(gzip.compress(text.encode("utf-8")))
    assert load_json_file(tmp_path / "trace.json") == load_json_file(tmp_path / "trace.json.gz")


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("trace.json", b'{\n  "traceEvents": [,]\n}', r"trace.json: not a JSON trace: Expecting value at line 2, column 19"),
        ("trace.json", b'{"name": "\xff"}', r"trace.json: not UTF-8 text \(byte 10\)"),
        ("trace.json.gz", b"plain text", r"trace.json.gz: cannot read file: Not a gzipped file"),
    ],
)
def test_a_bad_file_gets_one_error_naming_it(tmp_path: Path, name: str, content: bytes, message: str) -> None:
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DatabaseError, match=message):
        load_json_file(tmp_path / name, "a JSON trace")


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError, match="missing.json: cannot read file: No such file"):
        load_json_file(tmp_path / "missing.json")
