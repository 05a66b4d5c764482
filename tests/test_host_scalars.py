"""A 0-d operand the model passed as a Python number is built on the host, where the model's
kernels show it was taken by value (rows and kernel names from the H100 model traces)."""

from __future__ import annotations

import torch

from perf_plugin.replay.host_scalars import host_scalar_slot, placed
from perf_plugin.replay.tensors import TensorSpec
from tests.kernels.support import kernel_row, replay_of, replay_on_cpu

ADD_ON_SELF = (
    "void at::native::vectorized_elementwise_kernel<2, at::native::CUDAFunctorOnSelf_add<long>, "
    "std::array<char*, 2ul> >(int, at::native::CUDAFunctorOnSelf_add<long>, std::array<char*, 2ul>)=1.344"
)
DIV_AS_MUL = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::BUnaryFunctor<float, float, float, "
    "at::native::binary_internal::MulFunctor<float> >, std::array<char*, 2ul> >(int, ...)=1.179"
)
GENERIC = "void at::native::elementwise_kernel<128, 2, ...>(int, ...)=1.4"


def _add_row(kernels: str) -> dict[str, str]:
    return {
        "Input Shapes": '"512;"', "Input Data Types": "INT64;INT64", "Input Formats": "ND;ND",
        "Output Shapes": '"512"', "Output Data Types": "INT64", "Output Formats": "ND",
        "Profiling Kernels": kernels,
    }  # fmt: skip


def test_the_by_value_operand_is_the_one_the_kernel_names() -> None:
    vector, scalar = TensorSpec((512,), "INT64"), TensorSpec((), "INT64")
    row = kernel_row("Add", _add_row(ADD_ON_SELF))
    assert host_scalar_slot(row, (vector, scalar)) == 1
    assert host_scalar_slot(row, (vector, vector)) is None  # no 0-d operand
    assert host_scalar_slot(kernel_row("Add", _add_row(GENERIC)), (vector, scalar)) is None
    assert host_scalar_slot(kernel_row("Add", _add_row("")), (vector, scalar)) is None  # no evidence
    both = kernel_row("Add", {**_add_row(DIV_AS_MUL), "Input Shapes": '";"'})
    assert host_scalar_slot(both, (scalar, scalar)) == 1  # one stays on the device to run the kernel there


def test_an_add_of_a_python_number_gets_a_host_scalar_and_the_device_keeps_the_tensor() -> None:
    replay = replay_of("Add")
    meta = torch.device("meta")  # stands for the accelerator: no values are drawn there
    x, y = replay.make_inputs(kernel_row("Add", _add_row(ADD_ON_SELF)), meta, None)  # type: ignore[arg-type]
    assert x.device.type == "meta" and isinstance(y, int)  # passed as the model passed it: a number
    x, y = replay.make_inputs(kernel_row("Add", _add_row(GENERIC)), meta, None)  # type: ignore[arg-type]
    assert (x.device.type, y.device.type) == ("meta", "meta")


def test_a_host_operand_is_drawn_from_the_case_seed() -> None:
    generator = torch.Generator().manual_seed(7)
    device, drawn = placed(True, torch.device("meta"), generator)
    assert device.type == "cpu" and drawn is not generator and drawn.initial_seed() == 7
    assert placed(False, torch.device("meta"), generator) == (torch.device("meta"), generator)
    assert placed(True, torch.device("cpu"), generator) == (torch.device("cpu"), generator)


def test_an_aten_row_places_its_host_scalar_the_same_way() -> None:
    """``floor_divide(x, 2)`` from the MoE model's routing: ``BUnaryFunctor`` took the 2 by value."""
    cells = {
        "Input Shapes": '"4096;"', "Input Data Types": "INT64;INT64", "Input Formats": "ND;ND",
        "Output Shapes": '"4096"', "Output Data Types": "INT64", "Output Formats": "ND",
        "Op Arguments": '{"overload":"default","args":[{"tensor":0},{"tensor":1}]}',
        "Profiling Kernels": "void at::native::vectorized_elementwise_kernel<2, at::native::BUnaryFunctor<long, long, "
        "long, at::native::binary_internal::div_floor_kernel_cuda(...)>, std::array<char*, 2ul> >(int, ...)=1.5",
    }  # fmt: skip
    replay = replay_of("aten.floor_divide")
    _, _, _, tensors, _ = replay.make_inputs(kernel_row("aten.floor_divide", cells), torch.device("meta"), None)  # type: ignore[arg-type]
    assert tensors[0].device.type == "meta" and isinstance(tensors[1], int)
    outputs, _ = replay_on_cpu("aten.floor_divide", cells)
    assert tuple(outputs.shape) == (4096,)


