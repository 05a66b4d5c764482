"""Training-step replays: ``EmbeddingDenseGradV2`` (embedding backward) and ``ApplyAdamWV2``.

``EmbeddingDenseGradV2`` (real Level2 row ``"1,4096,1024;4096;4096"`` FLOAT;INT32;INT32 ->
``"151936,1024"`` FLOAT, ``aclnnEmbeddingDenseBackward_EmbeddingDenseGradV2_EmbeddingDenseGradV2``):
``aclnnEmbeddingDenseBackward(grad, indices, numWeights, paddingIdx, scaleGradByFreq)`` sorts the
flattened token ids first (a ``Sort`` kernel, stable, ascending, INT32 positions) and hands the
kernel ``grad``, the sorted ids (``sort_indices``) and the position of each sorted id in the
original order (``pos_idx``, the argsort); the kernel adds ``grad[pos_idx[i]]`` into row
``sort_indices[i]`` of a ``[num_weights, dim]`` output that a ``MemSet`` cleared (CANN ops-nn
``aclnn_embedding_dense_backward.cpp`` and the ``EmbeddingDenseGradV2`` op definition: inputs
grad, sort_indices, pos_idx; attributes num_weights, padding_idx, scale_grad_by_freq).
``num_weights`` is the output's first dim; ``padding_idx`` (-1, none) and ``scale_grad_by_freq``
(False) are attributes the row does not record, set as an LLM's token embedding uses them.
NPU API: ``torch.ops.aten.embedding_dense_backward(grad, indices, num_weights, -1, False)`` on the
unsorted ids (op-plugin -> ``aclnnEmbeddingDenseBackward``; it also launches the ``Sort`` and the
``MemSet``, recorded as their own kernel types).  Portable ``run``: the kernel's own computation
on the row's inputs, ``zeros.index_add_(0, sort_indices, grad[pos_idx])``.  Reference: float64
sums of the touched rows only (at most ``N`` of 151936), in a float32 ``[num_weights, dim]``.

``ApplyAdamWV2`` (real rows ``"3145728;3145728;3145728;3145728;1"`` FLOAT;FLOAT;FLOAT;FLOAT;INT64
-> N/A): one AdamW step in place on ``var;m;v;grad;step`` (``aclnnApplyAdamWV2(varRef, mRef, vRef,
maxGradNormOptional, grad, step, lr, beta1, beta2, weightDecay, eps, amsgrad, maximize)`` with the
optional ``max_grad_norm`` absent, i.e. amsgrad off).  The outputs are the updated ``var``, ``m``
and ``v``, which the profile does not list (N/A): ``expected_outputs`` names them and ``run``
returns them.  API: ``torch._fused_adamw_`` (op-plugin runs ``aclnnApplyAdamWV2`` for each tensor
with ``step - 1``, the kernel counting ``t = step + 1``), which also runs on the CPU and CUDA, so
``run`` is that call everywhere.  The hyper-parameters are not recorded; the replay uses
``torch.optim.AdamW``'s defaults (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2,
amsgrad and maximize off) at step 10.  ``v`` starts non-negative (a second moment).  Since the
update is in place, ``make_inputs`` keeps host copies of the initial ``var, m, v``; the reference
recomputes the step from them in float64, chunk by chunk, into tensors of the row's dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.tensors import FLOATING, KernelRow, TensorSpec, shape_text
from perf_plugin.trace.args import concrete_arg, tensor_arg
from perf_plugin.trace.events import TraceOp
from perf_plugin.trace.mapped import MappedOp, Slot

if TYPE_CHECKING:
    import torch

INDEX_DTYPES = frozenset({"INT32", "INT64"})
PADDING_IDX = -1
SCALE_GRAD_BY_FREQ = False


@dataclass(frozen=True)
class AdamW:
    """Hyper-parameters of the replayed step: ``torch.optim.AdamW``'s defaults (not recorded)."""

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 1e-2
    eps: float = 1e-8


ADAMW = AdamW()
ADAMW_STEP = 10  # any t > 1: the bias corrections matter and the cost does not depend on it
REFERENCE_CHUNK = 1 << 22


# ----------------------------------------------------------------------------- embedding backward
def _trace_embedding_backward(op: TraceOp, _: list[TraceOp]) -> MappedOp | None:
    """``embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq)``,
    or ``embedding_backward(..., sparse=False)`` which autograd calls and which calls it: the
    kernel sees the FLOAT grad and INT32 sorted ids and positions (aclnn casts the ids)."""
    grad, indices = tensor_arg(op, 0), tensor_arg(op, 1)
    num_weights = concrete_arg(op, 2)
    if grad is None or indices is None or grad.dtype != "FLOAT" or grad.rank == 0:
        return None
    if op.name == "aten::embedding_backward" and concrete_arg(op, 5) is not False:
        return None  # a sparse gradient is another kernel
    if not isinstance(num_weights, int) or isinstance(num_weights, bool) or concrete_arg(op, 4) is True:
        return None  # scale_grad_by_freq is an attribute the row cannot carry
    count = 1
    for dim in indices.shape:
        count *= dim
    return MappedOp(
        "EmbeddingDenseGradV2",
        (Slot(grad.shape, grad.dtype), Slot((count,), "INT32"), Slot((count,), "INT32")),
        (Slot((num_weights, grad.shape[-1]), grad.dtype),),
    )


