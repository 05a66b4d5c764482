"""``QuantBatchMatmulV3`` replay: W8A8 matmul, int8 x int8 with int32 accumulation, then dequantised.

Row layout.  The kernel's inputs are ``x1;x2;scale;offset;bias;pertoken_scale -> y`` (ops-nn
``l0op::QuantBatchMatmulV3``, ``quant_matmul_v3.cpp``); a profiler row lists them in that order
with empty slots for absent optionals.  Ascend/msmodeling's ``QuantBatchMatmulV3_run.py`` reads
database rows that list only the present inputs, ``x1;x2;scale[;extra]``, and infers the extra's
role: INT32 -> ``bias``, FLOAT of ``M`` elements -> ``pertoken_scale``, FLOAT of 1 or ``N`` ->
``offset``.  Both layouts are accepted (a row with an empty slot, or six slots, is positional;
otherwise roles are inferred the same way, except that a floating ``[N]`` extra of a BF16/FP16
output is a ``bias``, since aclnnQuantMatmulV4 takes ``offset`` only for int8 outputs).

* ``x1`` INT8 ``[M,K]`` (or ``[B,M,K]``); ``y`` ``x1.shape[:-1] + [N]`` in BF16, FLOAT16 or INT8.
* ``x2`` INT8: ND ``[K,N]``, or ``[N,K]`` (a transposed weight, stored ``[N,K]`` and passed as a
  ``.t()`` view, as vllm-ascend's linear weights are); or FRACTAL_NZ, where the row records the
  4-D storage shape ``(a,b,c,d)`` whose logical shape is ``(b*c, a*d) = (K,N)`` (msmodeling's
  ``expand_fractal_nz_shape``; ``[N/32, K/16, 16, 32]`` for int8, padded to whole tiles).  The
  logical ``[K,N]`` tensor is handed to the API as ``NpuFormat(weight, "FRACTAL_NZ")``.
* ``scale`` ``[1]`` or ``[N]``: FLOAT/BF16, or INT64/UINT64 packed by ``npu_trans_quant_param``
  (float32 bits truncated to the upper 19 in bits 0-31, bit 46 set, a 9-bit offset in bits 37-45):
  aclnn requires the packed form for INT8/FLOAT16 outputs without ``pertoken_scale``.  Scales are
  drawn already truncated, so the packed and float values are the same number.
* ``offset`` FLOAT ``[1]``/``[N]`` (INT8 output only; drawn integral so its packed copy is exact),
  ``bias`` ``[N]`` INT32 (added to the accumulator) or BF16/FLOAT16/FLOAT (added after scaling),
  ``pertoken_scale`` FLOAT ``[M]`` (BF16/FLOAT16 output only).

``y = (x1 @ x2 [+ bias_int32]) * scale [* pertoken_scale] [+ offset | + bias_float]``, rounded to
nearest even and saturated for INT8 outputs (the rounding ``AscendQuant`` uses; the fixpipe's
requantisation rounding is not documented, so an NPU may differ on exact ties).

NPU API.  op_mapping names ``torch_npu.npu_weight_quant_batchmatmul`` (kept as ``npu_api``, the
catalog test requires it), but that API is A16W8: its ``x`` must be FLOAT16/BF16 and it launches
``WeightQuantBatchMatmulV2`` (op-plugin ``torch_npu-npu_weight_quant_batchmatmul.md``).  An int8
``x1`` reaches QuantBatchMatmulV3 through ``torch_npu.npu_quant_matmul`` (op-plugin
``QuantMatmulKernelNpuOpApi.cpp`` calls ``aclnnQuantMatmulV5``, or ``aclnnQuantMatmulWeightNz``
for an NZ weight; for int8 x int8 these run ``l0op::QuantBatchMatmulV3``, ops-nn
``matmul/quant_batch_matmul_v3/op_api``), which msmodeling's replay script calls too;
``npu_call`` therefore names ``npu_quant_matmul``.  The packed scale is passed as it is
(a FLOAT scale there would make op-plugin launch ``TransQuantParamV2`` inside the timed call).

Portable path: ``torch._int_mm`` (CPU; CUDA when ``M > 16`` and ``K``, ``N`` are multiples of 8)
or a float64 GEMM (sums up to ``K * 2**14`` are exact integers in float64, and fit the int32
accumulator, like the kernel's, for ``K < 2**17``), then the dequantisation in float32.  The
reference is the float64 GEMM with float64 dequantisation; for INT8 outputs it rounds to float32
after each operation, as the run does, so the comparison is exact (Figueroa: float64 then float32
rounding equals float32 arithmetic for one ``*`` or ``+``).
Float8 (Ascend 950), int4-in-int32 and INT32/FLOAT outputs are reported as not replayed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from perf_plugin.replay.api_call import ApiCall, NpuFormat
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.tensors import DTYPES, FLOATING, KernelRow, TensorSpec, shape_text

if TYPE_CHECKING:
    import torch

Shape = tuple[int, ...]
ROLES = ("x1", "x2", "scale", "offset", "bias", "pertoken_scale")
PACKED = frozenset({"INT64", "UINT64"})
OUTPUTS = frozenset({"BF16", "FLOAT16", "INT8"})
SCALE_MASK = -8192  # 0xFFFFE000 as int32: the 19 upper bits of a float32 the hardware keeps
SCALE_FLAG = 1 << 46
# std of an int8 (uniform on [-128,128)) is about 74: the accumulator's is 74**2 * sqrt(K)
INT8_STD = 74.0
TARGET = {"INT8": 48.0, "BF16": 4.0, "FLOAT16": 4.0}  # output std: int8 saturates a little


@dataclass(frozen=True)
class QuantMatmulPlan:
    """What a row means: the roles of its slots and the GEMM's layout."""

    slots: Mapping[str, TensorSpec]
    m: int
    k: int
    n: int
    weight_transposed: bool
    weight_nz: bool
    out_dtype: str


