"""Every NPU call the replays build binds to the operator schemas of the real torch-npu wheel.

The schemas are the ones ``torch_npu-2.14.0`` compiles into its libraries
(``tests/fixtures/torch_npu/schemas.txt``, ``reproduce/torch_npu_schemas.py``).  The calls are
built (on the CPU, without torch_npu) from the rows of the real Ascend profiles and database
files in ``tests/fixtures/ascend`` and from the example rows of the kernel tests, for every
replay whose API is a ``torch_npu`` function; a call binds when one overload takes its
positional count, its keywords and every required argument.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import tests.kernels
from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.registry import catalog
from tests.conftest import ASCEND
from tests.kernels.support import _table, npu_call_of, replay_of
from tests.npu_schemas import Schema, binding_error, load_schemas, parse_schema

PROFILES = ("kernel_details_level1.csv", "kernel_details_level2_llm_train.csv")


def _real_rows(tmp: Path) -> Iterator[tuple[str, dict[str, str]]]:
    for name in PROFILES:
        db = tmp / name
        ingest_path(ASCEND / name, db)
        for path in sorted(db.glob("*.csv")):
            table = _table(path)
            yield from ((path.stem, table.row_dict(i)) for i in range(len(table)))
    for path in sorted(ASCEND.glob("db_row_*.csv")):
        table = _table(path)
        yield from ((path.stem.removeprefix("db_row_"), table.row_dict(i)) for i in range(len(table)))


def _example_rows() -> Iterator[dict[str, str]]:
    """Module-level rows (dicts with ``Input Shapes``) of the kernel tests."""
    for info in pkgutil.iter_modules(tests.kernels.__path__):
        if not info.name.startswith("test_"):
            continue
        module = importlib.import_module(f"tests.kernels.{info.name}")
        for value in vars(module).values():
            if isinstance(value, dict) and "Input Shapes" in value:
                yield value


def _npu_kernel_types() -> list[str]:
    return sorted(kt for kt in catalog().kernel_types() if (replay_of(kt).npu_api or "").startswith("torch_npu."))


@pytest.fixture(scope="module")
def calls(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str, object]]:
    """(kernel type, where the row came from, the ApiCall) of every row a torch_npu replay takes."""
    built = []
    npu_types = set(_npu_kernel_types())
    rows = [(kt, cells, "real") for kt, cells in _real_rows(tmp_path_factory.mktemp("profiles")) if kt in npu_types]
    rows += [(kt, cells, "example") for cells in _example_rows() for kt in npu_types]
    for kernel_type, cells, origin in rows:
        try:
            call = npu_call_of(kernel_type, cells, device="meta")  # shapes only: no data allocated
        except (CaseBuildError, AssertionError, KeyError, ValueError, IndexError, TypeError):
            continue  # a row of another layout, or one this replay does not take
        built.append((kernel_type, origin, call))
    return built


def test_the_fixture_holds_the_wheels_schemas() -> None:
    schemas = load_schemas()
    assert sum(len(v) for v in schemas.values()) > 400
    assert {"npu_grouped_matmul", "npu_format_cast", "npu_fused_infer_attention_score", "npu_rms_norm"} <= set(schemas)


def test_every_torch_npu_call_binds_to_a_registered_schema(calls: list[tuple[str, str, object]]) -> None:
    schemas = load_schemas()
    assert len(calls) >= 80 and {origin for _, origin, _ in calls} == {"real", "example"}
    covered = {kernel_type for kernel_type, _, _ in calls}
    assert len(covered) >= 15, sorted(covered)
    mismatches = []
    for kernel_type, origin, call in calls:
        name = call.api.removeprefix("torch_npu.")  # type: ignore[attr-defined]
        overloads = schemas.get(name)
        if not overloads:
            mismatches.append(f"{kernel_type} ({origin}): {call.api} is not a registered operator")  # type: ignore[attr-defined]
            continue
        errors = [binding_error(s, call.args, call.kwargs) for s in overloads]  # type: ignore[attr-defined]
        if all(errors):
            mismatches.append(f"{kernel_type} ({origin}): {call.api}: {'; '.join(e or '' for e in errors)}")  # type: ignore[attr-defined]
    assert not mismatches, "\n".join(sorted(set(mismatches)))


def test_a_call_that_does_not_fit_is_named() -> None:
    schema = parse_schema("npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)")
    assert isinstance(schema, Schema)
    assert binding_error(schema, (1, 2), {}) is None
    assert binding_error(schema, (1, 2, 3, 4), {}) == "4 positional arguments, the schema takes 3"
    assert binding_error(schema, (1,), {}) == "required argument(s) gamma missing"
    assert binding_error(schema, (1, 2), {"eps": 1}) == "no argument named 'eps'"
    assert binding_error(schema, (1, 2), {"gamma": 1}) == "'gamma' given positionally and by keyword"
    kw_only = parse_schema("npu_x(Tensor a, *, int? b=None, int c) -> Tensor")
    assert kw_only is not None and binding_error(kw_only, (1, 2), {"c": 1}) == "2 positional arguments, the schema takes 1"
    assert parse_schema("load.out(Tensor cache, int num_kensor block_tabl") is None  # a broken string of the binary
