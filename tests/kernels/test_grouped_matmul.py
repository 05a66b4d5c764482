"""GroupedMatmul and GroupedMatmulSwigluQuant: NPU calls, portable runs, rejected rows, semantics.

No public row of either kernel type exists (neither the Level2 profile nor any public repository
holds one).  The rows below are written in exactly the layout Ascend's replay scripts for the same
database parse: msmodeling ``tools/perf_data_collection/op_replay/GroupedMatmul_run.py`` reads
``x(0), weight(1), (2 empty), scale(3), (4-6 empty), group_list(7), per_token_scale(8)`` and
``GroupedMatmulSwigluQuant_run.py`` reads ``x, weight, weight_scale, x_scale, group_list`` (5-D
FRACTAL_NZ weight storage shapes, ``DT_BF16``-style dtypes, shape cells with embedded quotes).
The sizes of ``DSV3_DOWN`` / ``DSV3_GATE_UP`` are DeepSeek-V3's (hidden 7168, expert width 2048,
16 local experts): too large for a float64 reference on 2 cores, they are checked on the meta
device and their numerics on reduced rows of the same layout.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from perf_plugin.ingest.pipeline import ingest_path
from perf_plugin.replay.api_call import NpuFormat
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels._grouped_gemm import draw_group_sizes, group_ends, group_list_tensor, swiglu_requant
from perf_plugin.replay.kernels.grouped_matmul import GroupedMatmulReplay, GroupedMatmulSwigluQuantReplay
from perf_plugin.replay.verify import VerificationError, verify_outputs
from tests.kernels.support import kernel_row, meta_outputs, npu_call_of, op_mapping_api, replay_on_cpu, replay_of, shapes

GMM = "GroupedMatmul"
GMM_SWIGLU = "GroupedMatmulSwigluQuant"


def gmm_row(shapes_: str, dtypes: str, formats: str, out: str, out_dtype: str) -> dict[str, str]:
    return {
        "OP State": "dynamic", "Accelerator Core": "MIX_AIC",
        "Input Shapes": f'"{shapes_}"', "Input Data Types": dtypes, "Input Formats": formats,
        "Output Shapes": f'"{out}"', "Output Data Types": out_dtype, "Output Formats": ";".join("ND" for _ in out.split(";")),
    }  # fmt: skip


BF16_GMM = gmm_row("96,256;8,256,512;;;;;;8", "DT_BF16;DT_BF16;DT_UNDEFINED;DT_UNDEFINED;DT_UNDEFINED;DT_UNDEFINED;DT_UNDEFINED;INT64",
                   "ND;ND;NULL;NULL;NULL;NULL;NULL;ND", "96,512", "DT_BF16")
FP16_GMM_TRANSPOSED = gmm_row("40,64;3,32,64;;;;;;3", "FLOAT16;FLOAT16;;;;;;INT64", "ND;ND;;;;;;ND", "40,32", "FLOAT16")
W8A8_GMM = gmm_row("64,256;4,8,16,16,32;;4,256;;;;4;64", "INT8;INT8;DT_UNDEFINED;DT_BF16;DT_UNDEFINED;DT_UNDEFINED;DT_UNDEFINED;INT64;FLOAT",
                   "ND;FRACTAL_NZ;NULL;ND;NULL;NULL;NULL;ND;ND", "64,256", "DT_BF16")
DSV3_DOWN = gmm_row("4096,2048;16,224,128,16,32;;16,7168;;;;16;4096", "INT8;INT8;;DT_BF16;;;;INT64;FLOAT",
                    "ND;FRACTAL_NZ;;ND;;;;ND;ND", "4096,7168", "DT_BF16")
SWIGLU = gmm_row("64,256;4,16,16,16,32;4,512;64;4", "INT8;INT8;FLOAT;FLOAT;INT64", "ND;FRACTAL_NZ;ND;ND;ND",
                 "64,256;64", "INT8;FLOAT")
SWIGLU_6_SLOTS = gmm_row("33,128;5,128,256;5,256;33;;5", "INT8;INT8;DT_BF16;FLOAT;DT_UNDEFINED;INT64", "ND;ND;ND;ND;NULL;ND",
                         "33,128;33", "INT8;FLOAT")
DSV3_GATE_UP = gmm_row("4096,7168;16,128,448,16,32;16,4096;4096;16", "INT8;INT8;FLOAT;FLOAT;INT64", "ND;FRACTAL_NZ;ND;ND;ND",
                       "4096,2048;4096", "INT8;FLOAT")


# ----------------------------------------------------------------------------- NPU calls
def test_grouped_matmul_calls_the_op_mapping_api_with_single_tensor_lists() -> None:
    call = npu_call_of(GMM, BF16_GMM)
    assert call.api == op_mapping_api(GMM) == "torch_npu.npu_grouped_matmul"
    assert shapes(call.args) == ([(96, 256)], [(8, 256, 512)])
    assert {k: v for k, v in call.kwargs.items() if k != "group_list"} == {"split_item": 2, "group_type": 0, "group_list_type": 0}
    group_list = call.kwargs["group_list"]
    assert group_list.dtype == torch.int64 and group_list.shape == (8,)
    assert int(group_list[-1]) == 96 and bool((group_list.diff() >= 0).all())  # cumulative ends, summing to M
    assert call.outputs == (0,)


def test_w8a8_grouped_matmul_passes_scales_and_output_dtype_and_nz_weight() -> None:
    call = npu_call_of(GMM, W8A8_GMM)
    (x,), (w,) = call.args
    assert isinstance(w, NpuFormat) and w.format == "FRACTAL_NZ" and tuple(w.tensor.shape) == (4, 256, 256)
    assert x.dtype == w.tensor.dtype == torch.int8
    assert shapes(call.kwargs["scale"]) == [(4, 256)] and shapes(call.kwargs["per_token_scale"]) == [(64,)]
    assert call.kwargs["output_dtype"] == torch.bfloat16


def test_grouped_matmul_swiglu_quant_calls_its_fused_api() -> None:
    call = npu_call_of(GMM_SWIGLU, SWIGLU)
    assert op_mapping_api(GMM_SWIGLU) is None  # the files name it for DequantSwigluQuant only
    assert op_mapping_api("DequantSwigluQuant") == call.api == "torch_npu.npu_grouped_matmul_swiglu_quant"
    x, w, group_list, ws, xs = call.args
    assert isinstance(w, NpuFormat) and w.format == "FRACTAL_NZ" and tuple(w.tensor.shape) == (4, 256, 512)
    assert shapes((x, group_list, ws, xs)) == ((64, 256), (4,), (4, 512), (64,))
    assert int(group_list[-1]) == 64 and call.kwargs == {} and call.outputs == (0, 1)


# ----------------------------------------------------------------------------- portable runs
@pytest.mark.parametrize("cells", [BF16_GMM, FP16_GMM_TRANSPOSED, W8A8_GMM], ids=["bf16", "fp16-transposed", "w8a8-nz"])
def test_grouped_matmul_runs_on_the_cpu(cells: dict[str, str]) -> None:
    outputs, _ = replay_on_cpu(GMM, cells)
    assert tuple(outputs.shape) == tuple(int(d) for d in cells["Output Shapes"].strip('"').split(","))


def test_transposed_weight_is_built_in_its_recorded_layout() -> None:
    replay = replay_of(GMM)
    args = replay.make_inputs(kernel_row(GMM, FP16_GMM_TRANSPOSED), torch.device("cpu"), torch.Generator().manual_seed(0))
    w = args[1]
    assert tuple(w.shape) == (3, 64, 32) and w.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("cells", [SWIGLU, SWIGLU_6_SLOTS], ids=["msmodeling-5-slots", "op-def-6-slots"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grouped_matmul_swiglu_quant_matches_its_exact_reference(cells: dict[str, str], seed: int) -> None:
    (y, y_scale), _ = replay_on_cpu(GMM_SWIGLU, cells, seed=seed)
    assert y.dtype == torch.int8 and int(y.abs().max()) == 127  # every row's largest |S| maps to 127


def test_deepseek_sized_rows_build_on_the_meta_device() -> None:
    assert shapes(meta_outputs(GMM, DSV3_DOWN)) == (4096, 7168)
    assert shapes(meta_outputs(GMM_SWIGLU, DSV3_GATE_UP)) == ((4096, 2048), (4096,))
    reduced_down = gmm_row("256,256;16,8,16,16,32;;16,256;;;;16;256", "INT8;INT8;;DT_BF16;;;;INT64;FLOAT",
                           "ND;FRACTAL_NZ;;ND;;;;ND;ND", "256,256", "DT_BF16")
    reduced_gate_up = gmm_row("256,512;16,8,32,16,32;16,256;256;16", "INT8;INT8;FLOAT;FLOAT;INT64",
                              "ND;FRACTAL_NZ;ND;ND;ND", "256,128;256", "INT8;FLOAT")
    replay_on_cpu(GMM, reduced_down)
    replay_on_cpu(GMM_SWIGLU, reduced_gate_up)


# ----------------------------------------------------------------------------- rejected rows
@pytest.mark.parametrize(
    ("kernel_type", "cells", "message"),
    [
        (GMM, gmm_row("8,16;2,16,32;2,32;;;;;2", "DT_BF16;DT_BF16;FLOAT;;;;;INT64", "ND;ND;ND;;;;;ND", "8,32", "DT_BF16"), "slot 2 (bias)"),
        (GMM, gmm_row("8,16;2,16,32;;;;2,32;2,32;2", "DT_BF16;INT8;;;;DT_BF16;DT_BF16;INT64", "ND;ND;;;;ND;ND;ND", "8,32", "DT_BF16"), "antiquant_scale"),
        (GMM, gmm_row("8,16;2,16,32;;2,32;;;;2", "INT8;INT8;;INT64;;;;INT64", "ND;ND;;ND;;;;ND", "8,32", "INT8"), "only float GEMMs"),
        (GMM, gmm_row("8,16;2,16,32;;2,32;;;;2", "INT8;INT8;;INT64;;;;INT64", "ND;ND;;ND;;;;ND", "8,32", "DT_BF16"), "INT64 scales"),
        (GMM, gmm_row("8,16;2,16,32;;;;;;3", "DT_BF16;DT_BF16;;;;;;INT64", "ND;ND;;;;;;ND", "8,32", "DT_BF16"), "expected [2] INT64"),
        (GMM, gmm_row("8,16;2,20,32;;;;;;2", "DT_BF16;DT_BF16;;;;;;INT64", "ND;ND;;;;;;ND", "8,32", "DT_BF16"), "neither [E,K,N] nor [E,N,K]"),
        (GMM_SWIGLU, gmm_row("8,16;2,16,32;2,32;8;2,32;2", "INT8;INT8;FLOAT;FLOAT;FLOAT;INT64", "ND;ND;ND;ND;ND;ND", "8,16;8", "INT8;FLOAT"), "weight_assistance_matrix"),
        (GMM_SWIGLU, gmm_row("8,16;2,16,32;2,32;8;2", "INT8;INT8;FLOAT;FLOAT;INT64", "ND;ND;ND;ND;ND", "8,32;8", "INT8;FLOAT"), "y [8,16] INT8"),
        (GMM_SWIGLU, gmm_row("8,16;2,16,32;2,32;8;2", "DT_BF16;DT_BF16;FLOAT;FLOAT;INT64", "ND;ND;ND;ND;ND", "8,16;8", "INT8;FLOAT"), "A8W8"),
    ],
    ids=["bias", "antiquant", "int8-output", "int64-scale", "group-count", "weight-shape", "a8w4", "outputs", "bf16"],
)  # fmt: skip
def test_rows_it_cannot_reproduce_are_rejected_with_the_reason(kernel_type: str, cells: dict[str, str], message: str) -> None:
    with pytest.raises(CaseBuildError, match=re.escape(message)):
        replay_of(kernel_type).check(kernel_row(kernel_type, cells))


# ----------------------------------------------------------------------------- the verification bites
class FirstExpertOnly(GroupedMatmulReplay):
    """Multiplies every row by expert 0's weight: the group list ignored."""

    def run(self, x, w, scale, pts, group_list, list_type, offsets, groups, rows, y):  # type: ignore[no-untyped-def]
        return x @ w[0]