def _candidate_roles(spec: TensorSpec, m: int, n: int, out_dtype: str) -> list[str]:
    """Roles an unnamed extra slot can play, most likely first (msmodeling's inference order)."""
    numel = spec.numel
    roles = []
    if spec.dtype == "INT32":
        roles.append("bias")
    if spec.dtype == "FLOAT" and numel == m and out_dtype != "INT8":
        roles.append("pertoken_scale")
    if spec.dtype == "FLOAT" and numel in (1, n) and out_dtype == "INT8":
        roles.append("offset")
    if spec.dtype in FLOATING and numel == n and out_dtype != "INT8":
        roles.append("bias")
    return roles


def _assign_roles(row: KernelRow, m: int, n: int, out_dtype: str) -> dict[str, TensorSpec]:
    inputs = row.inputs
    if len(inputs) >= len(ROLES) or any(not s.present for s in inputs):
        if any(s.present for s in inputs[len(ROLES):]):
            raise CaseBuildError(f"{row.kernel_type} has more than {len(ROLES)} inputs ({', '.join(ROLES)})")
        return {role: s for role, s in zip(ROLES, inputs) if s.present}
    extras = inputs[3:]
    choices = [_candidate_roles(s, m, n, out_dtype) for s in extras]
    for combo in itertools.product(*choices):
        order = [ROLES.index(role) for role in combo]
        if all(a < b for a, b in zip(order, order[1:])):  # the kernel's order, no role twice
            return dict(zip(ROLES[:3], inputs[:3])) | dict(zip(combo, extras))
    raise CaseBuildError(
        f"{row.kernel_type} extra inputs "
        + ";".join(f"{s.dtype} {shape_text(s)}" for s in extras)
        + f" cannot be told apart as offset/bias/pertoken_scale (M={m}, N={n}, output {out_dtype})"
    )


