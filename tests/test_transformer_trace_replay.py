"""A transformer layer's real profiler trace becomes a database that ``pytest bench`` replays.

One decoder layer of the Llama-3.1-8B architecture (scaled down for the CPU, random weights) runs
under torch.profiler with ``record_shapes``; ingest turns the live profiler into per-kernel CSVs;
the replay plugin then replays every row it has a replay for.
"""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pytest

from tests.test_plugin import BENCH_TEST, _profiler_modules_loaded  # noqa: F401

SCRIPT = Path(__file__).parents[1] / "examples" / "transformer_trace.py"


def load_script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("transformer_trace", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_decoder_layer_trace_ingests_and_replays(pytester: pytest.Pytester) -> None:
    db = pytester.path / "db"
    load_script().profile_and_ingest("llama-3.1-8b", tokens=32, device="cpu", dtype_name="bf16", out=db, scale=16)
    kernel_types = {p.stem for p in db.glob("*.csv")}
    assert {"MatMulV2", "BatchMatMulV2", "RmsNorm", "SoftmaxV2", "Add", "Mul", "GatherV2"} <= kernel_types
    with (db / "MatMulV2.csv").open(newline="") as handle:
        gemms = {row["Input Shapes"] for row in csv.DictReader(handle)}
    # 32 heads / 16 keeps the GQA ratio 4:1 -> 4 query heads and 1 KV head of 128: hidden 512;
    # q and o projections 512x512, k/v 128x512, MLP 14336/16 = 896
    assert {'"32,512;512,512"', '"32,512;128,512"', '"32,512;896,512"', '"32,896;512,896"'} <= gemms

    pytester.makepyfile(test_kernels=BENCH_TEST)
    result = pytester.runpytest("--database-path", str(db), "--repeat-count", "2", "--warmup-count", "1",
                                "-p", "no:cacheprovider", "-rs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("errors", 0) == 0
    assert outcomes["passed"] >= 14
    for name in ("MatMulV2", "BatchMatMulV2", "RmsNorm", "SoftmaxV2", "GatherV2"):
        with (db / f"{name}.csv").open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        assert rows and all(float(r["Average Duration(us)"]) > 0 for r in rows), name
        assert all(float(r["Profiling Average Duration(us)"]) > 0 for r in rows), name
