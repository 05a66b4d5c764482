"""``DispatchFFNCombine``: vllm-ascend's fused MoE layer (dispatch, two grouped GEMMs, combine).

No public row exists; the layout is the one Ascend's replay script for the same database parses
(msmodeling ``tools/perf_data_collection/op_replay/DispatchFFNCombine_run.py``), and the operator
definition is vllm-ascend ``csrc/dispatch_ffn_combine/op_host/dispatch_ffn_combine_def.cpp``.
Input slots ``x [M,H] BF16/FLOAT16; weight1 [E,H,2I] INT8; weight2 [E,I,H] INT8; expert_idx
[M,k] INT32; scale1 [E,2I] (or flattened [E*2I]) INT64; scale2 [E,H] (or [E*H]) INT64; probs
[M,k] FLOAT`` -> ``out [M,H]; expert_token_nums [E] or [1,E] INT32``.  ``E`` is the experts of one
rank; ``expert_idx`` spans ``E * EP Size`` experts, and the ``EP Size`` column belongs to the
row's signature (the same shapes on 8 ranks move other data than on 1).  Weights may be recorded
``FRACTAL_NZ`` (logical 3-D shape, or the 5-D storage shape); scales are the ``npu_trans_quant_param``
encoding: float32 bits with the low 13 mantissa bits cleared, and bit 46 set.

Semantics on one rank (EP Size 1, every expert local), per the kernel's epilogues
(``op_kernel/utils/block_epilogue_pertoken_swiglu.hpp``): x is quantised per token to int8
(``sx = max|x| / 127``, round half to even); the (token, slot) pairs are permuted by expert; GEMM1
``h = (xq @ w1_e) * scale1_e * sx``; ``s = silu(h[:, :I]) * h[:, I:]``, requantised per row
(``s2 = max|s| / 127``); GEMM2 ``y = (sq @ w2_e) * scale2_e * s2``; and
``out[t] = sum_j probs[t,j] * y[pair (t,j)]``; ``expert_token_nums[e]`` counts the pairs routed to
expert ``e``.  The portable ``run`` does exactly that in float32 (the kernel keeps GEMM1's output
in float16 before the per-token scale: a difference far below the BF16 threshold; x's quotient is
taken in float64, since 16-bit inputs often put it on a rounding tie), with the permute of
``moe_routing`` and the grouped GEMM of ``grouped_matmul``; the reference is float64, expert by
expert.  ``expert_token_nums`` is verified exactly.  Weights are drawn in ``[-8, 8)``
so the float32 GEMMs accumulate integers exactly.

A row with ``EP Size`` > 1 runs in a process group of exactly that many ranks (``group_size``;
``perf_plugin.replay.rank_group``): the kernel sends tokens to ``EP Size`` ranks over HCCL.  On an
NPU run the controller replays such rows in a session of their own under torchrun, every rank
running every such row (``perf_plugin.run.ep_launch``); in a run that forms no such group the row
is skipped with the reason.  The constraint probe (``_dfc_probe``) is called with the size of the
group that is active.  There, the portable ``run`` and its reference are those of
``_dfc_ep`` (collectives of the group: gloo on the CPU): this rank's tokens and experts, the
dispatch an all-gather, the combine an all-reduce.  On an NPU the call is
``torch.ops._C_ascend.dispatch_ffn_combine(x=, weight1=[w1], weight2=[w2], expert_idx=,
scale1=[s1], scale2=[s2], probs=, group=, max_output_size=, out=, expert_token_nums=)`` (the
keywords msmodeling passes).  ``group`` is the HCCL communicator name of the EP process group,
which exists only at run time: the call carries an ``EpGroup`` (``CommName``) marker that the run
replaces with the name the device backend reads from the active group
(``ProcessGroupHCCL.get_hccl_comm_name(rank)``; a group of one rank for EP Size 1).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perf_plugin.database.signature import SignatureRule
from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.kernels._dfc_ep import EpShape, reference_ep, run_ep
from perf_plugin.replay.kernels._dfc_probe import DfcShape, dfc_blocker, hccl_window_mb
from perf_plugin.replay.kernels._grouped_gemm import (
    Groups,
    can_fuse,
    grouped_mm,
    maybe_nz,
    weight_shape,
)
from perf_plugin.replay.kernels.moe_routing import draw_top_k_ids, permute_order
from perf_plugin.replay.rank_group import CommName, RankGroup, active_group
from perf_plugin.replay.tensors import KernelRow, TensorSpec, shape_text

if TYPE_CHECKING:
    import torch

EP_SIZE_COLUMN = "EP Size"
SINGLE_PROCESS_EP = 1  # the EP group a single-process run can form
INT8_BOUND = 8  # |w| < 8: GEMM partial sums stay integers below 2**24, exact in float32
QUANT_PARAM_BIT = 1 << 46  # npu_trans_quant_param's flag bit above the float32 payload
QUANT_PARAM_MASK = 0xFFFFE000  # the hardware reads the top 19 bits of the float32


# The ``group`` argument: the HCCL communicator name of the expert-parallel process group of
# ``size`` ranks, which exists only once the group does; the run substitutes it before the call.
EpGroup = CommName


@dataclass(frozen=True)
class DfcPlan:
    tokens: int
    hidden: int
    inter: int  # I: GEMM1 writes 2I columns, SwiGLU halves them
    experts: int  # on this rank
    top_k: int
    ep_size: int
    group: RankGroup | None = None  # the active expert-parallel group (EP Size > 1), once it exists

    @property
    def ep_shape(self) -> EpShape:
        return EpShape(self.tokens, self.hidden, self.inter, self.experts, self.top_k)


def ep_size(row: KernelRow) -> int:
    text = str(row.attrs.get(EP_SIZE_COLUMN, "")).strip()
    if not text:
        raise CaseBuildError(
            f"{row.kernel_type} row has no {EP_SIZE_COLUMN!r}: the kernel's expert ids span experts-per-rank x EP size, "
            "so the row cannot be rebuilt without it"
        )
    try:
        size = int(float(text))
    except ValueError:
        raise CaseBuildError(f"{row.kernel_type} {EP_SIZE_COLUMN} {text!r} is not a number") from None
    if size < 1:
        raise CaseBuildError(f"{row.kernel_type} {EP_SIZE_COLUMN} {size} is not a positive rank count")
    return size


def encode_quant_param(scale: "torch.Tensor") -> "torch.Tensor":
    """float32 scales -> the INT64 form ``npu_trans_quant_param`` produces."""
    import torch

    bits = scale.float().view(torch.int32).long() & QUANT_PARAM_MASK
    return bits | QUANT_PARAM_BIT


def decode_quant_param(param: "torch.Tensor") -> "torch.Tensor":
    """The float32 scale the hardware applies for an INT64 quant parameter."""
    import torch

    return (param & 0xFFFFFFFF).to(torch.int32).view(torch.float32)


class DispatchFFNCombineReplay(OpReplay):
    kernel_types = ("DispatchFFNCombine",)
    npu_api = "torch.ops._C_ascend.dispatch_ffn_combine"
    signature_rule = SignatureRule(extra_columns=(EP_SIZE_COLUMN,))
    group_column = EP_SIZE_COLUMN

    def group_size(self, row: KernelRow) -> int:
        return ep_size(row)

    def plan(self, row: KernelRow) -> DfcPlan:
        if len(row.inputs) != 7 or not all(s.present for s in row.inputs) or len(row.present_outputs) != 2:
            raise CaseBuildError(
                f"{row.kernel_type} needs 7 inputs x;weight1;weight2;expert_idx;scale1;scale2;probs and 2 outputs "
                f"out;expert_token_nums, got inputs {';'.join(shape_text(s) for s in row.inputs)} and "
                f"{len(row.present_outputs)} output(s)"
            )
        x, w1, w2, idx, s1, s2, probs = row.inputs
        out, counts = row.present_outputs
        assert x.shape is not None and idx.shape is not None
        w1s, w2s = weight_shape(w1), weight_shape(w2)
        if len(x.shape) != 2 or len(w1s) != 3 or len(idx.shape) != 2 or w1s[1] != x.shape[1] or w1s[2] % 2:
            raise CaseBuildError(
                f"{row.kernel_type} needs x [M,H], weight1 [E,H,2I] and expert_idx [M,k]; got {shape_text(x)}, "
                f"{shape_text(w1s)}, {shape_text(idx)}"
            )
        (m, h), (e, _, n1), k = x.shape, w1s, idx.shape[1]
        expected = {
            "weight2": (w2s, (e, n1 // 2, h)), "expert_idx": (idx.shape, (m, k)), "probs": (probs.shape, (m, k)),
            "out": (out.shape, (m, h)),
        }  # fmt: skip
        for name, (got, want) in expected.items():
            if got != want:
                raise CaseBuildError(f"{row.kernel_type} {name} is {shape_text(got)}, expected {shape_text(want)}")
        for name, spec, n in (("scale1", s1, n1), ("scale2", s2, h)):
            if spec.shape not in ((e, n), (e * n,)) or spec.dtype != "INT64":
                raise CaseBuildError(
                    f"{row.kernel_type} {name} is {shape_text(spec)} {spec.dtype}, expected [{e},{n}] or [{e * n}] INT64"
                )
        self._check_dtypes(row, e)
        size = ep_size(row)
        # The probe runs with the group this case runs in: the active one, else this process alone.
        group = active_group()
        group_ranks = group.size if group is not None else SINGLE_PROCESS_EP
        blocker = dfc_blocker(DfcShape(m, h, k, e, size), group_ranks, hccl_window_mb(os.environ))
        if blocker is not None:
            raise CaseBuildError(f"{row.kernel_type} {blocker}")
        return DfcPlan(m, h, n1 // 2, e, k, size, group if size > 1 else None)

    @staticmethod
    def _check_dtypes(row: KernelRow, experts: int) -> None:
        x, w1, w2, idx, _, _, probs = row.inputs
        out, counts = row.present_outputs
        if w1.dtype != "INT8" or w2.dtype != "INT8":
            raise CaseBuildError(
                f"{row.kernel_type} weights are {w1.dtype}/{w2.dtype}; only the W8A8 variant (INT8 weights, "
                "aclnnDispatchFFNCombine) is replayed"
            )
        if x.dtype not in ("BF16", "FLOAT16") or out.dtype != x.dtype:
            raise CaseBuildError(f"{row.kernel_type} x/out dtypes {x.dtype}/{out.dtype} should both be BF16 or FLOAT16")
        if idx.dtype != "INT32" or probs.dtype != "FLOAT":
            raise CaseBuildError(f"{row.kernel_type} expert_idx/probs are {idx.dtype}/{probs.dtype}, expected INT32/FLOAT")
        if counts.shape not in ((experts,), (1, experts)) or counts.dtype != "INT32":
            raise CaseBuildError(
                f"{row.kernel_type} expert_token_nums is {shape_text(counts)} {counts.dtype}, expected "
                f"[{experts}] or [1,{experts}] INT32"
            )

    def check(self, row: KernelRow) -> None:
        self.plan(row)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        import torch

        p = self.plan(row)
        x_spec, _, _, _, s1_spec, s2_spec, probs_spec = row.inputs
        x = self.random(x_spec, device, generator)
        w1 = self.random(TensorSpec((p.experts, p.hidden, 2 * p.inter), "INT8"), device, generator, low=-INT8_BOUND, high=INT8_BOUND)
        w2 = self.random(TensorSpec((p.experts, p.inter, p.hidden), "INT8"), device, generator, low=-INT8_BOUND, high=INT8_BOUND)
        ids = draw_top_k_ids(p.tokens, p.top_k, p.experts * p.ep_size, device, generator).int()
        # Scales that keep every stage near unit magnitude (FLOAT16 outputs stay normal numbers):
        # a quantised activation times a weight in [-8, 8) has a standard deviation of about
        # 400 per term, and the per-token scales bring the activations back to ~1/100.
        s1 = self.random(TensorSpec(s1_spec.shape, "FLOAT"), device, generator).abs_().div_(5 * math.sqrt(p.hidden))
        s2 = self.random(TensorSpec(s2_spec.shape, "FLOAT"), device, generator).abs_().div_(5 * math.sqrt(p.inter))
        probs = self.random(probs_spec, device, generator).abs_()
        out = torch.empty((p.tokens, p.hidden), dtype=x.dtype, device=device)
        counts_spec = row.present_outputs[1]
        counts = torch.zeros(counts_spec.shape or (), dtype=torch.int32, device=device)
        # on one rank the group sizes are known now; over a group they come with the other ranks' ids (run)
        local = generator is not None and p.group is None
        sizes = torch.bincount(ids.reshape(-1).long().cpu(), minlength=p.experts) if local else None
        groups = Groups(
            tuple(int(v) for v in sizes.tolist()) if sizes is not None else (0,) * p.experts,
            can_fuse("FLOAT", p.hidden, 2 * p.inter, device) and can_fuse("FLOAT", p.inter, p.hidden, device),
        )
        return x, w1, w2, ids, encode_quant_param(s1), encode_quant_param(s2), probs, out, counts, groups, p

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        x, w1, w2, ids, s1, s2, probs, out, counts, _, p = args
        return self.api_call(
            x=x, weight1=[maybe_nz(row.inputs[1], w1)], weight2=[maybe_nz(row.inputs[2], w2)], expert_idx=ids,
            scale1=[s1], scale2=[s2], probs=probs, group=EpGroup(p.ep_size),
            # the most pairs one rank can receive: every token of every rank, k times
            max_output_size=p.tokens * p.top_k * p.ep_size, out=out, expert_token_nums=counts, select=(0, 1),
        )  # fmt: skip

    def run(
        self, x: "torch.Tensor", w1: "torch.Tensor", w2: "torch.Tensor", ids: "torch.Tensor", s1: "torch.Tensor",
        s2: "torch.Tensor", probs: "torch.Tensor", out: "torch.Tensor", counts: "torch.Tensor", groups: Groups, p: DfcPlan,
    ) -> tuple["torch.Tensor", "torch.Tensor"]:
        import torch

        if p.group is not None:
            ep_out, ep_counts = run_ep(x, w1, w2, ids, decode_quant_param(s1), decode_quant_param(s2), probs,
                                       p.ep_shape, p.group.handle, p.group.rank)  # fmt: skip
            return ep_out, ep_counts.view(counts.shape)

        # 16-bit x makes 127 * x / max|x| land exactly on .5 ties often; the quotient is taken in
        # float64, as in the reference, so both round them alike.  Int8 values, float32 for the GEMM.
        x64 = x.double()
        sx64 = x64.abs().amax(dim=1) / 127
        xq, sx = torch.round(x64 / sx64.unsqueeze(1)).float(), sx64.float()
        flat = ids.reshape(-1).long()
        first, dest = permute_order(flat)
        expert = flat.index_select(0, first)  # the expert of every sorted pair
        token = torch.div(first, p.top_k, rounding_mode="floor")
        per_expert = torch.zeros(p.experts, dtype=torch.int64, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
        offsets = per_expert.cumsum(0).int()
        scale1 = decode_quant_param(s1).view(p.experts, -1).index_select(0, expert)
        h = grouped_mm(xq.index_select(0, token), w1.float(), offsets, groups).mul_(scale1).mul_(sx.index_select(0, token).unsqueeze(1))
        act, gate = h[:, : p.inter], h[:, p.inter :]
        s = act / (1 + torch.exp(-act)) * gate
        s2_tok = s.abs().amax(dim=1) / 127
        sq = torch.round(s / s2_tok.unsqueeze(1))
        scale2 = decode_quant_param(s2).view(p.experts, -1).index_select(0, expert)
        y = grouped_mm(sq, w2.float(), offsets, groups).mul_(scale2).mul_(s2_tok.unsqueeze(1))
        pairs = y.index_select(0, dest).view(p.tokens, p.top_k, p.hidden)
        combined = torch.bmm(probs.unsqueeze(1), pairs).squeeze(1).to(x.dtype)
        return combined, per_expert.int().view(counts.shape)

    def reference(
        self, x: "torch.Tensor", w1: "torch.Tensor", w2: "torch.Tensor", ids: "torch.Tensor", s1: "torch.Tensor",
        s2: "torch.Tensor", probs: "torch.Tensor", out: "torch.Tensor", counts: "torch.Tensor", groups: Groups, p: DfcPlan,
    ) -> tuple["torch.Tensor", "torch.Tensor"]:
        """Float64, one expert at a time, from the token-major expert ids (no permutation)."""
        import torch

        if p.group is not None:
            ep_out, tallies = reference_ep(x, w1, w2, ids, decode_quant_param(s1), decode_quant_param(s2), probs,
                                           p.ep_shape, p.group.handle, p.group.rank)  # fmt: skip
            return ep_out, tallies.view(counts.shape)

        x64, idx, pr = x.detach().cpu().double(), ids.detach().cpu().long(), probs.detach().cpu().double()
        sx = x64.abs().amax(dim=1) / 127
        xq = torch.round(x64 / sx.unsqueeze(1))
        scale1 = decode_quant_param(s1.detach().cpu()).double().view(p.experts, -1)
        scale2 = decode_quant_param(s2.detach().cpu()).double().view(p.experts, -1)
        result = torch.zeros((p.tokens, p.hidden), dtype=torch.float64)
        tally = torch.zeros(p.experts, dtype=torch.int32)
        for e in range(p.experts):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            tally[e] = tok.numel()
            if not tok.numel():
                continue
            h = (xq[tok] @ w1[e].detach().cpu().double()) * scale1[e] * sx[tok].unsqueeze(1)
            act, gate = h.chunk(2, dim=1)
            s = act / (1 + torch.exp(-act)) * gate
            s2_tok = s.abs().amax(dim=1) / 127
            y = (torch.round(s / s2_tok.unsqueeze(1)) @ w2[e].detach().cpu().double()) * scale2[e] * s2_tok.unsqueeze(1)
            result.index_add_(0, tok, y * pr[tok, slot].unsqueeze(1))
        return result, tally.view(counts.shape)