def _weight_layout(row: KernelRow, x2: TensorSpec, k: int, n: int) -> tuple[bool, bool]:
    """(transposed, fractal_nz) of the weight, from its recorded shape and format."""
    assert x2.shape is not None
    if x2.format == "FRACTAL_NZ":
        if len(x2.shape) == 4:
            a, b, c, d = x2.shape
            # whole tiles: the logical K x N fits the expanded shape with less than a tile to spare
            if 0 <= b * c - k < c and 0 <= a * d - n < d:
                return False, True
        raise CaseBuildError(
            f"{row.kernel_type} FRACTAL_NZ weight {shape_text(x2)} is not the storage shape (a,b,c,d) of "
            f"K x N = {k} x {n} (b*c = K, a*d = N, padded to whole tiles; transposed NZ weights are not replayed)"
        )
    if x2.format not in ("", "ND"):
        raise CaseBuildError(f"{row.kernel_type} weight format {x2.format} is not replayed (ND or FRACTAL_NZ)")
    if x2.shape == (k, n):
        return False, False
    if x2.shape == (n, k):
        return True, False
    raise CaseBuildError(f"{row.kernel_type} weight {shape_text(x2)} is neither [K,N] nor [N,K] for K={k}, N={n}")


def _check_dequant(row: KernelRow, slots: Mapping[str, TensorSpec], n: int, m: int, out: str) -> None:
    """aclnnQuantMatmulV4's dtype/shape rules for the scales, offset and bias."""
    scale, offset, bias, pertoken = (slots.get(r) for r in ("scale", "offset", "bias", "pertoken_scale"))
    assert scale is not None

    def fail(what: str) -> CaseBuildError:
        return CaseBuildError(f"{row.kernel_type} {what}")

    if scale.dtype not in PACKED | {"FLOAT", "BF16"} or scale.shape not in ((1,), (n,)):
        raise fail(f"scale is {scale.dtype} {shape_text(scale)}; expected FLOAT/BF16/INT64/UINT64 [1] or [{n}]")
    if pertoken is not None and (out == "INT8" or pertoken.dtype != "FLOAT" or pertoken.shape != (m,)):
        raise fail(
            f"pertoken_scale {pertoken.dtype} {shape_text(pertoken)} needs FLOAT [{m}] and a BF16/FLOAT16 output"
        )
    if pertoken is not None and out == "FLOAT16" and scale.dtype != "FLOAT":
        raise fail(f"scale is {scale.dtype}: a FLOAT16 output with pertoken_scale takes a FLOAT scale")
    if pertoken is None and out != "BF16" and scale.dtype not in PACKED:
        raise fail(
            f"scale is {scale.dtype}: an {out} output without pertoken_scale takes the INT64/UINT64 packed scale"
        )
    if out == "BF16" and scale.dtype in PACKED:
        raise fail("a BF16 output takes a FLOAT/BF16 scale, not a packed one")
    if offset is not None and (out != "INT8" or offset.dtype != "FLOAT" or offset.shape not in ((1,), (n,))):
        raise fail(f"offset {offset.dtype} {shape_text(offset)} needs FLOAT [1]/[{n}] and an INT8 output")
    if bias is not None:
        bias_ok = bias.dtype == "INT32" or (bias.dtype in FLOATING and out != "INT8")
        if not bias_ok or bias.shape is None or bias.shape[-1] != n or math.prod(bias.shape) != n:
            raise fail(f"bias {bias.dtype} {shape_text(bias)} needs [{n}], INT32 (or floating for a float output)")


def _int8_gemm(a: "torch.Tensor", b: "torch.Tensor") -> "torch.Tensor":
    """Exact int32 ``a @ b`` of int8 ``a [..., M, K]`` and ``b [K, N]``."""
    import torch

    rows = a.reshape(-1, a.shape[-1])
    m, k, n = rows.shape[0], rows.shape[1], b.shape[1]
    fits_cuda = rows.device.type == "cuda" and m > 16 and k % 8 == 0 and n % 8 == 0
    if rows.device.type in ("cpu", "meta") or fits_cuda:
        acc = torch._int_mm(rows, b)
    else:  # int8 products summed in float64 stay exact integers
        acc = rows.double().matmul(b.double()).to(torch.int32)
    return acc.reshape(*a.shape[:-1], n)


