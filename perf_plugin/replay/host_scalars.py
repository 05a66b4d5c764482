"""Which zero-dimensional operand of an elementwise call was a host scalar in the model.

``x + 1`` and ``variance + eps`` pass a Python number, which PyTorch wraps into a 0-d tensor on
the CPU; the profiler records it as a 0-d tensor of the number's dtype, the same as a 0-d tensor
on the device.  The two take different kernels: TensorIterator hands a CPU scalar to the kernel
by value (``CUDAFunctorOnSelf_add``, ``BUnaryFunctor``: one input pointer), while a 0-d device
tensor is broadcast as a third operand (a generic ``elementwise_kernel``).  The kernels the model
ran (the row's ``Profiling Kernels``, from a trace with device activity) tell them apart, so a
replay puts that operand on the host where they show a by-value operand.  Rows without that
evidence keep every operand on the device.

A Python number also stays out of type promotion (``float32_0d / 2.0`` is float32, where a
0-d float64 tensor would make it float64); the host operand is passed as a number where that
is what gives the row's output dtype.  A row without kernels to show it (a CPU trace) says so
only through its output dtype: where the operands as 0-d tensors would promote to another dtype
than the row's and the number would not (``bf16_0d + 0.5``, recorded as a 0-d double), the number
is what the model passed (``number_where_promotion_says``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from perf_plugin.database.schema import PROFILING_KERNELS
from perf_plugin.replay.tensors import KernelRow, TensorSpec

if TYPE_CHECKING:
    import torch

# Functors that take one operand by value: the first (``AUnaryFunctor``) or the second
# (``BUnaryFunctor``, ``...FunctorOnSelf_<op>``, the same op applied with ``self`` as the tensor).
_FIRST_BY_VALUE = re.compile(r"\bAUnaryFunctor<")
_SECOND_BY_VALUE = re.compile(r"\bBUnaryFunctor<|FunctorOnSelf_\w+<")


def host_scalar_slot(row: KernelRow, operands: Sequence[TensorSpec]) -> int | None:
    """The operand to build on the host, or None (no by-value kernel, or no 0-d operand)."""
    kernels = row.attrs.get(PROFILING_KERNELS, "")
    zero_dimensional = [index for index, spec in enumerate(operands) if spec.shape == ()]
    if not kernels or not zero_dimensional or len(operands) < 2:
        return None
    if _SECOND_BY_VALUE.search(kernels):
        return zero_dimensional[-1]
    if _FIRST_BY_VALUE.search(kernels):
        return zero_dimensional[0]
    return None


def placed(
    on_host: bool, device: "torch.device", generator: "torch.Generator"
) -> tuple["torch.device", "torch.Generator"]:
    """Where to draw an operand: the replay's device, or the host with a CPU generator seeded
    from the case's (a device generator cannot draw CPU values)."""
    if not on_host or device.type == "cpu":
        return device, generator
    import torch

    # (no generator at all where the caller draws on ``meta``, whose values are never read)
    host_generator = torch.Generator().manual_seed(generator.initial_seed()) if generator is not None else generator
    return torch.device("cpu"), host_generator


def as_passed(host: "torch.Tensor", other: "torch.Tensor", out_dtype: "torch.dtype") -> Any:
    """The host operand as the model most likely passed it: a Python number where the result
    of ``other`` with a number has the row's output dtype, else the 0-d CPU tensor."""
    import torch

    number = host.item()
    return number if torch.result_type(other, number) == out_dtype else host


def number_where_promotion_says(operands: Sequence[Any], out_dtype: "torch.dtype") -> tuple[Any, ...]:
    """``operands`` with the last 0-d tensor after the first passed as the number it holds, where
    the first operand with that tensor promotes to another dtype than ``out_dtype`` and with the
    number to ``out_dtype``; else unchanged."""
    import torch

    if not operands or not isinstance(operands[0], torch.Tensor):
        return tuple(operands)
    first = operands[0]
    for index in range(len(operands) - 1, 0, -1):
        operand = operands[index]
        if isinstance(operand, torch.Tensor) and operand.dim() == 0 and operand.is_floating_point() \
                and torch.result_type(first, operand) != out_dtype and torch.result_type(first, 1.0) == out_dtype:
            number = 1.0 if operand.is_meta else operand.item()  # (a meta tensor's value is never read)
            return (*operands[:index], number, *operands[index + 1 :])
    return tuple(operands)
