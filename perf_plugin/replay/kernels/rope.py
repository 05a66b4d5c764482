"""Rotary position embedding replays: ``RotaryPositionEmbedding``, its ``Grad``, ``InterleaveRope``.

``RotaryPositionEmbedding`` is ``x;cos;sin -> y`` (``aclnnRotaryPositionEmbedding``), all 4-D with
``cos``/``sin`` broadcast over ``x`` (Level2 rows: ``x [4096,1,16,128]`` in SBND layout,
``cos``/``sin`` ``[4096,1,1,128]``).  On an NPU it is ``torch_npu.npu_rotary_mul(x, cos, sin)``:
op-plugin's ``npu_rotary_mul`` calls ``aclnnRotaryPositionEmbedding`` on Atlas A2/A3
(``RotaryMulKernelNpuOpApi.cpp``).  The rotary mode is an attribute the row does not record; it is
the API's default ``half`` (GPT-NeoX ``rotate_half``: ``y = x*cos + cat(-x2, x1)*sin``), the mode
of the LLaMA/Qwen-style training that produced the rows, so ``rotary_mode`` is not passed (older
torch_npu versions have no such argument).

``RotaryPositionEmbeddingGrad`` is ``dy;cos;sin;x -> dx;dcos;dsin``
(``aclnnRotaryPositionEmbeddingGrad``).  The Level2 rows leave ``x``, ``dcos`` and ``dsin`` empty:
op-plugin's ``npu_rotary_mul_backward`` passes ``x`` to the kernel only when ``cos`` or ``sin``
requires grad, and the kernel then also writes ``dcos``/``dsin`` (``RotaryMulBackwardKernelNpuOpApi.cpp``).
The NPU call is ``torch.ops.npu.npu_rotary_mul_backward(dy, x, cos, sin)`` returning
``(dx, dcos, dsin)``; for a row with ``x`` the replay marks ``cos``/``sin`` as requiring grad so
the API hands ``x`` to the kernel.  The portable path is the closed-form gradient:
``dx = dy*cos + R^T(dy*sin)`` with ``R^T(g) = cat(g2, -g1)``, ``dcos``/``dsin`` the sums of
``dy*x`` / ``dy*R(x)`` over the dims ``cos`` broadcasts.

``InterleaveRope`` is ``x;cos;sin -> y`` (``torch_npu.npu_interleave_rope``, DeepSeek MLA q_pe):
``x [B,N,S,D]``, ``cos``/``sin`` ``[B,1,S or 1,D]``.  Per aclnnInterleaveRope's documentation the
kernel first de-interleaves the pairs, ``q = cat(x[..., 0::2], x[..., 1::2])``, then applies the
half rotation to ``q``; the output stays in that de-interleaved layout.

``cos``/``sin`` are built as the cosine/sine of random angles, duplicated over the two halves as
RoPE caches are, so they lie in [-1, 1] as the kernels require and are never zero.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.tensors import FLOATING, KernelRow, TensorSpec, random_tensor, shape_text

if TYPE_CHECKING:
    import torch

Shape = tuple[int, ...]


# ----------------------------------------------------------------------------- shared math
def rotate_half_embed(x: "torch.Tensor", cos: "torch.Tensor", sin: "torch.Tensor") -> "torch.Tensor":
    """``x*cos + cat(-x2, x1)*sin`` (half mode) in four kernels: neg, cat, mul, addcmul."""
    import torch

    x1, x2 = x.chunk(2, -1)
    return torch.addcmul(x * cos, torch.cat((x2.neg(), x1), -1), sin)


def reference_rotate_half(x: "torch.Tensor", cos: "torch.Tensor", sin: "torch.Tensor") -> "torch.Tensor":
    """The half rotation written per half (float64 references): ``[x1*c1 - x2*s1, x2*c2 + x1*s2]``."""
    import torch

    h = x.shape[-1] // 2
    x1, x2, c1, c2, s1, s2 = x[..., :h], x[..., h:], cos[..., :h], cos[..., h:], sin[..., :h], sin[..., h:]
    return torch.cat((x1 * c1 - x2 * s1, x2 * c2 + x1 * s2), -1)


def deinterleave(x: "torch.Tensor") -> "torch.Tensor":
    """``reshape(.., D/2, 2).transpose(-1, -2).reshape(.., D)``: the even elements, then the odd."""
    return x.reshape(*x.shape[:-1], x.shape[-1] // 2, 2).transpose(-1, -2).flatten(-2)


def rope_cos_sin(
    spec: TensorSpec, device: "torch.device", generator: "torch.Generator"
) -> tuple["torch.Tensor", "torch.Tensor"]:
    """cos/sin of ``spec``: random angles of half the last dim, duplicated over both halves."""
    import torch

    assert spec.shape is not None
    half = TensorSpec(spec.shape[:-1] + (spec.shape[-1] // 2,), "FLOAT")
    angles = random_tensor(half, device, generator)  # +-[0.5, 1.5]: cos and sin never zero
    angles = torch.cat((angles, angles), -1)
    return angles.cos().to(spec.torch_dtype()), angles.sin().to(spec.torch_dtype())


def reference_copy(value: "torch.Tensor") -> "torch.Tensor":
    return value.detach().to("cpu").double()


# ----------------------------------------------------------------------------- row checks
def _slot_list(specs: tuple[TensorSpec, ...]) -> str:
    return ";".join(shape_text(s) for s in specs)


def rope_operands(row: KernelRow, names: tuple[str, ...], optional: int = 0) -> tuple[TensorSpec, ...]:
    """The row's leading input slots named ``names`` (the last ``optional`` ones may be empty);
    no further slot may be present."""
    inputs = row.inputs
    required = len(names) - optional
    if len(inputs) < required or not all(s.present for s in inputs[:required]) or any(
        s.present for s in inputs[len(names):]
    ):
        raise CaseBuildError(
            f"{row.kernel_type} needs input slots {';'.join(names)}, got {_slot_list(inputs)}"
        )
    return tuple(inputs[i] if i < len(inputs) else TensorSpec(None, "") for i in range(len(names)))


def check_cos_sin(row: KernelRow, x: TensorSpec, cos: TensorSpec, sin: TensorSpec, head_dim_one: bool) -> None:
    """4-D ``x``, ``cos``/``sin`` of one shape broadcasting over it, one floating dtype, even D."""
    assert x.shape is not None and cos.shape is not None and sin.shape is not None
    kind = row.kernel_type
    if len(x.shape) != 4 or len(cos.shape) != 4:
        raise CaseBuildError(f"{kind} needs 4-D x and cos, got {shape_text(x)} and {shape_text(cos)}")
    if sin.shape != cos.shape:
        raise CaseBuildError(f"{kind} sin {shape_text(sin)} differs from cos {shape_text(cos)}")
    if cos.shape[-1] != x.shape[-1] or x.shape[-1] % 2:
        raise CaseBuildError(f"{kind} needs an even last dim shared by x {shape_text(x)} and cos {shape_text(cos)}")
    if any(c not in (1, d) for c, d in zip(cos.shape, x.shape)):
        raise CaseBuildError(f"{kind} cos {shape_text(cos)} does not broadcast over x {shape_text(x)}")
    if head_dim_one and cos.shape[1] != 1:
        raise CaseBuildError(f"{kind} cos {shape_text(cos)} must have N (dim 1) = 1")
    if x.dtype not in FLOATING or cos.dtype != x.dtype or sin.dtype != x.dtype:
        raise CaseBuildError(
            f"{kind} needs x, cos and sin of one floating dtype, got {x.dtype};{cos.dtype};{sin.dtype} "
            "(the API would launch a Cast kernel first)"
        )


def like_input(row: KernelRow, out: TensorSpec, source: TensorSpec, name: str) -> None:
    if out.shape != source.shape or out.dtype != source.dtype:
        raise CaseBuildError(
            f"{row.kernel_type} output {name} {shape_text(out)} {out.dtype} should have the shape and "
            f"dtype of {shape_text(source)} {source.dtype}"
        )


def _single_output(row: KernelRow, x: TensorSpec) -> None:
    outputs = row.present_outputs
    if len(outputs) != 1:
        raise CaseBuildError(f"{row.kernel_type} needs exactly one output y, got {len(outputs)}")
    like_input(row, outputs[0], x, "y")


# ----------------------------------------------------------------------------- replays
class _RotaryEmbeddingReplay(OpReplay):
    """``x;cos;sin -> y`` of ``x``'s shape and dtype: the row's checks, inputs and NPU call."""

    # Whether cos/sin must have N (dim 1) = 1, shared by every head.
    head_dim_one: ClassVar[bool] = False

    def check(self, row: KernelRow) -> None:
        x, cos, sin = rope_operands(row, ("x", "cos", "sin"))
        check_cos_sin(row, x, cos, sin, head_dim_one=self.head_dim_one)
        _single_output(row, x)

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        self.check(row)
        x, cos = row.inputs[0], row.inputs[1]
        return (self.random(x, device, generator),) + rope_cos_sin(cos, device, generator)

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        return self.api_call(*args)  # npu_rotary_mul's rotary_mode left at its default, 'half'


class RotaryPositionEmbeddingReplay(_RotaryEmbeddingReplay):
    """``y = x*cos + rotate_half(x)*sin`` (``npu_rotary_mul``, half mode)."""

    kernel_types = ("RotaryPositionEmbedding",)
    npu_api = "torch_npu.npu_rotary_mul"

    def run(self, x: "torch.Tensor", cos: "torch.Tensor", sin: "torch.Tensor") -> "torch.Tensor":
        return rotate_half_embed(x, cos, sin)

    def reference(self, x: "torch.Tensor", cos: "torch.Tensor", sin: "torch.Tensor") -> "torch.Tensor":
        return reference_rotate_half(reference_copy(x), reference_copy(cos), reference_copy(sin))


class RotaryPositionEmbeddingGradReplay(OpReplay):
    """``dx`` (and, with ``x``, ``dcos``/``dsin``) of the half-mode rotary embedding."""

    kernel_types = ("RotaryPositionEmbeddingGrad",)
    npu_api = "torch.ops.npu.npu_rotary_mul_backward"

    def with_x(self, row: KernelRow) -> bool:
        dy, cos, sin, x = rope_operands(row, ("dy", "cos", "sin", "x"), optional=1)
        check_cos_sin(row, dy, cos, sin, head_dim_one=False)
        outputs = row.outputs
        if not outputs or not outputs[0].present:
            raise CaseBuildError(f"{row.kernel_type} needs output dx in slot 0")
        like_input(row, outputs[0], dy, "dx")
        grads = [s for s in outputs[1:3] if s.present]
        if x.present:
            like_input(row, x, dy, "x")
            if len(grads) != 2:
                raise CaseBuildError(f"{row.kernel_type} with input x needs outputs dx;dcos;dsin")
            like_input(row, outputs[1], cos, "dcos")
            like_input(row, outputs[2], sin, "dsin")
        elif grads:
            raise CaseBuildError(f"{row.kernel_type} outputs dcos/dsin need input x (slot 3), which is empty")
        if any(s.present for s in outputs[3:]):
            raise CaseBuildError(f"{row.kernel_type} has more than the outputs dx;dcos;dsin")
        return x.present

    def check(self, row: KernelRow) -> None:
        self.with_x(row)

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        with_x = self.with_x(row)
        dy = self.random(row.inputs[0], device, generator)
        cos, sin = rope_cos_sin(row.inputs[1], device, generator)
        # The API always takes x; the kernel reads it only when cos/sin require grad (op-plugin).
        x = self.random(row.inputs[0], device, generator)
        if with_x:
            cos.requires_grad_(True)
            sin.requires_grad_(True)
        return dy, x, cos, sin, with_x

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        dy, x, cos, sin, with_x = args
        return self.api_call(dy, x, cos, sin, select=(0, 1, 2) if with_x else (0,))

    def run(
        self, dy: "torch.Tensor", x: "torch.Tensor", cos: "torch.Tensor", sin: "torch.Tensor", with_x: bool
    ) -> "torch.Tensor | tuple[torch.Tensor, ...]":
        import torch

        with torch.no_grad():  # cos/sin may require grad (see make_inputs); record no graph
            g1, g2 = (dy * sin).chunk(2, -1)
            dx = torch.addcmul(torch.cat((g2, g1.neg()), -1), dy, cos)
            if not with_x:
                return dx
            x1, x2 = x.chunk(2, -1)
            # summed over the dims cos/sin broadcast
            dcos = (dy * x).sum_to_size(cos.shape)
            dsin = (dy * torch.cat((x2.neg(), x1), -1)).sum_to_size(sin.shape)
            return dx, dcos, dsin

    def reference(
        self, dy: "torch.Tensor", x: "torch.Tensor", cos: "torch.Tensor", sin: "torch.Tensor", with_x: bool
    ) -> "torch.Tensor | tuple[torch.Tensor, ...]":
        import torch

        g, xx, c, s = (reference_copy(t) for t in (dy, x, cos, sin))
        h = g.shape[-1] // 2
        g1, g2, x1, x2 = g[..., :h], g[..., h:], xx[..., :h], xx[..., h:]
        # y1 = x1*c1 - x2*s1, y2 = x2*c2 + x1*s2, differentiated by hand
        dx = torch.cat((g1 * c[..., :h] + g2 * s[..., h:], g2 * c[..., h:] - g1 * s[..., :h]), -1)
        if not with_x:
            return dx
        dcos = torch.cat((g1 * x1, g2 * x2), -1).sum_to_size(c.shape)
        dsin = torch.cat((-g1 * x2, g2 * x1), -1).sum_to_size(s.shape)
        return dx, dcos, dsin


class InterleaveRopeReplay(_RotaryEmbeddingReplay):
    """``y = rotate_half_embed(cat(x[..., 0::2], x[..., 1::2]), cos, sin)`` (DeepSeek MLA)."""

    kernel_types = ("InterleaveRope",)
    npu_api = "torch_npu.npu_interleave_rope"
    head_dim_one = True

    def run(self, x: "torch.Tensor", cos: "torch.Tensor", sin: "torch.Tensor") -> "torch.Tensor":
        import torch

        return rotate_half_embed(torch.cat((x[..., 0::2], x[..., 1::2]), -1), cos, sin)

    def reference(self, x: "torch.Tensor", cos: "torch.Tensor", sin: "torch.Tensor") -> "torch.Tensor":
        return reference_rotate_half(deinterleave(reference_copy(x)), reference_copy(cos), reference_copy(sin))