class QuantBatchMatmulV3Replay(OpReplay):
    """W8A8 GEMM with per-channel/per-tensor scale, optional per-token scale, offset and bias."""

    kernel_types = ("QuantBatchMatmulV3",)
    npu_api = "torch_npu.npu_weight_quant_batchmatmul"  # op_mapping's string (catalog test)
    # the API whose int8 path launches QuantBatchMatmulV3 (module docstring): what npu_call names
    launching_api: ClassVar[str] = "torch_npu.npu_quant_matmul"

    def plan(self, row: KernelRow) -> QuantMatmulPlan:
        inputs, outputs = row.inputs, row.present_outputs
        if len(inputs) < 3 or not all(s.present for s in inputs[:3]):
            raise CaseBuildError(f"{row.kernel_type} needs x1, x2 and scale (input slots 0-2)")
        if len(outputs) != 1:
            raise CaseBuildError(f"{row.kernel_type} needs exactly one output, got {len(outputs)}")
        x1, x2, out = inputs[0], inputs[1], outputs[0]
        assert x1.shape is not None and out.shape is not None
        if x1.dtype != "INT8" or x2.dtype != "INT8":
            raise CaseBuildError(
                f"{row.kernel_type} operands are {x1.dtype}/{x2.dtype}; only INT8 x INT8 (W8A8) is replayed "
                "(float8/hifloat8 operands are Ascend 950 only, INT32 carries packed int4)"
            )
        if out.dtype not in OUTPUTS:
            raise CaseBuildError(f"{row.kernel_type} output is {out.dtype}; BF16, FLOAT16 and INT8 are replayed")
        if len(x1.shape) not in (2, 3) or len(out.shape) != len(x1.shape) or out.shape[:-1] != x1.shape[:-1]:
            raise CaseBuildError(
                f"{row.kernel_type} x1 {shape_text(x1)} and y {shape_text(out)} must be [M,K] -> [M,N] "
                "or [B,M,K] -> [B,M,N]"
            )
        m, k, n = x1.shape[-2], x1.shape[-1], out.shape[-1]
        slots = _assign_roles(row, m, n, out.dtype)
        if "pertoken_scale" in slots and len(x1.shape) != 2:
            raise CaseBuildError(
                f"{row.kernel_type} pertoken_scale is replayed for a 2-D x1 only, got {shape_text(x1)}"
            )
        transposed, nz = _weight_layout(row, x2, k, n)
        _check_dequant(row, slots, n, m, out.dtype)
        return QuantMatmulPlan(slots, m, k, n, transposed, nz, out.dtype)

    def check(self, row: KernelRow) -> None:
        self.plan(row)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        plan = self.plan(row)
        slots = plan.slots
        x1 = self.random(slots["x1"], device, generator, low=-128, high=128)
        stored = (plan.n, plan.k) if plan.weight_transposed else (plan.k, plan.n)
        weight = self.random(TensorSpec(stored, "INT8"), device, generator, low=-128, high=128)
        x2 = weight.t() if plan.weight_transposed else weight
        dequant = self._scale(plan, device, generator)
        offset = None
        if "offset" in slots:  # integral, so the 9-bit copy inside a packed scale is the same value
            shape = slots["offset"].shape
            offset = self.random(TensorSpec(shape, "INT32"), device, generator, low=-8, high=9).float()
        api_scale = self._api_scale(plan, dequant, offset)
        bias = None
        if "bias" in slots:
            bias = self._bias(plan, slots["bias"], device, generator)
        pertoken = None
        if "pertoken_scale" in slots:
            pertoken = self.random(slots["pertoken_scale"], device, generator).abs_()
        return x1, x2, api_scale, offset, bias, pertoken, dequant, plan

    def _scale(self, plan: QuantMatmulPlan, device: "torch.device", generator: "torch.Generator") -> "torch.Tensor":
        """The float32 dequantisation scale, positive, truncated to the 19 bits the hardware keeps."""
        import torch

        spec = plan.slots["scale"]
        assert spec.shape is not None
        base = TARGET[plan.out_dtype] / (INT8_STD**2 * math.sqrt(plan.k))
        values = self.random(TensorSpec(spec.shape, "FLOAT"), device, generator).abs_().mul_(base)
        truncated = (values.view(torch.int32) & SCALE_MASK).view(torch.float32)
        return truncated.to(torch.bfloat16).float() if spec.dtype == "BF16" else truncated

    def _api_scale(
        self, plan: QuantMatmulPlan, dequant: "torch.Tensor", offset: "torch.Tensor | None"
    ) -> "torch.Tensor":
        """The scale as the API takes it: packed int64 (npu_trans_quant_param's layout) or FLOAT/BF16."""
        import torch

        dtype = plan.slots["scale"].dtype
        if dtype not in PACKED:
            return dequant.to(torch.bfloat16) if dtype == "BF16" else dequant
        packed = (dequant.view(torch.int32).to(torch.int64) & 0xFFFFFFFF) | SCALE_FLAG
        if offset is not None:
            packed = packed | ((offset.to(torch.int64) & 0x1FF) << 37)
        return packed

    def _bias(
        self, plan: QuantMatmulPlan, spec: TensorSpec, device: "torch.device", generator: "torch.Generator"
    ) -> "torch.Tensor":
        if spec.dtype == "INT32":  # a few percent of the accumulator's spread
            spread = int(INT8_STD**2 * math.sqrt(plan.k) / 16) + 1
            return self.random(spec, device, generator, low=-spread, high=spread)
        return self.random(spec, device, generator).mul_(TARGET[plan.out_dtype] / 4)

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        import torch

        x1, x2, api_scale, offset, bias, pertoken, _, plan = args
        weight = NpuFormat(x2, "FRACTAL_NZ") if plan.weight_nz else x2
        kwargs: dict[str, Any] = {"output_dtype": getattr(torch, DTYPES[plan.out_dtype][0])}
        for name, value in (("offset", offset), ("pertoken_scale", pertoken), ("bias", bias)):
            if value is not None:
                kwargs[name] = value
        return ApiCall(self.launching_api, (x1, weight, api_scale), kwargs)

    def run(
        self, x1: "torch.Tensor", x2: "torch.Tensor", api_scale: "torch.Tensor", offset: "torch.Tensor | None",
        bias: "torch.Tensor | None", pertoken: "torch.Tensor | None", dequant: "torch.Tensor", plan: QuantMatmulPlan,
    ) -> "torch.Tensor":  # fmt: skip
        import torch

        acc = _int8_gemm(x1, x2)
        int_bias = bias if bias is not None and bias.dtype == torch.int32 else None
        float_bias = bias if int_bias is None else None
        if int_bias is not None:
            acc.add_(int_bias)
        y = torch.mul(acc, dequant)  # int32 * float32: one float32 multiply
        if pertoken is not None:
            y.mul_(pertoken.unsqueeze(-1))
        if offset is not None:
            y.add_(offset)
        if float_bias is not None:
            y.add_(float_bias)
        if plan.out_dtype == "INT8":
            return y.round_().clamp_(-128, 127).to(torch.int8)
        return y.to(getattr(torch, DTYPES[plan.out_dtype][0]))

    def reference(
        self, x1: "torch.Tensor", x2: "torch.Tensor", api_scale: "torch.Tensor", offset: "torch.Tensor | None",
        bias: "torch.Tensor | None", pertoken: "torch.Tensor | None", dequant: "torch.Tensor", plan: QuantMatmulPlan,
    ) -> "torch.Tensor":  # fmt: skip
        import torch

        def cpu(t: "torch.Tensor") -> "torch.Tensor":
            return t.detach().to("cpu", torch.float64)

        # float32 rounding points only where the output is an integer (see the module docstring)
        rounding = plan.out_dtype == "INT8"

        def step(t: "torch.Tensor") -> "torch.Tensor":
            return t.to(torch.float32).to(torch.float64) if rounding else t

        acc = cpu(x1) @ cpu(x2)  # exact: integers far below 2**53
        if bias is not None and bias.dtype == torch.int32:
            acc = acc + cpu(bias)
        y = step(step(acc) * cpu(dequant))
        if pertoken is not None:
            y = y * cpu(pertoken).unsqueeze(-1)
        if offset is not None:
            y = step(y + cpu(offset))
        if bias is not None and bias.dtype != torch.int32:
            y = y + cpu(bias)
        return y.round().clamp(-128, 127) if rounding else y
