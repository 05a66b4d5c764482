"""Verification of a replay's outputs against its reference.

An output passes when its shape and dtype are the row's, and its relative error
``||out - ref|| / ||ref||`` (computed in float64) is within the replay's tolerance for the
output dtype.  A tolerance of 0 (integer and boolean outputs, data movement) means bit-exact
equality.  A replay whose outputs are random draws (``values_verifiable`` False: ``randn``,
``dropout``) is checked for shapes, dtypes and finite values only.  NaN anywhere makes the error
infinite, so it never passes; an infinity passes only
where the reference has the same infinity (a ``masked_fill`` with ``-inf``, an attention mask),
and the finite elements are compared as usual.

The comparison runs where the reference is: on the CPU for a host reference (the output is
moved there chunk by chunk), on the device for a reference computed there (a GEMM's on CUDA,
``OpReplay.reference_on_device``), so a prefill-sized output is neither copied to the host nor
reduced by the host's cores.  Both go in chunks of ``_CHUNK`` elements, which bounds the float64
temporaries (``compare_bytes``) whatever the output's size.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.base import has_float64_kernels
from perf_plugin.replay.tensors import KernelRow, TensorSpec

if TYPE_CHECKING:
    import torch

    from perf_plugin.replay.base import OpReplay

# Elements per step of the float64 reductions: bounds the temporary memory of a large output.
_CHUNK = 1 << 22


def compare_bytes(numel: int) -> int:
    """The most the comparison of an output of ``numel`` elements holds at once besides the
    output and the reference: one chunk of the output in float64, its difference from the
    reference, the reference's square (float64), and the finiteness masks."""
    return 4 * 8 * min(numel, _CHUNK)


class VerificationError(Exception):
    """A replay's output differs from the row (shape, dtype) or from the reference (value)."""


def _as_tuple(outputs: Any) -> tuple[Any, ...]:
    import torch

    if isinstance(outputs, torch.Tensor):
        return (outputs,)
    return tuple(outputs)


def compare_device(ref: "torch.Tensor") -> "torch.device":
    """Where ``out`` and ``ref`` are compared: the reference's device where float64 kernels exist
    there (a reference computed on CUDA), else the CPU (a host reference; an NPU's own tensors)."""
    import torch

    return ref.device if has_float64_kernels(ref.device.type) else torch.device("cpu")


def _chunks(out: "torch.Tensor", ref: "torch.Tensor") -> Any:
    import torch

    flat_out = out.detach().reshape(-1)
    flat_ref = ref.detach().reshape(-1)
    where = compare_device(ref)
    for start in range(0, flat_out.numel(), _CHUNK):
        a = flat_out[start : start + _CHUNK].to(where)
        b = flat_ref[start : start + _CHUNK].to(where)
        if a.is_complex() or b.is_complex():
            a, b = torch.view_as_real(a.to(torch.complex128)), torch.view_as_real(b.to(torch.complex128))
        yield a.to(torch.float64), b.to(torch.float64)


def relative_error(out: "torch.Tensor", ref: "torch.Tensor") -> float:
    """``||out - ref|| / ||ref||`` in float64 over the finite elements; inf on a NaN, an infinity
    the other side does not have at the same place, or a size mismatch.

    A zero reference gives 0.0 when ``out`` is zero too, else inf.
    """
    import torch

    if out.numel() != ref.numel():
        return math.inf
    diff_sq = 0.0
    ref_sq = 0.0
    for a, b in _chunks(out, ref):
        finite = torch.isfinite(a) & torch.isfinite(b)
        if not bool(finite.all()):
            if bool(torch.isnan(a).any() or torch.isnan(b).any()) or not torch.equal(a[~finite], b[~finite]):
                return math.inf
            a, b = a[finite], b[finite]
        diff_sq += float(a.sub(b).square_().sum())
        ref_sq += float(b.square().sum())
    if not (math.isfinite(diff_sq) and math.isfinite(ref_sq)):
        return math.inf
    if ref_sq == 0.0:
        return 0.0 if diff_sq == 0.0 else math.inf
    return math.sqrt(diff_sq) / math.sqrt(ref_sq)


