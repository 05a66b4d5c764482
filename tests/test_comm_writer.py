"""Collective CSV upserts and ``perfdb validate-comm``, on files written and read with the csv module."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from perf_plugin.cli import main as perfdb
from perf_plugin.comm.collectives import COLLECTIVES, parse_dtype
from perf_plugin.comm.plan import CommCase
from perf_plugin.comm.record import COLUMNS, CommResult
from perf_plugin.comm.writer import upsert_result
from perf_plugin.database.errors import DatabaseError


def _result(op: str = "all_reduce", size: int = 1024, n: int = 2, dtype: str = "bf16", samples=(10.0, 20.0), mode="kernel"):
    case = CommCase(COLLECTIVES[op], n, parse_dtype(dtype), size, 1)
    return CommResult(case, tuple(samples), mode, "gloo", 2, "2026-01-01T00:00:00Z")


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_new_file_then_replace_then_append(tmp_path: Path) -> None:
    path = upsert_result(tmp_path, _result())
    assert path == tmp_path / "hcom_allReduce_.csv"
    with open(path, newline="") as handle:
        assert next(csv.reader(handle)) == list(COLUMNS)
    assert [r["Duration(us)"] for r in _rows(path)] == ["15"]
    upsert_result(tmp_path, _result(samples=(30.0, 50.0)))  # same key: replaced
    upsert_result(tmp_path, _result(mode="event"))  # mode is part of the key: appended
    upsert_result(tmp_path, _result(dtype="int8"))
    rows = _rows(path)
    assert [(r["Duration(us)"], r["mode"], r["dtype"]) for r in rows] == [
        ("40", "kernel", "DT_BF16"), ("15", "event", "DT_BF16"), ("15", "kernel", "DT_INT8"),
    ]
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_existing_file_keeps_its_rows_and_gets_the_fresh_average(tmp_path: Path) -> None:
    original = (
        "message_bytes,num_devices,dtype,topology_tier,Average Duration(us),Duration(us),bandwidth_gbps,note\r\n"
        "2048,2,BF16,1,99.5,99.5,0.02,\"kept, as is\"\r\n"
        "1024,2,DT_BF16,1,77,77,0.013,old\r\n"
    )
    path = tmp_path / "hcom_allReduce_.csv"
    path.write_bytes(original.encode())
    upsert_result(tmp_path, _result(samples=(10.0, 20.0), mode="event"))  # no mode column: rows count as kernel
    upsert_result(tmp_path, _result(samples=(10.0, 20.0), mode="kernel"))
    text = path.read_bytes().decode()
    lines = text.split("\r\n")
    assert lines[1] == "2048,2,BF16,1,99.5,99.5,0.02,\"kept, as is\",,,,,,,,", lines[1]
    rows = _rows(path)
    assert rows[1]["Average Duration(us)"] == rows[1]["Duration(us)"] == "15"  # 'DT_BF16' key matched
    assert rows[1]["note"] == "old" and rows[1]["mode"] == "kernel"
    assert [(r["message_bytes"], r["mode"]) for r in rows[2:]] == [("1024", "event")]
    assert list(rows[0])[-8:] == list(COLUMNS[6:])  # added columns at the end


def test_malformed_existing_row_is_one_error_and_nothing_changes(tmp_path: Path) -> None:
    path = tmp_path / "hcom_allGather_.csv"
    original = b"message_bytes,num_devices,dtype,topology_tier,Duration(us),bandwidth_gbps\n1024,two,DT_BF16,1,5,1\n"
    path.write_bytes(original)
    with pytest.raises(DatabaseError) as info:
        upsert_result(tmp_path, _result("all_gather"))
    assert str(info.value) == f"{path}, row 2, column 'num_devices': 'two' is not an integer"
    assert path.read_bytes() == original
    missing = tmp_path / "hcom_alltoallv_.csv"
    missing.write_text("size,Duration(us)\n1024,3\n")
    with pytest.raises(DatabaseError, match="column 'message_bytes': missing column"):
        upsert_result(tmp_path, _result("all_to_all"))


# ----------------------------------------------------------------------------- validate-comm
HEADER = "message_bytes,num_devices,dtype,topology_tier,Duration(us),bandwidth_gbps\n"


def _write(directory: Path, name: str, rows: list[str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(HEADER + "".join(r + "\n" for r in rows))
    return path


def test_validate_comm_directories(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, cand = tmp_path / "base", tmp_path / "cand"
    _write(base, "hcom_allReduce_.csv", ["1024,16,DT_BF16,1,100,0.01", "2048,16,DT_BF16,1,200,0.01", "4096,16,DT_BF16,1,300,0.01"])
    _write(cand, "hcom_allReduce_.csv", ["1024,16,DT_BF16,1,109,0.01", "2048,16,DT_BF16,1,250,0.01", "8192,16,DT_BF16,1,1,1"])
    _write(base, "hcom_allGather_.csv", ["1024,2,DT_BF16,2,10,0.1"])
    _write(cand, "hcom_allGather_.csv", ["1024,2,DT_BF16,2,8,0.1", "1024,2,DT_BF16,1,80,0.1"])
    assert perfdb(["validate-comm", str(base), str(cand)]) == 0
    out = capsys.readouterr().out.splitlines()
    flagged = [line for line in out if "DEVIATES" in line]
    assert len(flagged) == 2
    assert flagged[0].startswith("all_gather") and "topology_tier=2" in flagged[0] and "-20.0%" in flagged[0]
    assert flagged[1].startswith("all_reduce") and "message_bytes=2048" in flagged[1] and "+25.0%" in flagged[1]
    assert out[-1] == (
        "validate-comm: 3 compared, 2 beyond ±10%; only in baseline 1, only in candidate 2; rows without a duration 0"
    )
    assert perfdb(["validate-comm", str(base), str(cand), "--gate"]) == 1
    assert perfdb(["validate-comm", str(base), str(cand), "--gate", "--threshold", "0.3"]) == 0
    capsys.readouterr()
    report = tmp_path / "pairs.csv"
    assert perfdb(["validate-comm", str(base), str(cand), "--output", str(report)]) == 0
    rows = _rows(report)
    assert [(r["op"], r["message_bytes"], r["deviation"], r["flagged"]) for r in rows] == [
        ("all_gather", "1024", "-0.2", "1"), ("all_reduce", "1024", "0.09", "0"), ("all_reduce", "2048", "0.25", "1"),
    ]


def test_validate_comm_files_keys_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _write(tmp_path, "measured.csv", ["1024,2,DT_BF16,1,10,1", "1024,2,INT8,1,10,1", "2048,2,DT_BF16,1,,1"])
    b = tmp_path / "reference.csv"
    b.write_text("message_bytes,num_devices,Average Duration(us)\n1024,2,12\n")  # no dtype column: not in the key
    assert perfdb(["validate-comm", str(b), str(a)]) == 2  # dtype dropped from the key: two rows collide
    assert "have the same key (message_bytes=1024, num_devices=2)" in capsys.readouterr().err
    c = _write(tmp_path / "c", "x.csv", ["1024,2,DT_BF16,1,12,1"])
    assert perfdb(["validate-comm", str(c), str(a), "--gate"]) == 1  # 10 vs 12: -16.7%
    out = capsys.readouterr().out
    assert "-16.7%" in out and "rows without a duration 1" in out
    assert perfdb(["validate-comm", str(tmp_path / "nope"), str(a)]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert perfdb(["validate-comm", str(empty), str(tmp_path / "c")]) == 2
    assert "no hcom_*.csv files" in capsys.readouterr().err
    d = _write(tmp_path / "d", "y.csv", ["4096,2,DT_BF16,1,12,1"])
    assert perfdb(["validate-comm", str(d), str(a), "--gate"]) == 1  # nothing matched
    assert "nothing to compare" in capsys.readouterr().err