def test_a_number_where_a_0d_tensor_would_change_the_result_dtype() -> None:
    """The FP8 model's ``scale / 448.0``: two 0-d operands, the divisor a Python float.  As a
    0-d float64 tensor it would make the result float64 (another kernel); as a number the result
    is the row's float32.  Where only a tensor gives the row's dtype, the tensor stays."""
    cells = {
        "Input Shapes": '";"', "Input Data Types": "FLOAT;DOUBLE", "Input Formats": "ND;ND",
        "Output Shapes": "", "Output Data Types": "FLOAT", "Output Formats": "ND",
        "Op Arguments": '{"overload":"Tensor","args":[{"tensor":0},{"tensor":1}]}',
        "Profiling Kernels": DIV_AS_MUL,
    }  # fmt: skip
    replay = replay_of("aten.div")
    _, _, _, tensors, _ = replay.make_inputs(kernel_row("aten.div", cells), torch.device("meta"), None)  # type: ignore[arg-type]
    assert tensors[0].device.type == "meta" and isinstance(tensors[1], float)
    outputs, _ = replay_on_cpu("aten.div", cells)
    assert outputs.dtype == torch.float32
    wider = {**cells, "Output Data Types": "DOUBLE"}
    _, _, _, tensors, _ = replay.make_inputs(kernel_row("aten.div", wider), torch.device("meta"), None)  # type: ignore[arg-type]
    assert tensors[1].device.type == "cpu" and tensors[1].dtype == torch.float64


def test_ingest_resolves_a_wrapped_number_as_the_number_it_was() -> None:
    """A real CPU trace of ``scale / 448.0`` (0-d float32 over a Python float, which the profiler
    records as a 0-d float64 tensor): the row's output is the float32 the model computed, and
    ``x * 0.5`` keeps its bfloat16."""
    from pathlib import Path

    from perf_plugin.ingest.pipeline import ingest_path

    rows = ingest_path(Path(__file__).parent / "fixtures" / "cpu" / "scalar_operand_trace.json", None).rows
    division = next(r for r in rows if r.kernel_type == "aten.div")
    assert (division.cells["Input Data Types"], division.cells["Output Data Types"]) == ("FLOAT;DOUBLE", "FLOAT")
    scaled = next(r for r in rows if r.kernel_type == "Muls")
    assert scaled.cells["Output Data Types"] == "DT_BF16"


def test_a_cpu_traces_wrapped_number_replays_as_a_number() -> None:
    """The same real CPU trace: with no kernels to show a by-value operand, the output dtype does.
    ``scale / 448.0`` recorded as float32 over a 0-d float64 replays to the row's float32, where a
    0-d float64 tensor would have given float64 and failed verification (DiffLlama's
    ``lambda_1 - lambda_2 + lambda_init``, a bfloat16 0-d tensor and a Python float, likewise)."""
    from pathlib import Path

    from perf_plugin.ingest.pipeline import ingest_path

    rows = ingest_path(Path(__file__).parent / "fixtures" / "cpu" / "scalar_operand_trace.json", None).rows
    division = next(r for r in rows if r.kernel_type == "aten.div")
    assert not division.cells.get("Profiling Kernels")  # no device activity: no kernel evidence
    outputs, _ = replay_on_cpu("aten.div", division.cells)
    assert outputs.dtype == torch.float32


def test_a_0d_tensor_that_gives_the_rows_dtype_stays_a_tensor() -> None:
    from perf_plugin.replay.host_scalars import number_where_promotion_says

    bf16, double = torch.tensor(1.5, dtype=torch.bfloat16), torch.tensor(0.5, dtype=torch.float64)
    assert number_where_promotion_says((bf16, double), torch.bfloat16) == (bf16, 0.5)
    kept = number_where_promotion_says((bf16, double), torch.float64)  # the model's own 0-d double
    assert kept[1] is double
    vector = torch.ones(4, dtype=torch.float32)
    assert number_where_promotion_says((vector, double), torch.float32)[1] is double  # promotes alike either way
    index = torch.tensor(3)
    assert number_where_promotion_says((bf16, index), torch.bfloat16)[1] is index  # not a floating number
    meta = (torch.empty((), dtype=torch.bfloat16, device="meta"), torch.empty((), dtype=torch.float64, device="meta"))
    assert number_where_promotion_says(meta, torch.bfloat16)[1] == 1.0  # a value meta never reads
