"""Where a run reads and writes: derived paths per backend, explicit paths, seeding, backend choice."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from perf_plugin.backends.select import resolve_backend
from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.paths import shipped_sample_dir
from perf_plugin.database.table import CsvTable
from perf_plugin.options import Settings
from perf_plugin.run.location import DeviceIdentity, resolve_location, seed_from_sample


def settings(**changes: object) -> Settings:
    base = Settings(
        database_path=None, database_root=Path("db"), device=None, vllm_version=None, torch_version="2.9.0",
        cann_version=None, cuda_version=None, backend="auto", update_mode="all", prune_empty_duration_rows=False,
        repeat_count=30, warmup_count=5, prof_path=None, replay_coverage_min=None, replay_coverage_weight="rows",
        profile_batch_size=32,
        no_writeback=False, seed=0, cache_mode="auto", rotate_max_copies=1024, repeat_markers=False,
        lock_timeout=5.0, replay_log_capture="auto",
    )
    return dataclasses.replace(base, **changes)


CUDA = DeviceIdentity("cuda", "NVIDIA_H100_80GB_HBM3", "13.0")
CPU = DeviceIdentity("cpu", "CPU_X86_64", None)
NPU = DeviceIdentity("npu", "ATLAS_800_A3_752T_128G_DIE", "8.5")


def test_ascend_path_is_the_seeds_contract() -> None:
    location = resolve_location(settings(vllm_version="0.18.0", cann_version="8.5"), NPU)
    assert location.directory == Path("db/ATLAS_800_A3_752T_128G_DIE/vllm_ascend/vllm0.18.0_torch2.9.0_cann8.5")
    assert location.derived


def test_ascend_path_needs_the_versions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # nothing to detect them from, whatever this host has installed
    from perf_plugin.backends import ascend_versions

    monkeypatch.setattr(ascend_versions, "installed_version", lambda names: None)
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(tmp_path))
    with pytest.raises(DatabaseError, match="--vllm-version and --cann-version"):
        resolve_location(settings(), NPU)


def test_cuda_and_cpu_paths() -> None:
    assert resolve_location(settings(), CUDA).directory == Path("db/NVIDIA_H100_80GB_HBM3/torch/torch2.9.0_cuda13.0")
    with_vllm = resolve_location(settings(vllm_version="0.11.0", cuda_version="12.8", device="H100_SXM"), CUDA)
    assert with_vllm.directory == Path("db/H100_SXM/vllm/vllm0.11.0_torch2.9.0_cuda12.8")
    assert resolve_location(settings(), CPU).directory == Path("db/CPU_X86_64/torch/torch2.9.0")


def test_explicit_path_wins() -> None:
    location = resolve_location(settings(database_path=Path("/data/mine"), vllm_version="0.18.0"), NPU)
    assert location.directory == Path("/data/mine") and not location.derived


def test_unsafe_device_name_is_refused() -> None:
    with pytest.raises(DatabaseError, match="device"):
        resolve_location(settings(device="../../etc"), CUDA)


def test_seeding_copies_identity_columns_only_and_once(tmp_path: Path) -> None:
    sample = shipped_sample_dir(tmp_path)
    sample.mkdir(parents=True)
    (sample / "Add.csv").write_text(
        "OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,"
        'Output Formats,Average Duration(us),Row Origin\ndynamic,AI_CORE,"""8,8;8,8""",FLOAT;FLOAT,ND;ND,"""8,8""",'
        "FLOAT,ND,12.5,ascend-profile:x.csv\n"
    )
    location = resolve_location(settings(database_root=tmp_path), CUDA)
    note = seed_from_sample(location, tmp_path)
    assert note is not None and "1 kernel types, 1 rows" in note
    seeded = CsvTable.read(location.directory / "Add.csv")
    assert seeded.header[-1] == "Output Formats" and seeded.get(0, "Input Shapes") == '"8,8;8,8"'
    assert seed_from_sample(location, tmp_path) is None  # already there: left alone


def test_no_database_and_no_sample_is_a_clear_error(tmp_path: Path) -> None:
    location = resolve_location(settings(database_root=tmp_path), CUDA)
    with pytest.raises(DatabaseError, match="no shipped sample"):
        seed_from_sample(location, tmp_path)


def test_backend_choice() -> None:
    assert resolve_backend("cpu").name == "cpu"
    assert resolve_backend("auto").name in {"cpu", "cuda"}
    with pytest.raises(ValueError, match="unknown backend"):
        resolve_backend("tpu")
    with pytest.raises(RuntimeError, match="torch_npu"):
        resolve_backend("npu")
