"""MoE routing kernels: ``MoeTokenPermute``, ``MoeTokenUnpermute`` and ``MoeGatingTopK``.

No public row of these types exists; the layouts are the ones Ascend's replay scripts for the same
database parse (msmodeling ``tools/perf_data_collection/op_replay/MoeTokenPermute_run.py``,
``MoeTokenUnpermute_run.py``, ``MoeGatingTopK_run.py``) and the aclnn documentation of each kernel
(CANN ops-transformer ``moe/moe_token_permute``, ``moe_token_unpermute``, ``moe_gating_top_k``).

``MoeTokenPermute``: ``tokens [T,H]; indices [T,k] (or [T]: k=1) INT32/INT64`` ->
``permuted [R,H]; sorted_indices [T*k] INT32``.  ``first = stable_argsort(flatten(indices))``,
``sorted_indices = argsort(first)`` (the row each (token, slot) pair lands in) and
``permuted[sorted_indices[i]] = tokens[i // k]``, keeping the first ``R`` rows (``R < T*k`` is
``num_out_tokens=R``).  API ``torch_npu.npu_moe_token_permute(tokens, indices[, num_out_tokens])``.

``MoeTokenUnpermute``: ``permuted [T*k,H]; sorted_indices [T*k] INT32; probs [T,k]`` (optional;
without it k=1) -> ``out [T,H]``, ``out[t] = sum_j permuted[sorted_indices[t*k+j]] * probs[t,j]``.
API ``torch_npu.npu_moe_token_unpermute(permuted, sorted_indices, probs)``.

``MoeGatingTopK``: ``x [T,E]; bias [E]`` (optional, x's dtype) -> ``y [T,k]`` (x's dtype),
``expert_idx [T,k] INT32``, ``norm_out [T,E] FLOAT`` (recorded when ``out_flag``).
``norm = softmax(x)`` (norm_type 0) or ``sigmoid(x)`` (1); experts are chosen on ``norm + bias``
(after masking all but the ``k_group`` best of ``group_count`` expert groups, scored by their max
or top-2 sum); ``y = norm[idx]``, divided by ``sum + eps`` for sigmoid or ``renorm=1``, times
``routed_scaling_factor``.  API ``torch_npu.npu_moe_gating_top_k``.  The row records no
attribute: ``k`` comes from the outputs, the group and scaling attributes keep the API's defaults
(one group, ``renorm=0``, factor 1.0, eps 1e-20), ``norm_type`` is 1 (sigmoid) when the row has
a bias (the DeepSeek-style router vllm-ascend and msmodeling run) and 0 (softmax) otherwise.

Inputs are valid as the kernels see them in a model: indices are distinct top-k expert ids per
token (of ``ROUTED_EXPERTS`` experts: the rows do not record the expert count), sorted indices
are what the permute kernel returns for such ids.  Where an input-value capture recorded the
model's routing (``perf_plugin.capture``: ``npu_moe_token_permute``'s ``indices``,
``npu_moe_token_unpermute``'s ``sorted_indices``, up to ``MAX_VALUES`` elements), the row's
``Input Values`` hold them in slot 1 and the replay uses them instead: how many rows each
expert's run gets and which tokens are gathered are the model's (``Input Values Source``
``measured``; without them, ``default: top-k ids drawn uniformly ...``).  Gating logits are
permutations of distinct values and the bias holds distinct values, so no two experts tie (the
kernels' tie order is not documented).  Portable paths: ``argsort``/``index_select`` for the permutations (verified exactly),
``index_select`` + ``bmm`` for the weighted unpermute, ``softmax``/``sigmoid`` + ``topk`` in float32
for the gating (references in float64; expert ids exact).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from perf_plugin.database.schema import INPUT_VALUES
from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.tensors import FLOATING, KernelRow, TensorSpec, shape_text
from perf_plugin.replay.value_draws import recorded_values

if TYPE_CHECKING:
    import torch

INDEX_DTYPES = frozenset({"INT32", "INT64"})
ROUTED_EXPERTS = 256  # DeepSeek-V3's routed expert count: the stand-in expert range for ids
# What a permutation row without recorded routing replays (``Input Values Source``).
UNIFORM_ROUTING = f"top-k ids drawn uniformly over {ROUTED_EXPERTS} experts"
MAX_GATING_EXPERTS = 2048  # aclnnMoeGatingTopK: x's last dim must not exceed 2048


# ----------------------------------------------------------------------------- shared helpers
def draw_top_k_ids(tokens: int, k: int, experts: int, device: "torch.device", generator: "torch.Generator | None") -> "torch.Tensor":
    """Per token, ``k`` distinct expert ids in ``[0, experts)`` (int64 ``[tokens, k]``)."""
    import torch

    keys = torch.rand((tokens, experts), generator=generator, device=device)
    return keys.argsort(dim=1)[:, :k]


def recorded_ids(row: KernelRow, slot: int, count: int) -> tuple[int, ...] | None:
    """The expert ids (or sorted indices) the model gave slot ``slot``, from the row's ``Input
    Values`` (which hold no negative value); None where it records none.  Raises CaseBuildError
    for a cell that holds another number of values than the slot's ``count`` elements."""
    values = recorded_values(row, slot)
    if values is not None and len(values) != count:
        raise CaseBuildError(f"'{INPUT_VALUES}' slot {slot} holds {len(values)} values, not {count}: not the "
                             f"model's values of that slot")
    return values