class FloorQuant(GroupedMatmulSwigluQuantReplay):
    """Truncates instead of rounding half to even."""

    def run(self, *args):  # type: ignore[no-untyped-def]
        y, y_scale = super().run(*args)
        return torch.where(y > 0, y - 1, y).to(torch.int8), y_scale


@pytest.mark.parametrize(("replay", "kernel_type", "cells"), [(FirstExpertOnly(), GMM, BF16_GMM), (FloorQuant(), GMM_SWIGLU, SWIGLU)])
def test_a_wrong_run_fails_verification(replay: object, kernel_type: str, cells: dict[str, str]) -> None:
    row = kernel_row(kernel_type, cells)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))  # type: ignore[attr-defined]
    with pytest.raises(VerificationError):
        verify_outputs(replay, row, replay.run(*args), replay.reference(*args))  # type: ignore[attr-defined, arg-type]


# ----------------------------------------------------------------------------- semantics
def test_group_sizes_are_valid_and_the_list_reads_as_the_api_reads_it() -> None:
    generator = torch.Generator().manual_seed(3)
    for tokens, experts in [(1, 16), (7, 3), (100, 8), (5, 1)]:
        sizes = draw_group_sizes(tokens, experts, generator)
        assert len(sizes) == experts and sum(sizes) == tokens and min(sizes) >= 0
        cumulative, counts = group_list_tensor(sizes, 0, torch.device("cpu")), group_list_tensor(sizes, 1, torch.device("cpu"))
        assert group_ends(cumulative, 0) == group_ends(counts, 1) == [sum(sizes[: g + 1]) for g in range(experts)]


