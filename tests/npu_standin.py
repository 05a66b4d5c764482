"""torch_npu's MoE and varlen attention operators on the CPU: their real schemas in the ``npu`` namespace, CPU kernels.

torch_npu registers ``npu_grouped_matmul`` (and its ``.List`` overload),
``npu_grouped_matmul_swiglu_quant``, ``npu_fusion_attention``, ``npu_moe_token_permute`` and
``npu_moe_token_unpermute`` as ``torch.ops.npu.*`` with the schemas of
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
from perf_plugin.replay.kernels.moe_routing import MoeTokenPermuteReplay, MoeTokenUnpermuteReplay
from tests.npu_schemas import SCHEMAS

OPERATORS = ("npu_grouped_matmul", "npu_grouped_matmul.List", "npu_grouped_matmul_swiglu_quant", "npu_fusion_attention",
             "npu_moe_token_permute", "npu_moe_token_unpermute")
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


def _fusion_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, head_num: int, input_layout: str,
                      pse: Any = None, padding_mask: Any = None, atten_mask: Any = None, scale: float = 1.0,
                      keep_prob: float = 1.0, pre_tockens: int = 0, next_tockens: int = 0, inner_precise: int = 0,
                      prefix: Any = None, actual_seq_qlen: Any = None, actual_seq_kvlen: Any = None,
                      sparse_mode: int = 0, *_: Any, **__: Any) -> tuple[torch.Tensor, ...]:
    """The TND layout only: per request (``actual_seq_qlen`` / ``actual_seq_kvlen`` cumulative),
    softmax over its keys, sparse_mode 3 masking each request's keys past its bottom-right
    diagonal; returns (attention_out, softmax_max [T,N,8], softmax_sum [T,N,8], softmax_out, seed,
    offset, numels)."""
    if input_layout != "TND":
        raise NotImplementedError("the stand-in computes the TND layout only")
    q_ends, kv_ends, group = list(actual_seq_qlen), list(actual_seq_kvlen), head_num // key.shape[1]
    outs, peaks, totals = [], [], []
    for q0, q1, k0, k1 in zip([0, *q_ends[:-1]], q_ends, [0, *kv_ends[:-1]], kv_ends):
        q = query[q0:q1].float().transpose(0, 1)
        k, v = (t[k0:k1].float().transpose(0, 1).repeat_interleave(group, 0) for t in (key, value))
        scores = q @ k.transpose(1, 2) * scale
        if sparse_mode == 3:
            allowed = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool).tril((k1 - k0) - (q1 - q0))
            scores = scores.masked_fill(~allowed, float("-inf"))
        peak = scores.amax(-1, keepdim=True)
        weights = (scores - peak).exp()
        total = weights.sum(-1, keepdim=True)
        outs.append(((weights / total) @ v).transpose(0, 1))
        peaks.append(peak.transpose(0, 1).expand(-1, -1, 8))
        totals.append(total.transpose(0, 1).expand(-1, -1, 8))
    out = torch.cat(outs).to(query.dtype)
    return out, torch.cat(peaks).contiguous(), torch.cat(totals).contiguous(), torch.empty(0, dtype=query.dtype), 0, 0, 0


def _token_permute(tokens: torch.Tensor, indices: torch.Tensor, num_out_tokens: int | None = None,
                   padded_mode: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The documented formula (``MoeTokenPermuteReplay.reference``): pairs sorted by expert."""
    k = indices.shape[1] if indices.dim() == 2 else 1
    rows = num_out_tokens or tokens.shape[0] * k
    return MoeTokenPermuteReplay().reference(tokens, indices, k, rows)


def _token_unpermute(permuted_tokens: torch.Tensor, sorted_indices: torch.Tensor, probs: torch.Tensor | None = None,
                     padded_mode: bool = False, restore_shape: Any = None) -> torch.Tensor:
    """The documented formula (``MoeTokenUnpermuteReplay.reference``): ``out[t] = sum_j
    permuted[sorted_indices[t*k+j]] * probs[t,j]``."""
    return MoeTokenUnpermuteReplay().reference(permuted_tokens, sorted_indices, probs).to(permuted_tokens.dtype)


@functools.cache
def standin() -> torch.library.Library | None:
    """The library holding the operators (None: a real torch_npu defined them already)."""
    if hasattr(torch.ops.npu, "npu_grouped_matmul"):
        return None
    # kept for the process: torch allows one definition of an operator (torch.library is untyped)
    library = torch.library.Library("npu", "DEF")  # type: ignore[no-untyped-call]
    for operator in OPERATORS:
        library.define(schema_text(operator))  # type: ignore[no-untyped-call]
    kernels = (_grouped_matmul, _grouped_matmul, _swiglu_quant, _fusion_attention, _token_permute, _token_unpermute)
    for operator, kernel in zip(OPERATORS, kernels, strict=True):
        library.impl(operator, kernel, "CPU")  # type: ignore[no-untyped-call]
    for name in ("npu_grouped_matmul", "npu_grouped_matmul_swiglu_quant", "npu_fusion_attention",
                 "npu_moe_token_permute", "npu_moe_token_unpermute"):
        setattr(TORCH_NPU, name, getattr(torch.ops.npu, name))  # as torch_npu's __init__ binds them
    return library