def permute_order(flat_ids: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor"]:
    """(``first``, ``dest``): pairs sorted by expert (ties in pair order), and each pair's row."""
    import torch

    first = torch.argsort(flat_ids, stable=True)
    dest = torch.empty_like(first).scatter_(0, first, torch.arange(first.numel(), device=first.device))
    return first, dest


def _float_spec(row: KernelRow, spec: TensorSpec, name: str) -> None:
    if spec.dtype not in FLOATING:
        raise CaseBuildError(f"{row.kernel_type} {name} dtype {spec.dtype} is not a floating type")


def _cpu(t: "torch.Tensor") -> "torch.Tensor":
    return t.detach().to("cpu")


# ----------------------------------------------------------------------------- MoeTokenPermute
class MoeTokenPermuteReplay(OpReplay):
    kernel_types = ("MoeTokenPermute",)
    # op_mapping names no API for this type; msmodeling replays it with this one (aclnnMoeTokenPermute)
    npu_api = "torch_npu.npu_moe_token_permute"
    # the routing (each token's top-k expert ids) a capture recorded (perf_plugin.capture)
    data_inputs = MappingProxyType({1: UNIFORM_ROUTING})

    def shape(self, row: KernelRow) -> tuple[int, int, int, int]:
        """(tokens T, hidden H, top-k k, kept rows R)."""
        inputs, outputs = row.present_inputs, row.present_outputs
        if len(inputs) != 2 or len(outputs) != 2:
            raise CaseBuildError(f"{row.kernel_type} needs tokens;indices -> permuted;sorted_indices, got "
                                 f"{len(inputs)} input(s) and {len(outputs)} output(s)")
        tokens, indices = inputs
        permuted, order = outputs
        assert tokens.shape is not None and indices.shape is not None
        _float_spec(row, tokens, "tokens")
        if len(tokens.shape) != 2 or len(indices.shape) not in (1, 2) or indices.shape[0] != tokens.shape[0]:
            raise CaseBuildError(f"{row.kernel_type} needs tokens [T,H] and indices [T,k] or [T]; got "
                                 f"{shape_text(tokens)} and {shape_text(indices)}")
        if indices.dtype not in INDEX_DTYPES:
            raise CaseBuildError(f"{row.kernel_type} indices dtype {indices.dtype} is not INT32/INT64")
        (t, h), k = tokens.shape, indices.shape[1] if len(indices.shape) == 2 else 1
        rows = permuted.shape[0] if permuted.shape else 0
        if permuted.shape != (rows, h) or not 0 < rows <= t * k or permuted.dtype != tokens.dtype:
            raise CaseBuildError(f"{row.kernel_type} permuted output {shape_text(permuted)} {permuted.dtype} should be "
                                 f"[R,{h}] {tokens.dtype} with 0 < R <= T*k = {t * k}")
        if order.shape != (t * k,) or order.dtype != "INT32":
            raise CaseBuildError(f"{row.kernel_type} sorted_indices {shape_text(order)} {order.dtype} should be "
                                 f"[{t * k}] INT32")
        return t, h, k, rows

    def check(self, row: KernelRow) -> None:
        self.shape(row)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        import torch

        t, _, k, rows = self.shape(row)
        tokens, index_spec = row.present_inputs
        recorded = recorded_ids(row, 1, t * k)
        ids = (torch.tensor(recorded, device=device) if recorded is not None
               else draw_top_k_ids(t, k, max(k, ROUTED_EXPERTS), device, generator))
        indices = ids.to(index_spec.torch_dtype()).reshape(index_spec.shape or ())
        return self.random(tokens, device, generator), indices, k, rows

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        tokens, indices, k, rows = args
        dropped = {"num_out_tokens": rows} if rows < tokens.shape[0] * k else {}
        return self.api_call(tokens, indices, select=(0, 1), **dropped)

    def tolerance(self, output: TensorSpec) -> float:
        return 0.0  # data movement and indices: exact

    def run(self, tokens: "torch.Tensor", indices: "torch.Tensor", k: int, rows: int) -> tuple["torch.Tensor", "torch.Tensor"]:
        import torch

        first, dest = permute_order(indices.reshape(-1))
        return tokens.index_select(0, torch.div(first[:rows], k, rounding_mode="floor")), dest.int()

    def reference(self, tokens: "torch.Tensor", indices: "torch.Tensor", k: int, rows: int) -> tuple["torch.Tensor", "torch.Tensor"]:
        """The documented formula: a sort on unique (expert, pair) keys, its inverse by a second
        argsort, and the tokens scattered to their rows."""
        import torch

        flat = _cpu(indices).reshape(-1).long()
        pairs = flat.numel()
        first = torch.argsort(flat * pairs + torch.arange(pairs))
        dest = torch.argsort(first)
        src = _cpu(tokens)
        out = src.new_empty((pairs, src.shape[1]))
        out[dest] = src[torch.arange(pairs) // k]
        return out[:rows], dest.int()


# ----------------------------------------------------------------------------- MoeTokenUnpermute
class MoeTokenUnpermuteReplay(OpReplay):
    kernel_types = ("MoeTokenUnpermute",)
    # op_mapping names no API for this type; msmodeling replays it with this one (aclnnMoeTokenUnpermute)
    npu_api = "torch_npu.npu_moe_token_unpermute"
    # the row each (token, slot) pair was permuted to, as the model's permutation returned it
    data_inputs = MappingProxyType({1: UNIFORM_ROUTING})

    def shape(self, row: KernelRow) -> tuple[int, int, int, TensorSpec | None]:
        """(tokens T, hidden H, top-k k, probs spec or None)."""
        inputs = row.inputs
        if len(inputs) < 2 or not inputs[0].present or not inputs[1].present or any(s.present for s in inputs[3:]):
            raise CaseBuildError(f"{row.kernel_type} needs permuted_tokens;sorted_indices[;probs], got "
                                 + ";".join(shape_text(s) for s in inputs))
        permuted, order = inputs[0], inputs[1]
        probs = inputs[2] if len(inputs) > 2 and inputs[2].present else None
        assert permuted.shape is not None
        _float_spec(row, permuted, "permuted_tokens")
        if len(permuted.shape) != 2 or order.shape != (permuted.shape[0],) or order.dtype != "INT32":
            raise CaseBuildError(f"{row.kernel_type} needs permuted_tokens [N,H] and sorted_indices [N] INT32; got "
                                 f"{shape_text(permuted)} and {shape_text(order)} {order.dtype}")
        n, h = permuted.shape
        t, k = n, 1
        if probs is not None:
            _float_spec(row, probs, "probs")
            if probs.shape is None or len(probs.shape) != 2 or probs.shape[0] * probs.shape[1] != n:
                raise CaseBuildError(f"{row.kernel_type} probs {shape_text(probs)} should be [T,k] with T*k = {n}")
            t, k = probs.shape
        outputs = row.present_outputs
        if len(outputs) != 1 or outputs[0].shape != (t, h) or outputs[0].dtype != permuted.dtype:
            raise CaseBuildError(f"{row.kernel_type} output should be [{t},{h}] {permuted.dtype}, got "
                                 + "; ".join(f"{shape_text(s)} {s.dtype}" for s in outputs))
        return t, h, k, probs

    def check(self, row: KernelRow) -> None:
        self.shape(row)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        import torch

        t, _, k, probs_spec = self.shape(row)
        recorded = recorded_ids(row, 1, t * k)
        if recorded is not None:
            if sorted(recorded) != list(range(t * k)):
                raise CaseBuildError(f"'{INPUT_VALUES}' slot 1 is not a permutation of the {t * k} rows")
            dest = torch.tensor(recorded, device=device)
        else:
            ids = draw_top_k_ids(t, k, max(k, ROUTED_EXPERTS), device, generator)
            _, dest = permute_order(ids.reshape(-1))  # what MoeTokenPermute hands to this kernel
        permuted = self.random(row.inputs[0], device, generator)
        probs = None if probs_spec is None else self.random(probs_spec, device, generator).abs_()
        return permuted, dest.int(), probs

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        permuted, order, probs = args
        return self.api_call(permuted, order, probs)

    def run(self, permuted: "torch.Tensor", order: "torch.Tensor", probs: "torch.Tensor | None") -> "torch.Tensor":
        import torch

        gathered = permuted.index_select(0, order)
        if probs is None:
            return gathered
        t, k = probs.shape
        # one batched [1,k] x [k,H] product per token: the weighted sum in a single kernel
        weights = probs.to(permuted.dtype).unsqueeze(1)
        return torch.bmm(weights, gathered.view(t, k, -1)).squeeze(1)

    def reference(self, permuted: "torch.Tensor", order: "torch.Tensor", probs: "torch.Tensor | None") -> "torch.Tensor":
        rows = _cpu(permuted).double()[_cpu(order).long()]
        if probs is None:
            return rows
        p = _cpu(probs).double()
        return (rows.view(p.shape[0], p.shape[1], -1) * p.unsqueeze(-1)).sum(dim=1)


# ----------------------------------------------------------------------------- MoeGatingTopK
@dataclass(frozen=True)
class GatingConfig:
    """The attributes of ``npu_moe_gating_top_k`` (the row records none of them)."""

    k: int
    norm_type: int = 0  # 0 softmax, 1 sigmoid
    k_group: int = 1
    group_count: int = 1
    group_select_mode: int = 0  # 0: group max, 1: sum of the group's top 2
    renorm: int = 0
    out_flag: bool = True
    routed_scaling_factor: float = 1.0
    eps: float = 1e-20


def distinct_values(count: int, spec: TensorSpec, device: "torch.device", generator: "torch.Generator | None") -> "torch.Tensor":
    """``count`` distinct non-zero values of ``spec``'s dtype, in random order."""
    import torch

    dtype = spec.torch_dtype()
    if device.type == "meta":
        return torch.empty(count, dtype=dtype, device=device)
    drawn = torch.randn(8 * count + 64, generator=generator, device=device).mul_(2).to(dtype).sort().values
    fresh = torch.ones_like(drawn, dtype=torch.bool)
    fresh[1:] = drawn[1:] != drawn[:-1]  # first of every run of equal values
    pool = drawn[fresh & (drawn != 0)]
    if pool.numel() < count:
        raise CaseBuildError(f"cannot draw {count} distinct {spec.dtype} values")
    return pool[torch.randperm(pool.numel(), generator=generator, device=device)[:count]]


class MoeGatingTopKReplay(OpReplay):
    kernel_types = ("MoeGatingTopK",)
    npu_api = "torch_npu.npu_moe_gating_top_k"

    def config(self, row: KernelRow) -> GatingConfig:
        inputs, outputs = row.inputs, row.present_outputs
        if not inputs or not inputs[0].present or any(s.present for s in inputs[2:]):
            raise CaseBuildError(f"{row.kernel_type} needs x[;bias], got " + ";".join(shape_text(s) for s in inputs))
        x = inputs[0]
        bias = inputs[1] if len(inputs) > 1 and inputs[1].present else None
        assert x.shape is not None
        _float_spec(row, x, "x")
        if len(x.shape) != 2 or not 0 < x.shape[1] <= MAX_GATING_EXPERTS:
            raise CaseBuildError(f"{row.kernel_type} x {shape_text(x)} should be [T,E] with E <= {MAX_GATING_EXPERTS}")
        t, e = x.shape
        if bias is not None and (bias.shape != (e,) or bias.dtype != x.dtype):
            raise CaseBuildError(f"{row.kernel_type} bias {shape_text(bias)} {bias.dtype} should be [{e}] {x.dtype}")
        if len(outputs) not in (2, 3) or outputs[0].shape is None or len(outputs[0].shape) != 2:
            raise CaseBuildError(f"{row.kernel_type} needs outputs y;expert_idx[;norm_out], got {len(outputs)}")
        k = outputs[0].shape[1]
        expected = [((t, k), x.dtype), ((t, k), "INT32"), ((t, e), "FLOAT")][: len(outputs)]
        if [(s.shape, s.dtype) for s in outputs] != expected or not 1 <= k <= e:
            raise CaseBuildError(f"{row.kernel_type} outputs should be y [{t},k] {x.dtype}, expert_idx [{t},k] INT32"
                                 f"[, norm_out [{t},{e}] FLOAT] with 1 <= k <= {e}; got "
                                 + "; ".join(f"{shape_text(s)} {s.dtype}" for s in outputs))
        return GatingConfig(k=k, norm_type=1 if bias is not None else 0, out_flag=len(outputs) == 3)

    def check(self, row: KernelRow) -> None:
        self.config(row)

    def make_inputs(self, row: KernelRow, device: "torch.device", generator: "torch.Generator") -> tuple[Any, ...]:
        import torch

        cfg = self.config(row)
        x_spec = row.inputs[0]
        assert x_spec.shape is not None
        t, e = x_spec.shape
        keys = torch.rand((t, e), generator=generator, device=device)
        x = distinct_values(e, x_spec, device, generator)[keys.argsort(dim=1)]  # a permutation per token
        bias = distinct_values(e, row.inputs[1], device, generator) if cfg.norm_type == 1 else None
        return x, bias, cfg

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        x, bias, cfg = args
        return self.api_call(
            x, cfg.k, bias=bias, k_group=cfg.k_group, group_count=cfg.group_count,
            group_select_mode=cfg.group_select_mode, renorm=cfg.renorm, norm_type=cfg.norm_type,
            out_flag=cfg.out_flag, routed_scaling_factor=cfg.routed_scaling_factor, eps=cfg.eps,
            select=(0, 1, 2) if cfg.out_flag else (0, 1),
        )  # fmt: skip

    def run(self, x: "torch.Tensor", bias: "torch.Tensor | None", cfg: GatingConfig) -> tuple["torch.Tensor", ...]:
        import torch

        xf = x.float()  # normOut is FLOAT whatever x's dtype
        norm = torch.sigmoid(xf) if cfg.norm_type == 1 else torch.softmax(xf, dim=-1)
        value = norm if bias is None else norm + bias.float()
        if cfg.group_count > 1:
            grouped = value.view(value.shape[0], cfg.group_count, -1)
            score = grouped.amax(-1) if cfg.group_select_mode == 0 else grouped.topk(2, dim=-1).values.sum(-1)
            keep = torch.zeros_like(score, dtype=torch.bool).scatter_(1, score.topk(cfg.k_group, dim=-1).indices, True)
            value = grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view_as(norm)
        idx = value.topk(cfg.k, dim=-1).indices
        y = norm.gather(1, idx)
        if cfg.norm_type == 1 or cfg.renorm == 1:
            y = y / (y.sum(-1, keepdim=True) + cfg.eps)
        y = (y * cfg.routed_scaling_factor).to(x.dtype)
        return (y, idx.int(), norm) if cfg.out_flag else (y, idx.int())

    def reference(self, x: "torch.Tensor", bias: "torch.Tensor | None", cfg: GatingConfig) -> tuple["torch.Tensor", ...]:
        """Float64; every selection a stable descending sort, so ties go to the lower index."""
        import torch

        x64 = _cpu(x).double()
        norm = torch.sigmoid(x64) if cfg.norm_type == 1 else torch.softmax(x64, dim=-1)
        value = norm if bias is None else norm + _cpu(bias).double()
        tokens, experts = value.shape
        grouped = value.view(tokens, cfg.group_count, experts // cfg.group_count)
        top = grouped.sort(dim=-1, descending=True, stable=True).values
        score = top[..., 0] if cfg.group_select_mode == 0 else top[..., 0] + top[..., 1]
        chosen = score.sort(dim=-1, descending=True, stable=True).indices[:, : cfg.k_group]
        dropped = torch.ones_like(score, dtype=torch.bool).scatter_(1, chosen, False)
        masked = grouped.masked_fill(dropped.unsqueeze(-1), float("-inf")).view(tokens, experts)
        idx = masked.sort(dim=-1, descending=True, stable=True).indices[:, : cfg.k]
        y = norm.gather(1, idx)
        if cfg.norm_type == 1 or cfg.renorm == 1:
            y = y / (y.sum(-1, keepdim=True) + cfg.eps)
        y = y * cfg.routed_scaling_factor
        return (y, idx.int(), norm) if cfg.out_flag else (y, idx.int())