class EmbeddingDenseGradV2Replay(OpReplay):
    kernel_types = ("EmbeddingDenseGradV2",)
    npu_api = "torch.ops.aten.embedding_dense_backward"
    trace_ops = MappingProxyType(
        {
            "aten::embedding_dense_backward": _trace_embedding_backward,
            "aten::embedding_backward": _trace_embedding_backward,
        }
    )

    def slots(self, row: KernelRow) -> tuple[TensorSpec, TensorSpec, TensorSpec, TensorSpec]:
        inputs = row.inputs
        if len(inputs) != 3 or not all(s.present for s in inputs) or len(row.present_outputs) != 1:
            raise CaseBuildError(
                f"{row.kernel_type} needs input slots grad;sort_indices;pos_idx and one output, got "
                + ";".join(shape_text(s) for s in inputs)
                + f" and {len(row.present_outputs)} output(s)"
            )
        grad, ids, pos = inputs
        out = row.present_outputs[0]
        assert grad.shape is not None and ids.shape is not None and pos.shape is not None and out.shape is not None
        tokens = 1
        for dim in grad.shape[:-1]:
            tokens *= dim
        if grad.dtype not in FLOATING or not grad.shape:
            raise CaseBuildError(f"{row.kernel_type} grad {shape_text(grad)} {grad.dtype} is not a floating tensor")
        for name, spec in (("sort_indices", ids), ("pos_idx", pos)):
            if spec.shape != (tokens,) or spec.dtype not in INDEX_DTYPES:
                raise CaseBuildError(
                    f"{row.kernel_type} {name} {shape_text(spec)} {spec.dtype} should be [{tokens}] INT32/INT64 "
                    f"(one per row of grad {shape_text(grad)})"
                )
        if len(out.shape) != 2 or out.shape[1] != grad.shape[-1] or out.shape[0] == 0 or out.dtype != grad.dtype:
            raise CaseBuildError(
                f"{row.kernel_type} output {shape_text(out)} {out.dtype} should be [num_weights,{grad.shape[-1]}] "
                f"{grad.dtype}"
            )
        return grad, ids, pos, out

    def check(self, row: KernelRow) -> None:
        self.slots(row)

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        import torch

        grad_spec, ids_spec, pos_spec, out = self.slots(row)
        assert grad_spec.shape is not None and out.shape is not None
        num_weights = out.shape[0]
        grad = self.random(grad_spec, device, generator)
        # The token ids the model looked up, then what aclnn's stable ascending Sort gives the kernel.
        ids = self.random(ids_spec, device, generator, low=0, high=num_weights)
        sorted_ids, positions = torch.sort(ids, stable=True)
        indices = ids.view(grad_spec.shape[:-1])
        return grad, sorted_ids, positions.to(pos_spec.torch_dtype()), num_weights, indices

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        grad, _, _, num_weights, indices = args
        return self.api_call(grad, indices, num_weights, PADDING_IDX, SCALE_GRAD_BY_FREQ)

    def run(
        self, grad: "torch.Tensor", ids: "torch.Tensor", pos: "torch.Tensor", num_weights: int, indices: "torch.Tensor"
    ) -> "torch.Tensor":
        rows = grad.reshape(-1, grad.shape[-1])
        out = rows.new_zeros((num_weights, rows.shape[1]))
        return out.index_add_(0, ids, rows.index_select(0, pos))

    def reference(
        self, grad: "torch.Tensor", ids: "torch.Tensor", pos: "torch.Tensor", num_weights: int, indices: "torch.Tensor"
    ) -> "torch.Tensor":
        import torch

        rows = grad.detach().to("cpu", torch.float64).reshape(-1, grad.shape[-1])
        keys = indices.detach().to("cpu").reshape(-1).long()
        touched, slot = torch.unique(keys, return_inverse=True)
        sums = torch.zeros((touched.numel(), rows.shape[1]), dtype=torch.float64).index_add_(0, slot, rows)
        out = torch.zeros((num_weights, rows.shape[1]), dtype=grad.dtype)
        out[touched] = sums.to(grad.dtype)  # rounded once; rows no token touched stay exactly 0
        return out


