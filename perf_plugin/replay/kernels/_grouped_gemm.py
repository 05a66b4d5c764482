"""What the grouped-GEMM kernels share (GroupedMatmul, GroupedMatmulSwigluQuant, DispatchFFNCombine): FRACTAL_NZ weight shapes, group sizes and group lists, the grouped GEMM itself and its float64 reference, and the SwiGLU requantisation epilogue.

The row layouts are described in ``perf_plugin.replay.kernels.grouped_matmul``.
"""


from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from perf_plugin.database.schema import INPUT_VALUES
from perf_plugin.replay.api_call import NpuFormat
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.value_draws import recorded_values
from perf_plugin.replay.tensors import KernelRow, TensorSpec, shape_text

if TYPE_CHECKING:
    import torch

Shape = tuple[int, ...]
FLOAT_GEMM = frozenset({"BF16", "FLOAT16", "FLOAT"})
QUANT_SCALE = frozenset({"BF16", "FLOAT"})
QUANT_OUT = frozenset({"BF16", "FLOAT16"})
SWIGLU_SCALE = frozenset({"FLOAT", "BF16", "FLOAT16"})
# Int8 magnitude bound of the SwigluQuant draws: |partial sums| <= 64*K < 2**24 keeps float32 exact.
EXACT_INT8_BOUND = 8


def _ends(sizes: Any) -> list[int]:
    return list(accumulate(sizes))


# ----------------------------------------------------------------------------- shared helpers

def nz_logical_shape(shape: Shape) -> Shape:
    """``[..., n1, k1, k0, n0]`` FRACTAL_NZ storage -> the logical ``[..., k1*k0, n1*n0]``."""
    *batch, n1, k1, k0, n0 = shape
    return (*batch, k1 * k0, n1 * n0)


def weight_shape(spec: TensorSpec) -> Shape:
    """The logical ``[E, ., .]`` shape of a grouped weight slot (NZ storage shapes unpacked)."""
    assert spec.shape is not None
    if spec.format == "FRACTAL_NZ" and len(spec.shape) == 5:
        return nz_logical_shape(spec.shape)
    return spec.shape


def maybe_nz(spec: TensorSpec, tensor: Any) -> Any:
    """The weight as the API takes it: cast to FRACTAL_NZ where the row recorded that format."""
    return NpuFormat(tensor, "FRACTAL_NZ") if spec.format == "FRACTAL_NZ" else tensor


@dataclass(frozen=True)
class Groups:
    """Host-side group sizes (summing to the token count) and how ``run`` multiplies them."""

    sizes: tuple[int, ...]
    fused: bool  # torch._grouped_mm, else a loop of mm

    def bounds(self) -> list[tuple[int, int, int]]:
        """(group, first row, end row) of every non-empty group."""
        ends = _ends(self.sizes)
        return [(g, end - size, end) for g, (size, end) in enumerate(zip(self.sizes, ends)) if size]


def draw_group_sizes(total: int, groups: int, generator: "torch.Generator | None") -> tuple[int, ...]:
    """Sizes summing to ``total``, as even as they can be: the row records no routing, and a
    balanced one is what MoE load balancing aims for and what a model routes with random weights.
    (Uniform random cut points, skewed, made the prefill grouped GEMMs of a Qwen3-MoE model
    1.5-1.6x slower on an H100 than the same GEMMs in the model.)  Which groups get the remainder
    is drawn from ``generator``.
    """
    import torch

    if groups == 1:
        return (total,)
    base, extra = divmod(total, groups)
    if generator is None or extra == 0:  # meta device, or nothing left to place
        return tuple(base + (1 if g < extra else 0) for g in range(groups))
    chosen = set(torch.randperm(groups, generator=generator, device=generator.device)[:extra].tolist())
    return tuple(base + (1 if g in chosen else 0) for g in range(groups))


def group_list_tensor(sizes: tuple[int, ...], group_list_type: int, device: "torch.device") -> "torch.Tensor":
    """The API's INT64 ``group_list``: cumulative ends (type 0) or per-group counts (type 1)."""
    import torch

    values = list(sizes) if group_list_type == 1 else _ends(sizes)
    return torch.tensor(values, dtype=torch.int64, device=device)


def group_ends(group_list: "torch.Tensor", group_list_type: int) -> list[int]:
    """The end row of every group, reading ``group_list`` the way the API does."""
    values = [int(v) for v in group_list.tolist()]
    if group_list_type == 0:
        return values
    if group_list_type == 1:
        return _ends(values)
    raise ValueError(f"group_list_type {group_list_type} is not replayed (0: cumulative, 1: counts)")


def can_fuse(dtype: str, k: int, n: int, device: "torch.device") -> bool:
    """Whether ``torch._grouped_mm`` takes these operands here (else ``mm`` per group)."""
    import torch

    if not hasattr(torch, "_grouped_mm") or dtype not in FLOAT_GEMM:
        return False
    size = 4 if dtype == "FLOAT" else 2
    if (k * size) % 16 or (n * size) % 16:  # its operands' row strides must be 16-byte multiples
        return False
    if device.type in ("meta", "cuda"):  # its meta kernel, and CUDA's on sm90+, take BF16 only
        return dtype == "BF16" and (device.type == "meta" or torch.cuda.get_device_capability(device) >= (9, 0))
    return device.type == "cpu"


