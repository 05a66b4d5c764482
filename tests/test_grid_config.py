"""Loading and checking the grid routing config."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from perf_plugin.cli import main
from perf_plugin.database.errors import DatabaseError
from perf_plugin.grid.config import UNDEFINED_SLOT, load_config

MINIMAL = """
grids:
  tokens: [1, 8]
kernels:
  MatMulV2:
    generator: gemm
    patterns:
      - name: linear
        over: {m: tokens}
        inputs: [[m, k], [n, K_EXPR]]
        outputs: [[m, n]]
"""


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_shipped_config_routes_the_replayable_kernel_types() -> None:
    config = load_config()
    for kernel_type in ("MatMulV2", "MatMulV3", "MatMulCommon", "BatchMatMulV2", "Add", "Mul", "Muls", "Cast",
                        "RmsNorm", "SwiGlu", "SoftmaxV2", "Transpose", "Slice", "GatherV2", "TensorMove", "ConcatD",
                        "FusedInferAttentionScore", "GroupedMatmul", "RotaryPositionEmbedding"):
        assert kernel_type in config.kernels
    fia = config.kernels["FusedInferAttentionScore"]
    assert fia.generator.name == "attention"
    assert {len(p.inputs) for p in fia.patterns} == {31}
    decode = fia.patterns[0]
    assert [i for i, slot in enumerate(decode.inputs) if slot.present] == [0, 1, 2, 4, 5, 6, 14]
    assert decode.inputs[3] == UNDEFINED_SLOT
    assert fia.column_names == ("avg_seq_len",)


def test_malformed_expression_names_key_and_position(tmp_path: Path) -> None:
    path = write_config(tmp_path, MINIMAL.replace("K_EXPR", '"k +* 2"'))
    with pytest.raises(DatabaseError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: kernels.MatMulV2.patterns[0].inputs[1][1]: malformed expression 'k +* 2': "
        "invalid syntax at character 4"
    )


def test_unknown_name_names_key_and_position(tmp_path: Path) -> None:
    path = write_config(tmp_path, MINIMAL.replace("K_EXPR", '"2 * hiden"'))
    expected = r"inputs\[1\]\[1\]: malformed expression '2 \* hiden': unknown name 'hiden' at character 5"
    with pytest.raises(DatabaseError, match=expected):
        load_config(path)


def test_forbidden_construct_is_rejected(tmp_path: Path) -> None:
    path = write_config(tmp_path, MINIMAL.replace("K_EXPR", "\"__import__('os').system('true')\""))
    with pytest.raises(DatabaseError, match=r"inputs\[1\]\[1\]: malformed expression .*at character 1"):
        load_config(path)


def test_malformed_expression_exits_2_through_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, MINIMAL.replace("K_EXPR", '"k +* 2"'))
    code = main(["grid", "--data-dir", str(tmp_path / "db"), "--config", str(path), "--kernel-types", "MatMulV2"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert "kernels.MatMulV2.patterns[0].inputs[1][1]" in err and "at character 4" in err
    assert not (tmp_path / "db").exists()


def test_yaml_is_read_with_the_safe_loader(tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    path = write_config(tmp_path, f"kernels: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(DatabaseError, match="not valid YAML"):
        load_config(path)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("replace", "message"),
    [
        (("generator: gemm", "generator: fancy"), "kernels.MatMulV2.generator: unknown generator 'fancy'"),
        (("over: {m: tokens}", "over: {m: tokenz}"), "kernels.MatMulV2.patterns[0].over.m: unknown grid 'tokenz'"),
        (
            ("name: linear", "name: linear\n        dtype: BF17"),
            "kernels.MatMulV2.patterns[0].dtype: unknown dtype 'BF17'",
        ),
        (("name: linear", "name: linear\n        colour: red"), "kernels.MatMulV2.patterns[0]: unknown key 'colour'"),
        (("tokens: [1, 8]", "tokens: [1, -8]"), "grids.tokens[1]: expected a positive integer, got -8"),
        (
            ("outputs: [[m, n]]", "outputs: [~]"),
            "kernels.MatMulV2.patterns[0].outputs: a pattern needs at least one output",
        ),
        (("MatMulV2:", "../MatMulV2:"), "kernels.../MatMulV2: kernel type '../MatMulV2' is not a plain name"),
    ],
)
def test_config_errors_name_the_key(tmp_path: Path, replace: tuple[str, str], message: str) -> None:
    path = write_config(tmp_path, MINIMAL.replace("K_EXPR", "k").replace(*replace))
    with pytest.raises(DatabaseError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: {message}")


def test_indexed_slots_fill_undefined_slots(tmp_path: Path) -> None:
    indexed = "input_slots: 5\n        inputs: {0: [m, k], 3: {shape: [n, k], dtype: FLOAT16}, 4: {dtype: INT64}}"
    text = MINIMAL.replace("inputs: [[m, k], [n, K_EXPR]]", indexed)
    pattern = load_config(write_config(tmp_path, text)).kernels["MatMulV2"].patterns[0]
    assert [s.present for s in pattern.inputs] == [True, False, False, True, False]
    assert [s.dtype for s in pattern.inputs] == ["BF16", "", "", "FLOAT16", "INT64"]