# ----------------------------------------------------------------------------- AdamW
class ApplyAdamWV2Replay(OpReplay):
    kernel_types = ("ApplyAdamWV2",)
    npu_api = "torch._fused_adamw_"

    def slots(self, row: KernelRow) -> tuple[TensorSpec, TensorSpec]:
        inputs = row.inputs
        if len(inputs) != 5 or not all(s.present for s in inputs):
            raise CaseBuildError(
                f"{row.kernel_type} needs input slots var;m;v;grad;step (amsgrad off), got "
                + ";".join(shape_text(s) for s in inputs)
            )
        var, step = inputs[0], inputs[4]
        for name, spec in zip(("m", "v", "grad"), inputs[1:4]):
            if (spec.shape, spec.dtype) != (var.shape, var.dtype):
                raise CaseBuildError(
                    f"{row.kernel_type} {name} {shape_text(spec)} {spec.dtype} differs from var "
                    f"{shape_text(var)} {var.dtype}"
                )
        if var.dtype not in FLOATING:
            raise CaseBuildError(f"{row.kernel_type} var dtype {var.dtype} is not floating")
        if step.numel != 1 or step.dtype not in ("INT64", "FLOAT", "FLOAT32", "FP32"):
            raise CaseBuildError(
                f"{row.kernel_type} step {shape_text(step)} {step.dtype} should hold one INT64 or FLOAT value"
            )
        recorded = row.present_outputs
        if recorded and [(s.shape, s.dtype) for s in recorded] != [(var.shape, var.dtype)] * 3:
            raise CaseBuildError(f"{row.kernel_type} outputs should be var;m;v when recorded, got {len(recorded)}")
        return var, step

    def check(self, row: KernelRow) -> None:
        self.slots(row)

    def expected_outputs(self, row: KernelRow) -> Sequence[TensorSpec]:
        var, _ = self.slots(row)
        return (var, var, var)  # the updated var, m and v (in place; the profile records N/A)

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        import torch

        var_spec, step_spec = self.slots(row)
        var, m, v, grad = (self.random(var_spec, device, generator) for _ in range(4))
        v.abs_()  # a second moment is non-negative
        assert step_spec.shape is not None
        # CUDA's fused AdamW reads only floating step counts; the NPU kernel the row's INT64
        dtype = torch.float32 if device.type == "cuda" else step_spec.torch_dtype()
        step = torch.full(step_spec.shape, ADAMW_STEP, dtype=dtype, device=device)
        # Host copies of the initial state for the reference, since run updates in place (a meta
        # tensor has no values to copy).
        initial = tuple(t.detach().to("cpu", copy=True) for t in (var, m, v)) if device.type != "meta" else ()
        return var, m, v, grad, step, initial

    def run(
        self, var: "torch.Tensor", m: "torch.Tensor", v: "torch.Tensor", grad: "torch.Tensor",
        step: "torch.Tensor", initial: tuple["torch.Tensor", ...],
    ) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:  # fmt: skip
        import torch

        h = ADAMW
        torch._fused_adamw_(
            [var], [grad], [m], [v], [], [step], lr=h.lr, beta1=h.beta1, beta2=h.beta2,
            weight_decay=h.weight_decay, eps=h.eps, amsgrad=False, maximize=False,
        )  # fmt: skip
        return var, m, v

    def reference(
        self, var: "torch.Tensor", m: "torch.Tensor", v: "torch.Tensor", grad: "torch.Tensor",
        step: "torch.Tensor", initial: tuple["torch.Tensor", ...],
    ) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:  # fmt: skip
        import torch

        t = float(step.detach().to("cpu").reshape(-1)[0])
        outputs = tuple(torch.empty_like(x) for x in initial)
        flat_in = [x.reshape(-1) for x in initial] + [grad.detach().reshape(-1)]
        flat_out = [x.reshape(-1) for x in outputs]
        for start in range(0, flat_in[0].numel(), REFERENCE_CHUNK):
            var64, m64, v64, grad64 = (x[start : start + REFERENCE_CHUNK].to("cpu", torch.float64) for x in flat_in)
            for target, value in zip(flat_out, adamw_step(var64, m64, v64, grad64, t)):
                target[start : start + REFERENCE_CHUNK] = value
        return outputs[0], outputs[1], outputs[2]


def adamw_step(
    var: "torch.Tensor", m: "torch.Tensor", v: "torch.Tensor", grad: "torch.Tensor", t: float
) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
    """One AdamW step (decoupled weight decay, bias correction at step ``t``), out of place."""
    h = ADAMW
    m_new = m * h.beta1 + grad * (1.0 - h.beta1)
    v_new = v * h.beta2 + grad * grad * (1.0 - h.beta2)
    denom = (v_new / (1.0 - h.beta2**t)).sqrt() + h.eps
    var_new = var * (1.0 - h.lr * h.weight_decay) - h.lr * (m_new / (1.0 - h.beta1**t)) / denom
    return var_new, m_new, v_new
