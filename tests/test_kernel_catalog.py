"""The kernel catalog: discovery of the built-in modules and of entry points, and what it declares.

The end-to-end test adds a kernel type the way a user or a third-party package does, in one new
file and nothing else: a module and a distribution (``.dist-info`` with an entry point of the
group ``perf_plugin.replays``) on ``sys.path``.  A real torch.profiler trace that calls the
operator is ingested, and ``pytest bench`` replays the row that ingest wrote.
"""

from __future__ import annotations

import csv
import importlib
import pkgutil
from pathlib import Path

import pytest

from perf_plugin.cli import main as perfdb
from perf_plugin.database.signature import PLAIN, SignatureRule
from perf_plugin.replay import registry
from perf_plugin.replay.base import OpReplay
from perf_plugin.replay.registry import CatalogError, build_catalog, refresh_catalog, replay_classes_in
from tests.test_plugin import _profiler_modules_loaded  # noqa: F401  (torch.profiler's lazy imports, before pytester)

BENCH_TEST = (Path(__file__).parents[1] / "bench" / "test_kernels.py").read_text()

TANH_MODULE = '''
"""A kernel type in one file: ``Tanh`` (its replay, its traced operator, its NPU API)."""
from types import MappingProxyType

from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.trace.args import tensor_arg
from perf_plugin.trace.mapped import MappedOp, Slot


def _trace_tanh(op, descendants):
    x = tensor_arg(op, 0)
    if x is None:
        return None
    return MappedOp("Tanh", (Slot(x.shape, x.dtype),), (Slot(x.shape, x.dtype),))


class TanhReplay(OpReplay):
    kernel_types = ("Tanh",)
    npu_api = "torch.tanh"
    trace_ops = MappingProxyType({"aten::tanh": _trace_tanh})

    def check(self, row):
        if len(row.present_inputs) != 1 or len(row.present_outputs) != 1:
            raise CaseBuildError("Tanh needs one input and one output")

    def make_inputs(self, row, device, generator):
        return (self.random(row.present_inputs[0], device, generator),)

    def run(self, x):
        return x.tanh()
'''


def install_distribution(site: Path, module_name: str, source: str, entry_point: str) -> None:
    """A module and the metadata of an installed distribution naming it in the replay group."""
    (site / f"{module_name}.py").write_text(source)
    info = site / f"{module_name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module_name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\n{entry_point}\n")


@pytest.fixture
def restore_catalog():
    """The catalog built with a test's extra distribution is not left behind for other tests
    (requested before ``monkeypatch``, so it rebuilds after ``sys.path`` is restored)."""
    yield
    refresh_catalog()


def test_every_module_of_the_kernel_package_is_discovered() -> None:
    catalog = build_catalog()
    package = importlib.import_module(registry.KERNEL_PACKAGE)
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("_"):
            continue  # a private module holds what several replay modules share
        module = importlib.import_module(f"{registry.KERNEL_PACKAGE}.{info.name}")
        classes = replay_classes_in(module)
        assert classes, f"{info.name} defines no replay"
        for cls in classes:
            for kernel_type in cls.kernel_types:
                assert type(catalog.replay(kernel_type)) is cls


def test_classes_imported_into_a_module_are_not_counted_twice() -> None:
    memory = importlib.import_module(f"{registry.KERNEL_PACKAGE}.memory")
    defined_here = {cls.__name__ for cls in replay_classes_in(memory)}
    assert "AddReplay" not in defined_here and "ConcatDReplay" in defined_here


def test_declarations_are_read_from_the_replay_classes() -> None:
    catalog = build_catalog()
    assert {catalog.family(k) for k in ("MatMulV2", "MatMulV3", "MatMulCommon")} == {"MatMul"}
    assert catalog.family_members("MatMul") == ["MatMulCommon", "MatMulV2", "MatMulV3"]
    assert catalog.family("Add") == "Add" and catalog.family("NoSuchKernel") == "NoSuchKernel"
    assert catalog.signature_rule("MatMulV3") == SignatureRule(canonical_matmul=True)
    assert catalog.signature_rule("Slice").input_slots == 1
    assert catalog.signature_rule("NoSuchKernel") is PLAIN
    assert catalog.npu_api("RmsNorm") == "torch_npu.npu_rms_norm"
    assert "aten::mm" in catalog.trace_mappers and "aten::rms_norm" in catalog.trace_mappers
    assert {"MatMulV2", "BatchMatMulV2"} <= catalog.trace_primary


def test_two_classes_claiming_one_kernel_type_is_an_error() -> None:
    class Other(OpReplay):
        kernel_types = ("Add",)

        def make_inputs(self, row, device, generator):  # type: ignore[no-untyped-def]
            return ()

        def run(self, *args):  # type: ignore[no-untyped-def]
            return ()

    with pytest.raises(CatalogError, match="kernel type 'Add' has two replays: .*AddReplay and test"):
        build_catalog(extra=[(Other, "test")])


def test_a_broken_entry_point_is_one_error_naming_it(
    restore_catalog: None, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = pytester.mkdir("site")
    install_distribution(site, "broken_replays", "raise ImportError('needs a compiler')\n", "broken = broken_replays")
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(CatalogError, match=r"entry point 'broken' = 'broken_replays' .* cannot be loaded: ImportError: needs a compiler"):
        refresh_catalog()


def _tanh_trace(path: Path) -> Path:
    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(64, 32)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(3):
            torch.tanh(x)
    prof.export_chrome_trace(str(path))
    return path


def test_a_kernel_type_in_one_new_file_is_ingested_collected_and_replayed(
    restore_catalog: None, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = pytester.mkdir("site")
    install_distribution(site, "tanh_replay", TANH_MODULE, "tanh = tanh_replay")
    monkeypatch.syspath_prepend(str(site))
    trace = _tanh_trace(pytester.path / "trace.json")
    db = pytester.path / "db"

    assert perfdb(["ingest", "--profiling-path", str(trace), "--database-path", str(db)]) == 0
    (row,) = list(csv.DictReader((db / "Tanh.csv").open()))  # named by the new file's trace_ops
    assert (row["Input Shapes"], row["Output Shapes"]) == ('"64,32"', '"64,32"')
    assert not (db / "aten.tanh.csv").exists()

    pytester.makepyfile(test_kernels=BENCH_TEST)
    result = pytester.runpytest(
        "--database-path", str(db), "--repeat-count", "3", "--warmup-count", "1", "-p", "no:cacheprovider", "-v"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_kernel_replay?Tanh-64x32-FLOAT-to-64x32-FLOAT? PASSED*"])
    (row,) = list(csv.DictReader((db / "Tanh.csv").open()))
    assert float(row["Average Duration(us)"]) > 0 and row["MicroBench Backend"] == "cpu"
