"""torch_npu's MoE operators on the CPU: their real schemas in the ``npu`` namespace, CPU kernels.

torch_npu registers ``npu_grouped_matmul`` (and its ``.List`` overload) and
``npu_grouped_matmul_swiglu_quant`` as ``torch.ops.npu.*`` with the schemas of
``tests/fixtures/torch_npu/schemas.txt`` (the torch_npu 2.14.0 wheel's), and binds each operator
into its own namespace (``torch_npu.npu_grouped_matmul is torch.ops.npu.npu_grouped_matmul``,
torch_npu's ``__init__``).  Without an NPU, ``standin()`` defines the same schemas, taken from the
fixture, with ``torch.library`` in a library named like torch_npu's, CPU kernels that compute
what the operators' documentation says, and a module ``TORCH_NPU`` that binds them as torch_npu
does.  torch refuses a second definition of an operator, so this is done once per process (and
not at all where a real torch_npu already defined them: the tests that need it skip).
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch

from perf_plugin.replay.kernels._grouped_gemm import group_ends, grouped_reference, swiglu_requant
from tests.npu_schemas import SCHEMAS

OPERATORS = ("npu_grouped_matmul", "npu_grouped_matmul.List", "npu_grouped_matmul_swiglu_quant")
TORCH_NPU = types.ModuleType("torch_npu_standin")  # what ``import torch_npu`` gives, for these operators


def schema_text(operator: str) -> str:
    """The fixture's schema line of ``operator`` (``name[.overload]``)."""
    for line in SCHEMAS.read_text().splitlines():
        if line.startswith(operator + "("):
            return line
    raise LookupError(f"{operator} is not in {SCHEMAS}")


def _ends(group_list: Any, group_list_type: int | None) -> list[int]:
    values = group_list if isinstance(group_list, torch.Tensor) else torch.tensor(group_list)
    return group_ends(values, group_list_type or 0)


def _grouped_matmul(x: list[torch.Tensor], weight: list[torch.Tensor], **options: Any) -> list[torch.Tensor]:
    """Single x [M,K], single weight [E,K,N], groups along M (split_item 2/3): y [M,N]; rows past
    the last group are left zero, as the documentation says the kernel leaves them unwritten.
    Without a group list, one 2-D weight: ``x @ weight``; a layout other than 0 or 1 (which this
    stand-in does not compute) gives zeros."""
    if options.get("group_list") is None:
        return [x[0] @ weight[0]]
    if options.get("group_list_type") not in (None, 0, 1):
        return [torch.zeros(x[0].shape[0], weight[0].shape[2], dtype=x[0].dtype)]
    ends = _ends(options["group_list"], options.get("group_list_type"))
    y = torch.zeros(x[0].shape[0], weight[0].shape[2], dtype=x[0].dtype)
    y[: ends[-1]] = grouped_reference(x[0][: ends[-1]], weight[0], ends).to(x[0].dtype)
    return [y]


def _swiglu_quant(x: torch.Tensor, weight: torch.Tensor, group_list: torch.Tensor, weight_scale: torch.Tensor,
                  x_scale: torch.Tensor, **_: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The documented formula on a cumulative group list: dequantised GEMM, SwiGLU, per-row int8."""
    ends = group_ends(group_list, 0)
    c = grouped_reference(x, weight, ends, weight_scale) * x_scale.double().unsqueeze(1)
    y, y_scale = swiglu_requant(c)
    return y.to(torch.int8), y_scale.float(), torch.zeros_like(y_scale, dtype=torch.float32)


@functools.cache
def standin() -> torch.library.Library | None:
    """The library holding the operators (None: a real torch_npu defined them already)."""
    if hasattr(torch.ops.npu, "npu_grouped_matmul"):
        return None
    # kept for the process: torch allows one definition of an operator (torch.library is untyped)
    library = torch.library.Library("npu", "DEF")  # type: ignore[no-untyped-call]
    for operator in OPERATORS:
        library.define(schema_text(operator))  # type: ignore[no-untyped-call]
    for operator, kernel in zip(OPERATORS, (_grouped_matmul, _grouped_matmul, _swiglu_quant)):
        library.impl(operator, kernel, "CPU")  # type: ignore[no-untyped-call]
    for name in ("npu_grouped_matmul", "npu_grouped_matmul_swiglu_quant"):
        setattr(TORCH_NPU, name, getattr(torch.ops.npu, name))  # as torch_npu's __init__ binds them
    return library
