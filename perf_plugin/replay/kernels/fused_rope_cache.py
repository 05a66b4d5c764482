"""Fused norm + RoPE kernels of LLM attention: ``KvRmsNormRopeCache``, ``split_qkv_rmsnorm_rope_kernel``.

No public profile row of either kernel type exists; the layouts below are the ones Ascend's replay
scripts (``KvRmsNormRopeCache_run.py``, ``split_qkv_rmsnorm_rope_kernel_run.py``) parse.

``KvRmsNormRopeCache`` (DeepSeek MLA, ``aclnnKvRmsNormRopeCache``/V2) has twelve input slots
``kv;gamma;cos;sin;index;k_cache;ckv_cache;k_rope_scale;c_kv_scale;k_rope_offset;c_kv_offset;v``
(the kernel's op definition; ``v`` is V2's optional input) and four outputs
``k_cache;ckv_cache;k_rope;c_kv``.  ``kv [B,1,S,Dv+Dk]`` is split: ``c_kv = rms_norm(kv[..., :Dv])
* gamma`` and ``k_rope`` = the interleaved RoPE of ``kv[..., Dv:]`` (de-interleave, then the half
rotation, as ``InterleaveRope``); both are scattered into the paged caches ``k_cache
[blocks,block_size,1,Dk]`` and ``ckv_cache [blocks,block_size,1,Dv]`` at the flat slots ``index
[B*S]`` (INT64, distinct, in ``[0, blocks*block_size)``), and, with ``is_output_kv``, returned too.
The replay covers the non-quantised paged mode, as the Ascend script does (``cache_mode
'PA_BNSD'``, the same mode as vllm-ascend's ``'PA'``): the scale/offset slots and ``v`` must be
empty.  The epsilon is the model's (DeepSeek-V3 ``rms_norm_eps`` 1e-6, which vllm-ascend passes).
NPU call: ``torch_npu.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache,
epsilon=, cache_mode='PA_BNSD', is_output_kv=)``; it updates the caches in place.  Portable path:
``torch._fused_rms_norm``, the rotation, two ``index_copy_`` into the caches.

``split_qkv_rmsnorm_rope_kernel`` (vllm-ascend Triton kernel behind
``torch.ops.vllm.qkv_rmsnorm_rope``, Qwen3 QK-norm fusion) is ``input;cos_sin_cache;positions ->
q;k;v``: ``input [T, q_hidden + 2*kv_hidden]`` is split into q, k, v; q and k get a per-head
RMSNorm over ``head_dim`` with ``q_weight``/``k_weight [head_dim]``, then the half-mode RoPE with
``cos, sin = cos_sin_cache[positions].chunk(2)`` (each ``[T, head_dim/2]``, repeated over both
halves); v is copied.  ``q_hidden``/``kv_hidden`` are the output widths, ``head_dim`` the cache's last
dim (RoPE over the whole head, the API's default).  A row may record two inputs (no positions:
built as ``[T]`` INT64) or two outputs (q;k).  The call passes keywords only: the operator's
positional order differs between vllm-ascend versions.  Epsilon 1e-6 (Qwen3 ``rms_norm_eps``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.kernels.rope import (
    deinterleave,
    reference_copy,
    reference_rotate_half,
    rope_cos_sin,
    rotate_half_embed,
)
from perf_plugin.replay.tensors import FLOATING, KernelRow, TensorSpec, random_tensor, shape_text

if TYPE_CHECKING:
    import torch

EPSILON = 1e-6
CACHE_MODE = "PA_BNSD"
KV_SLOTS = ("kv", "gamma", "cos", "sin", "index", "k_cache", "ckv_cache")
KV_UNREPLAYED = ("k_rope_scale", "c_kv_scale", "k_rope_offset", "c_kv_offset", "v")
INDEX_DTYPES = ("INT64", "INT32")


def _fail(row: KernelRow, message: str) -> CaseBuildError:
    return CaseBuildError(f"{row.kernel_type} {message}")


def _rms_norm(x: "torch.Tensor", size: int, weight: "torch.Tensor | None", eps: float) -> "torch.Tensor":
    import torch

    fused = getattr(torch, "_fused_rms_norm", None)
    if fused is not None:
        return fused(x, [size], weight, eps)[0]  # type: ignore[no-any-return]
    xf = x.float()
    y = xf * xf.square().mean(-1, keepdim=True).add_(eps).rsqrt_()
    return (y if weight is None else y * weight).to(x.dtype)


def _reference_rms_norm(x: "torch.Tensor", weight: "torch.Tensor", eps: float) -> "torch.Tensor":
    return x / (x.square().mean(-1, keepdim=True) + eps).sqrt() * weight


# ----------------------------------------------------------------------------- KvRmsNormRopeCache
def _kv_specs(row: KernelRow) -> tuple[TensorSpec, ...]:
    inputs = row.inputs
    if len(inputs) < len(KV_SLOTS) or not all(s.present for s in inputs[: len(KV_SLOTS)]):
        raise _fail(row, f"needs input slots {';'.join(KV_SLOTS)}, got " + ";".join(shape_text(s) for s in inputs))
    for offset, spec in enumerate(inputs[len(KV_SLOTS) :]):
        if spec.present:
            name = KV_UNREPLAYED[offset] if offset < len(KV_UNREPLAYED) else "(extra)"
            raise _fail(row, f"input slot {len(KV_SLOTS) + offset} ({name}) is present: only the "
                        "non-quantised cache update without v is replayed")
    outputs = row.outputs
    if len(outputs) < 2 or not (outputs[0].present and outputs[1].present):
        raise _fail(row, "needs outputs k_cache;ckv_cache[;k_rope;c_kv]")
    return inputs[: len(KV_SLOTS)]


def _kv_check(row: KernelRow) -> tuple[int, int, bool]:
    """Dv, Dk and whether the row records k_rope;c_kv (``is_output_kv``)."""
    kv, gamma, cos, sin, index, k_cache, ckv_cache = _kv_specs(row)
    assert kv.shape and gamma.shape and cos.shape and index.shape and k_cache.shape and ckv_cache.shape
    if len(kv.shape) != 4 or kv.shape[1] != 1 or len(gamma.shape) != 1:
        raise _fail(row, f"needs kv [B,1,S,D] and 1-D gamma, got {shape_text(kv)} and {shape_text(gamma)}")
    b, _, s, d = kv.shape
    dv = gamma.shape[0]
    dk = d - dv
    if dk <= 0 or dk % 2:
        raise _fail(row, f"gamma {shape_text(gamma)} leaves an odd or empty RoPE part of kv {shape_text(kv)}")
    if cos.shape != (b, 1, s, dk) or sin.shape != cos.shape:
        raise _fail(row, f"cos/sin {shape_text(cos)};{shape_text(sin)} should be [{b},1,{s},{dk}]")
    if len(index.shape) != 1 or index.shape[0] != b * s or index.dtype != "INT64":
        raise _fail(row, f"index {shape_text(index)} {index.dtype} should be [{b * s}] INT64 (one slot per "
                    "token: the paged modes; Norm and PA_BLK modes are not replayed)")
    blocks = k_cache.shape[:2]
    if len(k_cache.shape) != 4 or k_cache.shape[2:] != (1, dk) or ckv_cache.shape != blocks + (1, dv):
        raise _fail(row, f"caches {shape_text(k_cache)};{shape_text(ckv_cache)} should be "
                    f"[blocks,block_size,1,{dk}];[blocks,block_size,1,{dv}]")
    if any(s.format not in ("", "ND") for s in (k_cache, ckv_cache)):
        raise _fail(row, "caches in a private format (PA_NZ) are not replayed")
    if blocks[0] * blocks[1] < b * s:
        raise _fail(row, f"caches of {blocks[0] * blocks[1]} slots cannot hold {b * s} tokens")
    floats = (kv, gamma, cos, sin, k_cache, ckv_cache)
    if kv.dtype not in FLOATING or any(t.dtype != kv.dtype for t in floats):
        raise _fail(row, "needs kv, gamma, cos, sin and both caches of one floating dtype (int8 caches are quantised)")
    return dv, dk, _kv_outputs(row, kv, k_cache, ckv_cache, dv, dk)


def _kv_outputs(row: KernelRow, kv: TensorSpec, k_cache: TensorSpec, ckv_cache: TensorSpec, dv: int, dk: int) -> bool:
    assert kv.shape is not None
    outputs = row.outputs
    for spec, source, name in ((outputs[0], k_cache, "k_cache"), (outputs[1], ckv_cache, "ckv_cache")):
        if spec.shape != source.shape or spec.dtype != source.dtype:
            raise _fail(row, f"output {name} {shape_text(spec)} should be the input cache {shape_text(source)}")
    extra = [s for s in outputs[2:] if s.present]
    if not extra:
        return False
    if len(extra) != 2 or len(outputs) > 4:
        raise _fail(row, "needs outputs k_rope;c_kv together (is_output_kv) or neither")
    for spec, width, name in ((outputs[2], dk, "k_rope"), (outputs[3], dv, "c_kv")):
        if spec.shape != kv.shape[:3] + (width,) or spec.dtype != kv.dtype:
            raise _fail(row, f"output {name} {shape_text(spec)} should be kv {shape_text(kv)} with last dim {width}")
    return True


class KvRmsNormRopeCacheReplay(OpReplay):
    kernel_types = ("KvRmsNormRopeCache",)
    npu_api = "torch_npu.npu_kv_rmsnorm_rope_cache"

    def check(self, row: KernelRow) -> None:
        _kv_check(row)

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        import torch

        _, _, with_kv = _kv_check(row)
        kv, gamma, cos, _, index, k_cache, ckv_cache = _kv_specs(row)
        assert index.shape is not None and k_cache.shape is not None
        slots = k_cache.shape[0] * k_cache.shape[1]
        # distinct slots in range: the kernel's behaviour on repeated slots is undefined
        order = torch.randperm(slots, generator=generator, device=device)[: index.shape[0]]
        return (
            self.random(kv, device, generator),
            self.random(gamma, device, generator),
            *rope_cos_sin(cos, device, generator),
            order.to(index.torch_dtype()),
            self.random(k_cache, device, generator),
            self.random(ckv_cache, device, generator),
            EPSILON,
            with_kv,
        )

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        *tensors, eps, with_kv = args
        select = (0, 1, 2, 3) if with_kv else (0, 1)
        return self.api_call(*tensors, epsilon=eps, cache_mode=CACHE_MODE, is_output_kv=with_kv, select=select)

    def run(self, *args: Any) -> tuple["torch.Tensor", ...]:
        import torch

        kv, gamma, cos, sin, index, k_cache, ckv_cache, eps, with_kv = args
        dv, dk = gamma.shape[-1], cos.shape[-1]
        nope, rope = kv.split((dv, dk), -1)
        c_kv = _rms_norm(nope, dv, gamma, eps)
        k_rope = rotate_half_embed(torch.cat((rope[..., 0::2], rope[..., 1::2]), -1), cos, sin)
        k_cache.view(-1, dk).index_copy_(0, index, k_rope.reshape(-1, dk))
        ckv_cache.view(-1, dv).index_copy_(0, index, c_kv.reshape(-1, dv))
        return (k_cache, ckv_cache, k_rope, c_kv) if with_kv else (k_cache, ckv_cache)

    def reference(self, *args: Any) -> tuple["torch.Tensor", ...]:
        kv, gamma, cos, sin, index, k_cache, ckv_cache, eps, with_kv = args
        kv64, dv = reference_copy(kv), gamma.shape[-1]
        c_kv = _reference_rms_norm(kv64[..., :dv], reference_copy(gamma), eps)
        k_rope = reference_rotate_half(deinterleave(kv64[..., dv:]), reference_copy(cos), reference_copy(sin))
        caches = []
        for cache, value in ((k_cache, k_rope), (ckv_cache, c_kv)):
            flat = reference_copy(cache).reshape(-1, value.shape[-1])
            flat[index.detach().to("cpu").long()] = value.reshape(-1, value.shape[-1])
            caches.append(flat.reshape(cache.shape))
        return (caches[0], caches[1], k_rope, c_kv) if with_kv else (caches[0], caches[1])


# ----------------------------------------------------------------------------- split_qkv_rmsnorm_rope
def _qkv_sizes(row: KernelRow) -> tuple[int, int, int, bool]:
    """q_hidden, kv_hidden, head_dim and whether the row records v."""
    inputs, outputs = row.inputs, row.present_outputs
    if len(inputs) not in (2, 3) or not all(s.present for s in inputs):
        raise _fail(row, "needs input slots input;cos_sin_cache[;positions], got " + ";".join(shape_text(s) for s in inputs))
    if len(outputs) not in (2, 3):
        raise _fail(row, f"needs outputs q;k[;v], got {len(outputs)} outputs")
    x, cache = inputs[0], inputs[1]
    assert x.shape is not None and cache.shape is not None
    if len(x.shape) != 2 or len(cache.shape) != 2:
        raise _fail(row, f"needs 2-D input and cos_sin_cache, got {shape_text(x)} and {shape_text(cache)}")
    tokens, head_dim = x.shape[0], cache.shape[1]
    q_hidden, kv_hidden = (o.shape[-1] if o.shape else 0 for o in outputs[:2])
    if x.shape[1] != q_hidden + 2 * kv_hidden:
        raise _fail(row, f"input width {x.shape[1]} is not q {q_hidden} + 2 x kv {kv_hidden} (the output widths)")
    if head_dim % 2 or q_hidden % head_dim or kv_hidden % head_dim or kv_hidden == 0:
        raise _fail(row, f"head_dim {head_dim} (cos_sin_cache's last dim) must be even and divide q {q_hidden} and kv {kv_hidden}")
    widths = (q_hidden, kv_hidden, kv_hidden)
    for spec, width in zip(outputs, widths):
        if spec.shape != (tokens, width) or spec.dtype != x.dtype:
            raise _fail(row, f"output {shape_text(spec)} {spec.dtype} should be [{tokens},{width}] {x.dtype}")
    if x.dtype not in FLOATING or cache.dtype != x.dtype:
        raise _fail(row, f"needs input and cos_sin_cache of one floating dtype, got {x.dtype};{cache.dtype}")
    if len(inputs) == 3:
        positions = inputs[2]
        if positions.shape != (tokens,) or positions.dtype not in INDEX_DTYPES:
            raise _fail(row, f"positions {shape_text(positions)} {positions.dtype} should be [{tokens}] INT64")
    return q_hidden, kv_hidden, head_dim, len(outputs) == 3


class SplitQkvRmsNormRopeReplay(OpReplay):
    kernel_types = ("split_qkv_rmsnorm_rope_kernel",)
    npu_api = "torch.ops.vllm.qkv_rmsnorm_rope"

    def check(self, row: KernelRow) -> None:
        _qkv_sizes(row)

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        import torch

        q_hidden, kv_hidden, head_dim, with_v = _qkv_sizes(row)
        x, cache = row.inputs[0], row.inputs[1]
        assert x.shape is not None and cache.shape is not None
        positions = row.inputs[2] if len(row.inputs) == 3 else TensorSpec((x.shape[0],), "INT64")
        # the cache holds cos then sin of each position's angles (vLLM's cos_sin_cache layout)
        angles = random_tensor(TensorSpec((cache.shape[0], head_dim // 2), "FLOAT"), device, generator)
        cos_sin_cache = torch.cat((angles.cos(), angles.sin()), -1).to(cache.torch_dtype())
        weight = TensorSpec((head_dim,), x.dtype)
        return (
            self.random(x, device, generator),
            cos_sin_cache,
            self.random(positions, device, generator, low=0, high=cache.shape[0]),
            self.random(weight, device, generator),
            self.random(weight, device, generator),
            q_hidden,
            kv_hidden,
            head_dim,
            EPSILON,
            with_v,
        )

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        x, cache, positions, q_weight, k_weight, q_hidden, kv_hidden, head_dim, eps, with_v = args
        return self.api_call(
            input=x, cos_sin_cache=cache, positions=positions, q_weight=q_weight, k_weight=k_weight,
            q_hidden_size=q_hidden, kv_hidden_size=kv_hidden, head_dim=head_dim, eps=eps,
            select=(0, 1, 2) if with_v else (0, 1),
        )  # fmt: skip

    def run(self, *args: Any) -> tuple["torch.Tensor", ...]:
        import torch

        x, cache, positions, q_weight, k_weight, q_hidden, kv_hidden, head_dim, eps, with_v = args
        nq, nk = q_hidden // head_dim, kv_hidden // head_dim
        # q and k heads normalised together, each head by its own weight
        qk = x[:, : q_hidden + kv_hidden].reshape(x.shape[0], nq + nk, head_dim)  # a view
        weight = torch.cat((q_weight.expand(nq, head_dim), k_weight.expand(nk, head_dim)))
        normed = _rms_norm(qk, head_dim, None, eps).mul_(weight)
        cos, sin = cache.index_select(0, positions).unsqueeze(1).chunk(2, -1)
        roped = rotate_half_embed(normed, torch.cat((cos, cos), -1), torch.cat((sin, sin), -1))
        q, k = roped[:, :nq].flatten(1), roped[:, nq:].flatten(1)
        return (q, k, x[:, q_hidden + kv_hidden :].clone()) if with_v else (q, k)

    def reference(self, *args: Any) -> tuple["torch.Tensor", ...]:
        import torch

        x, cache, positions, q_weight, k_weight, q_hidden, kv_hidden, head_dim, eps, with_v = args
        x64 = reference_copy(x)
        rows = reference_copy(cache)[positions.detach().to("cpu").long()]
        half = head_dim // 2
        c, s = rows[:, None, :half], rows[:, None, half:]

        def norm_rope(part: "torch.Tensor", weight: "torch.Tensor") -> "torch.Tensor":
            h = _reference_rms_norm(part.reshape(part.shape[0], -1, head_dim), reference_copy(weight), eps)
            h1, h2 = h[..., :half], h[..., half:]
            return torch.cat((h1 * c - h2 * s, h2 * c + h1 * s), -1).flatten(1)

        q = norm_rope(x64[:, :q_hidden], q_weight)
        k = norm_rope(x64[:, q_hidden : q_hidden + kv_hidden], k_weight)
        return (q, k, x64[:, q_hidden + kv_hidden :]) if with_v else (q, k)
