"""op_mapping.yaml: alternate kernel types replay through their primary's replay."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from perf_plugin.database.errors import DatabaseError
from perf_plugin.replay.op_mapping import missing_replay_reason, replay_aliases, replay_lookup_for
from perf_plugin.replay.registry import catalog, get_replay
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


def test_a_row_without_a_replay_says_what_op_mapping_says_of_its_kernel_type(tmp_path: Path) -> None:
    # the real file, with a Profiling-only placeholder appended in the format its header documents
    text = REAL.read_text().replace(
        "\noperator_mappings:\n", '\noperator_mappings:\n  "profiling.NoApiKernel":\n    kernel_type: NoApiKernel\n\n', 1
    )
    (tmp_path / "op_mapping.yaml").write_text(text)
    mappings = yaml.safe_load(text)["operator_mappings"]
    assert missing_replay_reason(tmp_path, "NoSuchKernel") == (
        "no replay for kernel type NoSuchKernel, and op_mapping.yaml names it in no mapping"
    )
    assert missing_replay_reason(tmp_path, "NoApiKernel") == (
        "no replay for kernel type NoApiKernel; op_mapping.yaml names it in "
        "profiling.NoApiKernel (a Profiling-only placeholder: no API to call)"
    )
    # a real primary kernel type of the file that has no replay here, if any, is named as such
    unreplayed = [(op, m["kernel_type"]) for op, m in mappings.items()
                  if isinstance(m, dict) and isinstance(m.get("kernel_type"), str)
                  and catalog().replay(m["kernel_type"]) is None and not op.startswith("profiling.")]
    for op, kernel_type in unreplayed[:3]:
        assert f"{op} (its primary kernel type)" in missing_replay_reason(tmp_path, kernel_type)
    assert "has no op_mapping.yaml" in missing_replay_reason(tmp_path / "elsewhere", "NoSuchKernel")


def test_an_op_mapping_left_as_a_git_lfs_pointer_is_refused(tmp_path: Path) -> None:
    (tmp_path / "op_mapping.yaml").write_text(
        "version https://git-lfs.github.com/spec/v1\n"
        "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 12345\n"
    )
    with pytest.raises(DatabaseError, match="is a Git LFS pointer, not the op_mapping.yaml: run `git lfs pull`"):
        replay_lookup_for(tmp_path)