def grouped_mm(x: "torch.Tensor", w: "torch.Tensor", offsets: "torch.Tensor", groups: Groups) -> "torch.Tensor":
    """``out[rows of g] = x[rows of g] @ w[g]`` for contiguous row groups."""
    import torch

    if groups.fused:
        return torch._grouped_mm(x, w, offs=offsets)
    out = x.new_empty((x.shape[0], w.shape[2]))
    for g, start, end in groups.bounds():
        torch.mm(x[start:end], w[g], out=out[start:end])
    return out


def grouped_reference(x: "torch.Tensor", w: "torch.Tensor", ends: list[int], scale: "torch.Tensor | None" = None,
                      where: "torch.device | str" = "cpu") -> "torch.Tensor":
    """``x[rows of g] @ w[g]`` (times ``scale[g]``) in float64 on ``where`` (the CPU unless the
    replay's reference runs on the device), group by group from the group ends the API's list gives."""
    import torch

    x64 = x.detach().to(where, torch.float64)
    out = torch.empty((x.shape[0], w.shape[2]), dtype=torch.float64, device=x64.device)
    for g, (start, end) in enumerate(zip([0, *ends], ends)):
        out[start:end] = x64[start:end] @ w[g].detach().to(where, torch.float64)
        if scale is not None:
            out[start:end] *= scale[g].detach().to(where, torch.float64)
    return out


# What a grouped GEMM row without recorded groups replays (``Input Values Source``).
EVEN_GROUPS = "even groups"


def recorded_group_sizes(row: KernelRow, index: int, experts: int, rows: int) -> tuple[int, ...] | None:
    """The rows per group the model routed, from the row's ``Input Values`` cell at the group
    list's slot (cumulative ends, as ``torch._grouped_mm``'s ``offs`` and the API's
    ``group_list_type=0``); None when the row records none."""
    ends = recorded_values(row, index)
    if ends is None:
        return None
    sizes = tuple(end - start for start, end in zip((0, *ends), ends))
    if len(ends) != experts or min(sizes) < 0 or ends[-1] != rows:
        raise CaseBuildError(f"'{INPUT_VALUES}' slot {index} ({len(ends)} values ending at {ends[-1] if ends else '-'}) "
                             f"is not the cumulative end row of each of {experts} groups, non-decreasing, ending at "
                             f"the {rows} rows of x")
    return sizes


def draw_groups(
    rows: int, experts: int, gemm: tuple[str, int, int], device: "torch.device", generator: "torch.Generator | None",
    recorded: tuple[int, ...] | None = None,
) -> tuple["torch.Tensor", "torch.Tensor", Groups, "torch.Tensor"]:
    """A case's groups: the API's cumulative INT64 ``group_list``, the int32 offsets
    ``torch._grouped_mm`` takes, the host sizes, and the group of every row (the gather index of
    per-group scales, built here so ``run`` neither copies from the host nor synchronises).
    The sizes are the ``recorded`` ones where the row has them, else drawn as even as they can be."""
    import torch

    sizes = recorded if recorded is not None else draw_group_sizes(rows, experts, generator)
    offsets = torch.tensor(_ends(sizes), dtype=torch.int32, device=device)
    row_group = torch.repeat_interleave(torch.arange(experts), torch.tensor(sizes, dtype=torch.int64)).to(device)
    return group_list_tensor(sizes, 0, device), offsets, Groups(sizes, can_fuse(*gemm, device)), row_group


def swiglu_requant(c: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
    """``S = silu(C[:, :N/2]) * C[:, N/2:]`` quantised per row: ``(round_half_even(S / s), s)``
    with ``s = max|S| / 127``; the int8 values stay in ``c``'s floating dtype."""
    import torch

    act, gate = c.chunk(2, dim=1)
    swiglu = act / (1 + torch.exp(-act)) * gate
    scale = swiglu.abs().amax(dim=1) / 127
    return torch.round(swiglu / scale.unsqueeze(1)), scale


def require_empty(row: KernelRow, slots: dict[int, str]) -> None:
    for index, name in slots.items():
        if index < len(row.inputs) and row.inputs[index].present:
            raise CaseBuildError(f"{row.kernel_type} input slot {index} ({name}) is "
                                 f"{shape_text(row.inputs[index])}; rows with a {name} are not replayed")


def required_slot(row: KernelRow, index: int, name: str) -> TensorSpec:
    if index >= len(row.inputs) or not row.inputs[index].present:
        raise CaseBuildError(f"{row.kernel_type} input slot {index} ({name}) is empty")
    return row.inputs[index]


def check_group_list(row: KernelRow, index: int, experts: int) -> None:
    spec = required_slot(row, index, "group_list")
    if spec.shape != (experts,) or spec.dtype != "INT64":
        raise CaseBuildError(f"{row.kernel_type} group_list (slot {index}) is {shape_text(spec)} {spec.dtype}; "
                             f"expected [{experts}] INT64, one entry per expert of the weight")
