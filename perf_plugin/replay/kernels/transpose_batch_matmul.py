"""``TransposeBatchMatMul`` replay: a batched matmul that reads ``x1`` and writes ``y`` batch-permuted.

Row: ``x1;x2 -> y`` (optional ``bias``/``scale`` slots 2-3 must be empty), all ND, one floating
dtype.  ``x2`` is ``[B,K,N]`` and ``y`` is ``[M,B,N]`` (``perm_y = [1,0,2]``, the only output
permutation aclnnTransposeBatchMatMul supports); ``x1`` is recorded in its stored layout, either

* ``[M,B,K]`` with ``perm_x1 = [1,0,2]`` (the kernel reads it transposed): the real rows
  ``4,16,128;16,128,512 -> 4,16,512`` (MLA's ``attn_output @ W_UV`` in vllm-ascend, called
  ``npu_transpose_batchmatmul(x, W_UV, perm_x1=(1,0,2), perm_y=(1,0,2))``), or
* ``[B,M,K]`` with ``perm_x1 = [0,1,2]`` (vllm-ascend's other call site, and the only layout
  Ascend/msmodeling's ``TransposeBatchMatMul_run.py`` accepts; that script rejects the real rows
  above because it compares ``x1[0]`` with ``x2[0]``).

When both layouts fit (``M == B``) ``[B,M,K]`` is taken.  The kernel requires ``K`` and ``N`` to
be multiples of 128 (aclnnTransposeBatchMatMul docs; msmodeling's script checks the same).

NPU call: ``torch_npu.npu_transpose_batchmatmul(x1, x2, perm_x1=..., perm_x2=[0,1,2],
perm_y=[1,0,2])`` (op-plugin ``npu_transpose_batchmatmul`` -> ``aclnnTransposeBatchMatMul``).
``npu_api`` stays ``torch.bmm``, the string the op_mapping files name, but ``torch.bmm`` cannot
launch this kernel: op-plugin's ``bmm`` (``BmmKernelNpuOpApi.cpp``) only calls
``aclnnBatchMatMul``/``aclnnMatmul`` into a new ``[B,M,N]`` tensor, so a transposed ``x1`` or
``y`` costs separate Transpose kernels; msmodeling's script says the same ("so msprof captures the
fused TransposeBatchMatMul kernel instead of separate BatchMatMulV2 and Transpose kernels").

Portable path: ``torch.bmm`` of the ``[B,M,K]`` view of ``x1`` writing into the ``[B,M,N]`` view
of a preallocated ``[M,B,N]`` output (cuBLAS takes the strided output as it is).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.tensors import FLOATING, KernelRow, TensorSpec, shape_text

if TYPE_CHECKING:
    import torch

Shape = tuple[int, ...]
PERM_X1_BATCH_FIRST = (0, 1, 2)  # x1 stored [B,M,K]
PERM_X1_BATCH_SECOND = (1, 0, 2)  # x1 stored [M,B,K]
PERM_Y = (1, 0, 2)
ALIGNMENT = 128


def x1_permutation(x1: Shape, x2: Shape, out: Shape) -> tuple[int, int, int] | None:
    """``perm_x1`` under which ``x1 @ x2`` gives ``out = [M,B,N]``, or None."""
    if len(x1) != 3 or len(x2) != 3 or len(out) != 3:
        return None
    batch, k, n = x2
    if x1[2] != k or out[1:] != (batch, n):
        return None
    if x1[0] == batch and x1[1] == out[0]:
        return PERM_X1_BATCH_FIRST
    if x1[1] == batch and x1[0] == out[0]:
        return PERM_X1_BATCH_SECOND
    return None


class TransposeBatchMatMulReplay(OpReplay):
    """``y[m,b,:] = x1[b,m,:] @ x2[b]`` with ``x1`` stored ``[B,M,K]`` or ``[M,B,K]``."""

    kernel_types = ("TransposeBatchMatMul",)
    npu_api = "torch.bmm"  # as op_mapping names it; the launching call is npu_call's (see above)

    def _operands(self, row: KernelRow) -> tuple[TensorSpec, TensorSpec, TensorSpec]:
        inputs = row.inputs
        if len(inputs) < 2 or not inputs[0].present or not inputs[1].present:
            raise CaseBuildError(f"{row.kernel_type} needs x1 and x2 (input slots 0 and 1)")
        extra = [i for i, s in enumerate(inputs[2:], start=2) if s.present]
        if extra:
            raise CaseBuildError(
                f"{row.kernel_type} input slot {extra[0]} ({shape_text(inputs[extra[0]])}) is present; the "
                "bias/scale variants (int8 output [M,1,B*N]) are not replayed"
            )
        outputs = row.present_outputs
        if len(outputs) != 1:
            raise CaseBuildError(f"{row.kernel_type} needs exactly one output, got {len(outputs)}")
        return inputs[0], inputs[1], outputs[0]

    def permutation(self, row: KernelRow) -> tuple[int, int, int]:
        x1, x2, out = self._operands(row)
        assert x1.shape is not None and x2.shape is not None and out.shape is not None
        perm = x1_permutation(x1.shape, x2.shape, out.shape)
        if perm is None:
            raise CaseBuildError(
                f"{row.kernel_type} shapes are inconsistent: x1 {shape_text(x1)} ([B,M,K] or [M,B,K]), "
                f"x2 {shape_text(x2)} ([B,K,N]) do not give y {shape_text(out)} ([M,B,N]; batch_split_factor "
                "> 1 is not replayed)"
            )
        for name, spec in (("x1", x1), ("x2", x2), ("y", out)):
            if spec.format not in ("", "ND"):
                raise CaseBuildError(f"{row.kernel_type} {name} is in format {spec.format}; only ND is replayed")
        if x1.dtype not in FLOATING or x1.dtype != x2.dtype or out.dtype != x1.dtype:
            raise CaseBuildError(
                f"{row.kernel_type} dtypes are {x1.dtype};{x2.dtype} -> {out.dtype}; expected one floating dtype"
            )
        k, n = x2.shape[1:]
        if k % ALIGNMENT or n % ALIGNMENT:
            raise CaseBuildError(f"{row.kernel_type} needs K and N divisible by {ALIGNMENT}, got K={k}, N={n}")
        return perm

    def check(self, row: KernelRow) -> None:
        self.permutation(row)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        import torch

        perm = self.permutation(row)
        x1_spec, x2_spec, out_spec = self._operands(row)
        assert out_spec.shape is not None
        x1 = self.random(x1_spec, device, generator)  # contiguous in the recorded layout
        x2 = self.random(x2_spec, device, generator)
        out = torch.empty(out_spec.shape, device=device, dtype=out_spec.torch_dtype())
        return x1, x2, out, perm

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        x1, x2, _, perm = args
        kwargs = {"perm_x1": list(perm), "perm_x2": [0, 1, 2], "perm_y": list(PERM_Y)}
        return ApiCall("torch_npu.npu_transpose_batchmatmul", (x1, x2), kwargs)

    def run(
        self, x1: "torch.Tensor", x2: "torch.Tensor", out: "torch.Tensor", perm: tuple[int, int, int]
    ) -> "torch.Tensor":
        import torch

        batch_first = x1 if perm == PERM_X1_BATCH_FIRST else x1.transpose(0, 1)
        torch.bmm(batch_first, x2, out=out.transpose(0, 1))
        return out