def test_a_counts_group_list_gives_the_same_product_as_the_cumulative_one() -> None:
    replay = replay_of(GMM)
    args = list(replay.make_inputs(kernel_row(GMM, BF16_GMM), torch.device("cpu"), torch.Generator().manual_seed(1)))
    cumulative = replay.reference(*args)
    args[4], args[5] = args[4].diff(prepend=torch.zeros(1, dtype=torch.int64)), 1  # group_list_type=1: counts
    assert torch.equal(replay.reference(*args), cumulative)
    assert replay.npu_call(kernel_row(GMM, BF16_GMM), tuple(args)).kwargs["group_list_type"] == 1


def test_the_mm_loop_and_grouped_mm_agree() -> None:
    replay = replay_of(GMM)
    args = list(replay.make_inputs(kernel_row(GMM, BF16_GMM), torch.device("cpu"), torch.Generator().manual_seed(2)))
    assert args[7].fused  # bf16, 16-byte aligned rows: one torch._grouped_mm
    fused = replay.run(*args).float()
    args[7] = type(args[7])(args[7].sizes, False)
    assert torch.allclose(replay.run(*args).float(), fused, rtol=1e-2, atol=1e-2)


def test_swiglu_requant_follows_the_documented_formula() -> None:
    """op-plugin's reference: S = silu(C1) * C2, scale = max|S| / 127, y = round(S * 127 / max|S|)."""
    c = torch.tensor([[1.0, -2.0, 0.5, 3.0], [0.25, 4.0, -1.0, 0.5]], dtype=torch.float64)
    y, scale = swiglu_requant(c)
    s = torch.nn.functional.silu(c[:, :2]) * c[:, 2:]
    assert torch.allclose(scale, s.abs().amax(1) / 127)
    assert torch.equal(y, torch.round(s * (127 / s.abs().amax(1, keepdim=True))))
    assert y.abs().amax(1).tolist() == [127.0, 127.0]


