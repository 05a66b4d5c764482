"""op_mapping.yaml: alternate kernel types replay through their primary's replay."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from perf_plugin.database.errors import DatabaseError
from perf_plugin.replay.op_mapping import replay_aliases, replay_lookup_for
from perf_plugin.replay.registry import get_replay
from tests.conftest import ASCEND
from tests.test_plugin import HEADER, run, write_csv  # noqa: F401  (fixture module reuse)
from tests.test_plugin import _profiler_modules_loaded, project  # noqa: F401

REAL = ASCEND / "op_mapping_vllm0.18.0_torch2.9.0_cann8.5.yaml"


def has_replay(name: str) -> bool:
    return get_replay(name) is not None


def test_real_op_mapping_aliases_alternates_to_replayable_primaries() -> None:
    aliases = replay_aliases(REAL, has_replay)
    assert aliases["AddAiCore"] == "Add"
    assert aliases["CastAiCore"] == "Cast"
    assert aliases["GatherV2AiCore"] == "GatherV2"
    # aten.embedding's alternate, but the primary of aten.index_select: another API launches it
    assert "GatherV3" not in aliases
    # kernel types with a replay of their own are never aliased
    assert "MatMulV3" not in aliases and "TensorMove" not in aliases and "TransposeBatchMatMul" not in aliases
    assert all(has_replay(primary) for primary in aliases.values())


def test_older_real_op_mapping_also_loads() -> None:
    aliases = replay_aliases(ASCEND / "op_mapping_vllm0.13.0_torch2.8.0_cann8.3.yaml", has_replay)
    assert all(has_replay(primary) for primary in aliases.values())


def test_lookup_without_op_mapping_is_the_registry(tmp_path: Path) -> None:
    lookup, replay_type = replay_lookup_for(tmp_path)
    assert lookup("AddAiCore") is None
    assert replay_type("Add") == "Add"


def test_malformed_op_mapping_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "op_mapping.yaml").write_text("operator_mappings:\n  aten.mm.default: {kernel_type: [\n")
    with pytest.raises(DatabaseError) as info:
        replay_lookup_for(tmp_path)
    assert "op_mapping.yaml" in str(info.value) and "row" in str(info.value)


def test_alternate_kernel_type_csv_replays_and_is_written_back(pytester: pytest.Pytester, project: Path) -> None:  # noqa: F811
    shutil.copy(REAL, project / "op_mapping.yaml")
    write_csv(project / "AddAiCore.csv", HEADER, ['dynamic,AI_VECTOR_CORE,"""8,128;8,128""",FLOAT;FLOAT,ND;ND,"""8,128""",FLOAT,ND'])
    result = run(pytester, project, "-k", "AddAiCore")
    result.assert_outcomes(passed=1, deselected=3)
    text = (project / "AddAiCore.csv").read_text()
    assert "Average Duration(us)" in text.splitlines()[0]
