"""``perfdb upgrade-comm`` on a database in the old layout, and the cell editor it rewrites files with.

The old tree holds what this project wrote before (``hccl/8.5``, nccl-tests' ``message_bytes``,
``DT_FLOAT16``/``FLOAT``/``INT8``, no ``nccl_tests_bytes``), a row in the Ascend microbenchmark's
format, a file this project does not write and cells quoted the way no writer of ours quotes
them, so "nothing else changes" is checked byte for byte.  After the upgrade the Ascend reader
(re-implemented in test_comm_reader_compat) finds every row at the size the model computes.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from perf_plugin.cli import main as perfdb
from perf_plugin.comm.collectives import COLLECTIVES, COMM_DTYPES
from perf_plugin.comm.plan import CommCase
from perf_plugin.comm.record import CommResult
from perf_plugin.comm.writer import upsert_result
from perf_plugin.database.cell_edit import CellEditor, scan
from perf_plugin.database.errors import DatabaseError
from tests.test_comm_reader_compat import (
    DEVICE,
    TC_OPS,
    CommReader,
    ascend_database,
    model_first_arg,
)

OLD_HEADER = (
    "message_bytes,num_devices,dtype,topology_tier,Duration(us),bandwidth_gbps,bus_bandwidth_gbps,"
    "Median Duration(us),iterations,mode,backend,world_size,timestamp"
)
# all_gather as the old writer wrote it (nccl-tests' size: the gathered output), CRLF, a BOM, a
# quoted mode cell, and a row of the Ascend microbenchmark (no backend: message_bytes already
# one rank's input).  bandwidth_gbps = message_bytes / Duration, bus = that x (n-1)/n.
OLD_ALL_GATHER = (
    "\ufeff" + OLD_HEADER + "\r\n"
    "8192,2,DT_FLOAT16,2,10.5,0.780190,0.390095,10.25,20,\"kernel\",hccl,16,2026-01-01T00:00:00Z\r\n"
    "1048576,16,INT8,1,40,26.2144,24.576,39.5,20,event,hccl,16,\"2026-01-02T00:00:00Z\"\r\n"
    "65536,16,DT_BF16,1,30.2,2.17,,,,,,,\r\n"
)
NEW_ALL_GATHER = (
    "\ufeff" + OLD_HEADER + ",nccl_tests_bytes\r\n"
    "4096,2,DT_FP16,2,10.5,0.390095,0.390095,10.25,20,\"kernel\",hccl,16,2026-01-01T00:00:00Z,8192\r\n"
    "65536,16,DT_INT8,1,40,1.6384,24.576,39.5,20,event,hccl,16,\"2026-01-02T00:00:00Z\",1048576\r\n"
    "65536,16,DT_BF16,1,30.2,2.17,,,,,,,,1048576\r\n"
)
# all_reduce: the size is the same either way; only the dtype and the new column change
OLD_ALL_REDUCE = OLD_HEADER + "\n4096,2,FLOAT,2,8,0.512,0.512,8,20,kernel,hccl,16,2026-01-01T00:00:00Z\n"
NEW_ALL_REDUCE = (
    OLD_HEADER + ",nccl_tests_bytes\n4096,2,DT_FLOAT,2,8,0.512,0.512,8,20,kernel,hccl,16,2026-01-01T00:00:00Z,4096\n"
)
# reduce_scatter on NCCL (directory keeps its name), a last line without a line break
OLD_REDUCE_SCATTER = OLD_HEADER + "\n32768,4,DT_BF16,1,20,1.6384,1.2288,20,5,kernel,nccl,4,2026-01-01T00:00:00Z"
NEW_REDUCE_SCATTER = (
    OLD_HEADER + ",nccl_tests_bytes\n8192,4,DT_BF16,1,20,0.4096,1.2288,20,5,kernel,nccl,4,2026-01-01T00:00:00Z,32768"
)
FOREIGN = "message_bytes,num_devices,dtype,topology_tier,Duration(us)\n1024,16,DT_BF16,1,9\n"


def old_tree(tmp_path: Path) -> Path:
    root = tmp_path / "database" / "data"
    hccl = root / DEVICE / "hccl" / "8.5"
    hccl.mkdir(parents=True)
    (hccl / "hcom_allGather_.csv").write_bytes(OLD_ALL_GATHER.encode())
    (hccl / "hcom_allReduce_.csv").write_bytes(OLD_ALL_REDUCE.encode())
    (hccl / "hcom_alltoall_.csv").write_bytes(FOREIGN.encode())  # a kernel type this project does not measure
    (hccl / "comm_config.yaml").write_text("cann_version: '8.5'\n")
    nccl = root / "NVIDIA_H100_80GB_HBM3" / "nccl" / "2.21.5"
    nccl.mkdir(parents=True)
    (nccl / "hcom_reduceScatter_.csv").write_bytes(OLD_REDUCE_SCATTER.encode())
    ascend_database(root, "vllm0.18.0_torch2.9.0_cann8.5")
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_dry_run_lists_everything_and_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = old_tree(tmp_path)
    before = snapshot(root)
    assert perfdb(["upgrade-comm", str(root), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    hccl = root / DEVICE / "hccl"
    assert out == [
        (
            f"upgrade-comm: rewrite {hccl / '8.5' / 'hcom_allGather_.csv'}: 2 rows to the reader's message_bytes; "
            "2 dtype cells respelled; nccl_tests_bytes column added, 3 cells filled"
        ),
        (
            f"upgrade-comm: rewrite {hccl / '8.5' / 'hcom_allReduce_.csv'}: 1 dtype cell respelled; "
            "nccl_tests_bytes column added, 1 cell filled"
        ),
        f"upgrade-comm: leave {hccl / '8.5' / 'hcom_alltoall_.csv'} (not a file this project writes)",
        f"upgrade-comm: move {hccl / '8.5'} -> {hccl / 'v8.5'}",
        (
            f"upgrade-comm: rewrite {root / 'NVIDIA_H100_80GB_HBM3/nccl/2.21.5/hcom_reduceScatter_.csv'}: "
            "1 row to the reader's message_bytes; nccl_tests_bytes column added, 1 cell filled"
        ),
        "upgrade-comm: 3 files to rewrite, 1 directory to move (dry run: nothing changed)",
    ]
    assert snapshot(root) == before


def test_upgrade_rewrites_only_what_it_must_and_is_idempotent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = old_tree(tmp_path)
    assert perfdb(["upgrade-comm", str(root)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "upgrade-comm: 3 files rewritten, 1 directory moved"
    hccl = root / DEVICE / "hccl"
    assert not (hccl / "8.5").exists()
    new = hccl / "v8.5"
    assert (new / "hcom_allGather_.csv").read_bytes() == NEW_ALL_GATHER.encode()
    assert (new / "hcom_allReduce_.csv").read_bytes() == NEW_ALL_REDUCE.encode()
    assert (new / "hcom_alltoall_.csv").read_bytes() == FOREIGN.encode()
    assert (new / "comm_config.yaml").read_text() == "cann_version: '8.5'\n"
    nccl = root / "NVIDIA_H100_80GB_HBM3" / "nccl" / "2.21.5" / "hcom_reduceScatter_.csv"
    assert nccl.read_bytes() == NEW_REDUCE_SCATTER.encode()
    after = snapshot(root)
    assert perfdb(["upgrade-comm", str(root)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"upgrade-comm: leave {new / 'hcom_alltoall_.csv'} (not a file this project writes)",
        f"upgrade-comm: nothing to upgrade under {root}",
    ]
    assert snapshot(root) == after


def test_the_reader_finds_every_upgraded_row(tmp_path: Path) -> None:
    root = old_tree(tmp_path)
    assert perfdb(["upgrade-comm", str(root)]) == 0
    reader = CommReader(root / DEVICE / "vllm_ascend" / "vllm0.18.0_torch2.9.0_cann8.5")
    # (op, dtype, nccl-tests' size, group, tier, Duration(us)) of every row of the old hccl files
    rows = [
        ("all_gather", "fp16", 8192, 2, 2, 10.5),
        ("all_gather", "int8", 1048576, 16, 1, 40.0),
        ("all_gather", "bf16", 1048576, 16, 1, 30.2),
        ("all_reduce", "fp32", 4096, 2, 2, 8.0),
    ]
    for op, dtype, size, n, tier, duration in rows:
        first_arg = model_first_arg(COLLECTIVES[op], COMM_DTYPES[dtype], size, n)
        # the int8 and bf16 rows have one size: the reader, reading no dtype, takes the first
        expected = 40.0 if (op, size) == ("all_gather", 1048576) else duration
        assert reader.lookup(TC_OPS[op], first_arg, list(range(n)), tier) == expected, (op, dtype)


def _result(op: str, n: int, size: int, tier: int, duration: float, ccl: str) -> CommResult:
    case = CommCase(COLLECTIVES[op], n, COMM_DTYPES["bf16"], size, tier)
    return CommResult(case, (duration,), "kernel", ccl, n, "2026-02-01T00:00:00Z")


def test_the_writer_refuses_an_old_file_until_it_is_upgraded(tmp_path: Path) -> None:
    root = old_tree(tmp_path)
    nccl = root / "NVIDIA_H100_80GB_HBM3" / "nccl" / "2.21.5"
    with pytest.raises(DatabaseError) as info:
        upsert_result(nccl, _result("reduce_scatter", 4, 32768, 1, 25.0, "nccl"))
    assert str(info.value) == (
        f"{nccl / 'hcom_reduceScatter_.csv'}, row 2, column 'message_bytes': written with nccl-tests' "
        f"message_bytes (no nccl_tests_bytes): run 'perfdb upgrade-comm {nccl}' first"
    )
    assert (nccl / "hcom_reduceScatter_.csv").read_bytes() == OLD_REDUCE_SCATTER.encode()
    assert perfdb(["upgrade-comm", str(nccl)]) == 0
    upsert_result(nccl, _result("reduce_scatter", 4, 32768, 1, 25.0, "nccl"))  # the same case: replaced
    rows = list(csv.DictReader(io.StringIO((nccl / "hcom_reduceScatter_.csv").read_text())))
    assert [(r["message_bytes"], r["nccl_tests_bytes"], r["Duration(us)"]) for r in rows] == [("8192", "32768", "25")]


def test_validate_comm_pairs_old_and_upgraded_rows_by_the_readers_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = old_tree(tmp_path / "old") / DEVICE / "hccl" / "8.5"
    upgraded_root = old_tree(tmp_path / "new")
    assert perfdb(["upgrade-comm", str(upgraded_root)]) == 0
    capsys.readouterr()
    upgraded = upgraded_root / DEVICE / "hccl" / "v8.5"
    assert perfdb(["validate-comm", str(old), str(upgraded), "--gate", "--all"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("validate-comm: 5 compared, 0 beyond")
    assert any(line.startswith("all_gather") and "message_bytes=4096 num_devices=2" in line for line in out)


def test_both_layouts_present_or_a_bad_cell_stop_before_any_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = old_tree(tmp_path)
    (root / DEVICE / "hccl" / "v8.5").mkdir()
    before = snapshot(root)
    assert perfdb(["upgrade-comm", str(root)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"perfdb upgrade-comm: error: {root / DEVICE / 'hccl' / '8.5'}: v8.5 exists beside it: move the files "
        "of one into the other (perfdb validate-comm compares them), then run the upgrade again"
    )
    assert snapshot(root) == before
    (root / DEVICE / "hccl" / "v8.5").rmdir()
    nccl = root / "NVIDIA_H100_80GB_HBM3" / "nccl" / "2.21.5" / "hcom_reduceScatter_.csv"
    nccl.write_bytes(OLD_REDUCE_SCATTER.replace("32768,4,", "32768,four,").encode())
    before = snapshot(root)
    assert perfdb(["upgrade-comm", str(root)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"perfdb upgrade-comm: error: {nccl}, row 2, column 'num_devices': 'four' is not an integer"
    )
    assert snapshot(root) == before
    assert perfdb(["upgrade-comm", str(tmp_path / "nowhere")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_an_empty_file_is_left_and_a_git_lfs_pointer_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "nccl" / "2.21.5"
    directory.mkdir(parents=True)
    (directory / "hcom_allReduce_.csv").write_bytes(b"")
    assert perfdb(["upgrade-comm", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"upgrade-comm: nothing to upgrade under {tmp_path}"]
    pointer = directory / "hcom_allGather_.csv"
    # the stored form of the public hccl/v8.5 files of Ascend/msmodeling
    pointer.write_text(
        "version https://git-lfs.github.com/spec/v1\n"
        "oid sha256:196f10067312628163737e32579d12fd268a46dfbf52eef16fb106a3feb98485\nsize 5447\n"
    )
    assert perfdb(["upgrade-comm", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(pointer) in err and "Git LFS pointer" in err


# ----------------------------------------------------------------------------- the cell editor
TRICKY = (
    '\ufeffa,"b, with comma",c\r\n'
    '1,"say ""hi""","multi\nline"\r\n'
    '\r\n'
    '"quoted",,\n'
    'x,"""4096,1024""",z'
)


def test_scan_reads_cells_as_the_csv_module_does() -> None:
    editor = CellEditor(TRICKY)
    expected = list(csv.reader(io.StringIO(TRICKY.removeprefix("\ufeff"), newline="")))
    got = [editor.values(i) for i in range(len(editor.records))]
    assert [cells for cells in got if cells != [""]] == [cells for cells in expected if cells]
    assert [r.line for r in scan(TRICKY)] == [1, 2, 4, 5, 6]
    assert editor.render() == TRICKY


def test_only_the_changed_cells_change() -> None:
    editor = CellEditor(TRICKY)
    editor.set(1, 0, "2")
    editor.set(3, 1, "new, quoted")
    editor.set(3, 0, "quoted")  # the same value: the quoted original stays
    editor.set(4, 4, "e")  # past the end: an empty cell between
    assert editor.render() == (
        '\ufeffa,"b, with comma",c\r\n'
        '2,"say ""hi""","multi\nline"\r\n'
        '\r\n'
        '"quoted","new, quoted",\n'
        'x,"""4096,1024""",z,,e'
    )