# ----------------------------------------------------------------------------- trace ingest
def test_a_cpu_trace_of_grouped_mm_becomes_a_grouped_matmul_row(tmp_path: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    x, w = torch.randn(40, 64, dtype=torch.bfloat16), torch.randn(4, 64, 32, dtype=torch.bfloat16)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        torch._grouped_mm(x, w, offs=torch.tensor([10, 10, 30, 40], dtype=torch.int32))
    trace = tmp_path / "moe.pt.trace.json"
    prof.export_chrome_trace(str(trace))
    (row,) = [r for r in ingest_path(trace, tmp_path / "db").rows if r.kernel_type == GMM]
    assert [row.cells[c] for c in ("Input Shapes", "Input Data Types", "Output Shapes", "Output Data Types")] == [
        '"40,64;4,64,32;;;;;;4"', "DT_BF16;DT_BF16;;;;;;INT64", '"40,32"', "DT_BF16",
    ]  # fmt: skip
    replay_on_cpu(GMM, dict(row.cells))
    assert (tmp_path / "db" / "GroupedMatmul.csv").exists()


@pytest.mark.parametrize(("cells", "shapes"), [(BF16_GMM, [(8, 256, 512)]), (W8A8_GMM, [(4, 256, 256), (4, 256)])], ids=["bf16", "w8a8"])
def test_the_experts_weights_and_scales_are_the_rows_parameters(cells: dict[str, str], shapes: list[tuple[int, ...]]) -> None:
    """What the ``produced`` cache mode leaves cold: a model reads its experts' weights from memory."""
    replay = replay_of(GMM)
    row = kernel_row(GMM, cells)
    args = replay.make_inputs(row, torch.device("cpu"), torch.Generator().manual_seed(0))
    assert [tuple(t.shape) for t in replay.parameters(row, args)] == shapes