def mismatch_count(out: "torch.Tensor", ref: "torch.Tensor") -> int:
    """Number of elements that differ (exact comparison, after casting ``ref`` to ``out``'s dtype)."""
    import torch

    flat_out = out.detach().reshape(-1)
    flat_ref = ref.detach().reshape(-1)
    where = compare_device(ref)
    count = 0
    for start in range(0, flat_out.numel(), _CHUNK):
        a = flat_out[start : start + _CHUNK].to(where)
        b = flat_ref[start : start + _CHUNK].to(where).to(a.dtype)
        count += int(torch.ne(a, b).sum())
    return count


def check_output_specs(replay: "OpReplay", row: KernelRow, outputs: Any) -> tuple[TensorSpec, ...]:
    """Compare the outputs' number, shapes and dtypes with the row; returns the expected specs."""
    produced = _as_tuple(outputs)
    expected = tuple(replay.expected_outputs(row))
    if len(produced) != len(expected):
        raise VerificationError(
            f"{row.kernel_type}: the replay produced {len(produced)} output(s), the row has {len(expected)}"
        )
    for slot, (tensor, spec) in enumerate(zip(produced, expected)):
        if tuple(tensor.shape) != spec.shape:
            raise VerificationError(
                f"{row.kernel_type} output {slot} ({spec.dtype}): shape {list(tensor.shape)} differs from "
                f"the row's {list(spec.shape or ())}"
            )
        if tensor.dtype != spec.torch_dtype():
            raise VerificationError(
                f"{row.kernel_type} output {slot}: dtype {tensor.dtype} differs from the row's {spec.dtype}"
            )
    return expected


def verify_outputs(
    replay: "OpReplay", row: KernelRow, outputs: Any, reference_outputs: Any, args: tuple[Any, ...] | None = None
) -> None:
    """Raise VerificationError unless ``outputs`` match the row and the reference.  Given the
    case's ``args``, both are first put in the form the replay compares (``OpReplay.comparable``:
    a top-k's values in order, whatever order its kernel returned them in)."""
    expected = check_output_specs(replay, row, outputs)
    if args is not None:
        outputs, reference_outputs = replay.comparable(args, outputs), replay.comparable(args, reference_outputs)
    produced = _as_tuple(outputs)
    references = _as_tuple(reference_outputs)
    if len(references) != len(produced):
        raise VerificationError(
            f"{row.kernel_type}: the reference produced {len(references)} output(s), "
            f"the replay {len(produced)}"
        )
    values = replay.values_verifiable(row)
    for slot, (out, ref, spec) in enumerate(zip(produced, references, expected)):
        if not values:
            _require_finite(row, slot, spec, out)
            continue
        if tuple(ref.shape) != tuple(out.shape):
            raise VerificationError(
                f"{row.kernel_type} output {slot} ({spec.dtype}): reference shape {list(ref.shape)} differs "
                f"from the output shape {list(out.shape)}"
            )
        threshold = replay.tolerance(spec)
        if threshold <= 0.0 or not (out.is_floating_point() or out.is_complex()):
            wrong = mismatch_count(out, ref)
            if wrong:
                raise VerificationError(
                    f"{row.kernel_type} output {slot} ({spec.dtype}): {wrong} of {out.numel()} elements "
                    "differ from the reference (exact match required)"
                )
            continue
        error = relative_error(out, ref)
        if not error <= threshold:
            raise VerificationError(
                f"{row.kernel_type} output {slot} ({spec.dtype}): relative error {error:.3e} exceeds "
                f"the threshold {threshold:.1e}"
            )


def _require_finite(row: KernelRow, slot: int, spec: TensorSpec, out: "torch.Tensor") -> None:
    """What is left to check of a random output: shape and dtype (checked before) and no NaN or infinity."""
    import torch

    if (out.is_floating_point() or out.is_complex()) and not bool(torch.isfinite(out).all()):
        raise VerificationError(f"{row.kernel_type} output {slot} ({spec.dtype}): not finite everywhere")


__all__ = (
    "VerificationError",
    "compare_bytes",
    "compare_device",
    "check_output_specs",
    "mismatch_count",
    "relative_error",
    "verify_outputs",
)
