"""The Ascend performance model's interpolation policy as an op_mapping.yaml declares it for a kernel
type (``policy_rules``), and what a row or a query is to it: its axes and its regime
(``coordinates``; ``policy.py`` interpolates between rows of one regime along the axes).

Each reading follows the reference (msmodeling's ``InterpolatingDataSource``; design documents
54917517350 and 57863448009, code 59095779982):

* ``matmul`` (MatMulV2/V3/MatMulCommon/MatMul, QuantBatchMatmulV3, the batched kernels): axes
  ``M, K, N`` from ``x [..., M, K]`` and ``w [..., K, N]`` or ``[..., N, K]`` (``gemm_of``; a
  FRACTAL_NZ slot restored to ND first; an explicit leading batch of 1 dropped for unbatched
  kernels); regime: input count, input dtypes, the batch dimensions.  The weight layout is only
  a detail and the formats a group (``Coordinates.formats``), as the reference pools them.
* ``generic_compute`` (every other compute kernel): one axis, ``axis_0`` (the first input's first
  dimension; regime: input count, dtypes, the rest of the first input and the other inputs whole)
  or, where ``generic_compute: {axis: output_numel}``, the output's element count (regime: input
  count, dtypes and the output's dimensions after the first; a rank >= 3 output loses a leading 1).
* ``elementwise`` (``query_mode: elementwise``): ``io_numel``, the elements read and written;
  regime: output rank, input count, output dtype, broadcast pattern of each input.
* ``attention`` (``attention_special`` and the ``axis_transform`` kernels): the call as the replay
  reads it (``_fia_plan``): ``seq`` the mean KV length, ``batch``, ``heads``, ``head_dim``, and
  ``q_tokens`` (never interpolated; equal up to block padding); regime: q/k/v dtypes, layouts,
  mask (sparse mode), KV heads, paging and block size, rope dim, LSE output.

Leading batch dimensions of 1 and empty slots (optional inputs, 0-d scalars) are dropped as the
reference's shape parser drops them; ``tc_input_count`` keeps the first N present inputs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from perf_plugin.database.errors import DatabaseError
from perf_plugin.database.shapes import Shape
from perf_plugin.lookup.gemm import gemm_of
from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels._fia_plan import fia_plan
from perf_plugin.replay.kernels.mla_prefill import AVG_COLUMNS, KV_VALUES
from perf_plugin.replay.tensors import kernel_row_from_cells

MATMUL, GENERIC, ELEMENTWISE, ATTENTION = "matmul", "generic_compute", "elementwise", "attention"
# The reference's matmul kernels (``_MATMUL_KERNELS`` plus BatchMatMulNd) and the batched ones
# whose leading dimensions are a regime rather than an explicit batch of 1 to drop.
MATMUL_TYPES = frozenset({"MatMulV2", "MatMulV3", "MatMulCommon", "MatMul", "QuantBatchMatmulV3",
                          "BatchMatMulV2", "BatchMatMulNd", "TransposeBatchMatMul"})
BATCHED_MATMUL_TYPES = frozenset({"BatchMatMulV2", "BatchMatMulNd", "TransposeBatchMatMul", "QuantBatchMatmulV3"})
ATTENTION_TYPES = frozenset({"FusedInferAttentionScore"})  # read as attention without an op_mapping.yaml
_BLOCKS = (16, 32, 64)  # the tile sizes by which the reference lets q_tokens differ (block padding)


@dataclass(frozen=True)
class Rule:
    """One way the policy reads a kernel type (from one operator mapping, or the defaults)."""

    kind: str  # matmul | generic_compute | elementwise | attention | unsupported
    source: str  # where the rule comes from, for the answer's reason
    max_dim: int = 3
    declared: str = ""  # the override that shaped it ("max_interpolation_dim 1"), for the method
    axis: str = "axis_0"  # generic_compute: axis_0 | output_numel
    transform: str = "linear"  # attention: sqrt_seq | linear
    input_count: int | None = None  # the mapping's tc_input_count
    why_not: str = ""  # unsupported: why this kind is not reproduced


@dataclass(frozen=True)
class Sample:
    """The cells a reading needs, from a row or from a query."""

    kernel_type: str
    shapes: tuple[Shape | None, ...]
    dtypes: tuple[str, ...]
    formats: tuple[str, ...]
    outputs: tuple[Shape | None, ...]
    output_dtypes: tuple[str, ...]
    cells: Mapping[str, str] = field(default_factory=dict)  # every cell (attention reads them all)


@dataclass(frozen=True)
class Coordinates:
    axes: dict[str, float]
    regime: tuple[object, ...]
    label: str  # the regime in words, for reasons
    formats: tuple[str, ...] = ()  # matmul: the format group ("" for a query that names none)
    layout: str = ""  # matmul: KN / NK (a detail, not a regime)


def coordinates(rule: Rule, sample: Sample) -> Coordinates | str:
    """The axes and regime of ``sample`` under ``rule``, or why it has none."""
    if rule.kind == MATMUL:
        return _matmul(rule, sample)
    if rule.kind == GENERIC:
        return _generic(rule, sample)
    if rule.kind == ELEMENTWISE:
        return _elementwise(sample)
    if rule.kind == ATTENTION:
        return _attention(sample)
    return rule.why_not


def q_tokens_match(a: float, b: float) -> bool:
    """The reference's tolerance on an attention call's query tokens: equal, or one the other padded
    up to a multiple of 16, 32 or 64."""
    low, high = sorted((int(a), int(b)))
    return low == high or any(high == -(-low // size) * size for size in _BLOCKS)


def _present(sample: Sample, count: int | None) -> list[tuple[Shape, str, str]]:
    slots = [(shape, sample.dtypes[i] if i < len(sample.dtypes) else "",
              (sample.formats[i] if i < len(sample.formats) else "") or "ND")
             for i, shape in enumerate(sample.shapes) if shape is not None]
    return slots[:count] if count is not None else slots


def _nd(shape: Shape, fmt: str) -> Shape:
    """A FRACTAL_NZ storage shape ``[..., H, W, h, w]`` as its ND shape ``[..., H*w, W*h]``."""
    if fmt != "FRACTAL_NZ" or len(shape) < 4:
        return shape
    *batch, high, wide, block_h, block_w = shape
    return (*batch, high * block_w, wide * block_h)


def _unbatched(shape: Shape) -> Shape:
    return shape[1:] if len(shape) > 1 and shape[0] == 1 else shape


def _matmul_shape(shape: Shape, batched: bool) -> Shape:
    """An unbatched kernel's explicit leading batch of 1 goes (a 2-d ``[1, K]`` stays: M is 1); a
    batched kernel's leading dimensions stay, as its regime."""
    return shape[1:] if not batched and len(shape) >= 3 and shape[0] == 1 else shape


def _matmul(rule: Rule, sample: Sample) -> Coordinates | str:
    present = _present(sample, rule.input_count)
    if len(present) < 2:
        return "fewer than two inputs: not a GEMM's x and weight"
    batched = sample.kernel_type in BATCHED_MATMUL_TYPES
    lhs, rhs = (_matmul_shape(_nd(s, f), batched) for s, _, f in present[:2])
    gemm = gemm_of([lhs[-2:], rhs[-2:]]) if len(lhs) >= 2 and len(rhs) >= 2 else None
    if gemm is None:
        return "the inputs are not a GEMM's x [..., M, K] and weight [..., K, N] / [..., N, K]"
    dtypes = tuple(d for _, d, _ in present)
    batch = (lhs[:-2], rhs[:-2])
    label = f"{len(present)} inputs {';'.join(dtypes)}" + (f", batch dims {batch}" if any(batch) else "")
    return Coordinates({"M": float(gemm.m), "K": float(gemm.k), "N": float(gemm.n)},
                       (MATMUL, len(present), dtypes, batch), label,
                       tuple(f for _, _, f in present), gemm.layout)


def _generic(rule: Rule, sample: Sample) -> Coordinates | str:
    present = _present(sample, rule.input_count)
    if not present:
        return "no input shapes"
    logical = [_unbatched(_nd(s, f)) for s, _, f in present]
    dtypes = tuple(d for _, d, _ in present)
    if rule.axis == "output_numel":
        outputs = [s for s in sample.outputs if s is not None]
        if len(outputs) != 1:
            return "output_numel reads the one output shape; " + \
                (f"this has {len(outputs)}" if outputs else "none is given")
        out = outputs[0][1:] if len(outputs[0]) >= 3 and outputs[0][0] == 1 else outputs[0]
        return Coordinates({"output_numel": float(math.prod(out))}, (GENERIC, len(present), dtypes, out[1:]),
                           f"{len(present)} inputs {';'.join(dtypes)}, output dims after the first {out[1:]}")
    if not logical[0]:
        return "the first input is 0-d: no axis_0"
    signature = (logical[0][1:], tuple(logical[1:]))
    return Coordinates({"axis_0": float(logical[0][0])}, (GENERIC, len(present), dtypes, signature),
                       f"{len(present)} inputs {';'.join(dtypes)}, first input's other dims {logical[0][1:]}, "
                       f"other inputs {tuple(logical[1:])}")


def _elementwise(sample: Sample) -> Coordinates | str:
    outputs = [s for s in sample.outputs if s is not None]
    if not outputs:
        return "the elementwise policy reads the output shape; none is given"
    out = _unbatched(outputs[0])
    inputs = [_unbatched(s) for s in sample.shapes if s is not None]
    dtypes = {d for s, d in zip(sample.shapes, sample.dtypes) if s is not None}
    # A query names no output dtype where its inputs share one: the result of same-dtype inputs.
    out_dtype = sample.output_dtypes[0] if sample.output_dtypes and sample.output_dtypes[0] else \
        next(iter(dtypes)) if len(dtypes) == 1 else ""
    if not out_dtype:
        return "the elementwise policy matches the output dtype, which is not given (inputs differ)"
    pattern = tuple((len(s), _broadcast(s, out)) for s in inputs)
    numel = sum(math.prod(s) for s in inputs) + math.prod(out)
    return Coordinates({"io_numel": float(numel)}, (ELEMENTWISE, len(out), len(inputs), out_dtype, pattern),
                       f"output rank {len(out)} {out_dtype}, {len(inputs)} inputs broadcast as {pattern}")


def _broadcast(shape: Shape, out: Shape) -> tuple[str, ...]:
    padded: Sequence[int | None] = [None] * max(0, len(out) - len(shape)) + list(shape[-len(out):] if out else [])
    return tuple("missing" if dim is None else "same" if dim == full else
                 "broadcast" if dim == 1 and full != 1 else "other" for dim, full in zip(padded, out))


def _has_kv_lengths(cells: Mapping[str, str]) -> bool:
    """Whether the cells give the KV lengths (a positive mean, or the per-request values); the
    replay would otherwise assume one block per request, which the policy must not interpolate on."""
    if cells.get(KV_VALUES, "").strip().strip('"'):
        return True
    for column in AVG_COLUMNS:
        try:
            if float(cells.get(column, "").strip() or "nan") > 0:
                return True
        except ValueError:
            continue
    return False


def _attention(sample: Sample) -> Coordinates | str:
    try:
        plan = fia_plan(kernel_row_from_cells(sample.kernel_type, sample.cells))
    except (CaseBuildError, DatabaseError, ValueError, IndexError) as exc:
        return f"its slots do not read as an attention call ({exc})"
    if plan.block_size and not _has_kv_lengths(sample.cells):
        # Paged: the shapes hold the cache's capacity, not the KV lengths the call attends to.
        return f"a paged call's KV length (seq) is not in its shapes; give {AVG_COLUMNS[0]} or {KV_VALUES}"
    dtypes = tuple(d for s, d in zip(sample.shapes, sample.dtypes) if s is not None)[:3]
    axes = {"seq": sum(plan.kv_lens) / plan.batch, "batch": float(plan.batch), "heads": float(plan.heads),
            "head_dim": float(plan.head_dim), "q_tokens": float(sum(plan.q_lens))}
    regime = (ATTENTION, dtypes, plan.api_layout, plan.sparse_mode, plan.kv_heads, plan.block_size,
              plan.cache_bnsd, plan.rope_dim, plan.with_lse)
    label = (f"{';'.join(dtypes)} {plan.api_layout}, sparse mode {plan.sparse_mode}, {plan.kv_heads} KV heads, "
             f"block size {plan.block_size}, rope dim {plan.rope_dim}")
    return Coordinates(axes, regime, label)


# ------------------------------------------------------------------ what the op_mapping.yaml declares
def policy_rules(kernel_type: str, mapping_file: Path) -> list[Rule] | str:
    """How the policy reads ``kernel_type``: one rule per distinct way the operator mappings that
    name it (primary or alternate) read it, in file order; or why it declares no interpolation.

    A kernel no mapping names is interpolated only where ``kernel_overrides`` names it (the
    reference reaches such kernels through composite operators alone: the conservative reading).
    Without the file, the built-in defaults: MatMul family 1-3-D in M, K, N; FusedInferAttentionScore
    in raw seq; every other kernel ``axis_0``.
    """
    if not mapping_file.is_file():
        return [_builtin(kernel_type, f"built-in defaults (no {mapping_file.name} in {mapping_file.parent})")]
    stat = mapping_file.stat()
    document = _document(mapping_file.resolve(), stat.st_mtime_ns, stat.st_size)
    policy = document.get("interpolation_policy")
    overrides = policy.get("kernel_overrides") if isinstance(policy, dict) else None
    overrides = overrides if isinstance(overrides, dict) else {}
    mappings = document.get("operator_mappings")
    rules: list[Rule] = []
    for name, mapping in (mappings.items() if isinstance(mappings, dict) else ()):
        if not isinstance(mapping, dict) or mapping.get("category") == "communication" or \
                any(mapping.get(flag) for flag in ("zero_cost", "accepted_miss", "composite")):
            continue  # the reference never interpolates these (owned by the base lookup or accounted as 0)
        if kernel_type in [mapping.get("kernel_type"), *(mapping.get("alternate_kernel_types") or [])]:
            rule = _rule(kernel_type, mapping, overrides, f"{mapping_file.name}: {name}")
            if all(replace(rule, source="") != replace(r, source="") for r in rules):
                rules.append(rule)
    if not rules and isinstance(overrides.get(kernel_type), dict):
        rules.append(_rule(kernel_type, {}, overrides, f"{mapping_file.name}: kernel_overrides.{kernel_type}"))
    return rules or (f"the policy declares no interpolation for {kernel_type}: no operator mapping of "
                     f"{mapping_file.name} names it and kernel_overrides does not")


@functools.lru_cache(maxsize=8)
def _document(path: Path, mtime_ns: int, size: int) -> dict[str, Any]:
    """The parsed file, once per version (a CSV of queries asks the same policy many times)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, yaml.YAMLError) as exc:
        raise DatabaseError(f"cannot read the interpolation policy: {exc}", path=path) from None
    return data if isinstance(data, dict) else {}


def _builtin(kernel_type: str, source: str) -> Rule:
    if kernel_type in MATMUL_TYPES:
        return Rule(MATMUL, source)
    if kernel_type in ATTENTION_TYPES:
        return Rule(ATTENTION, source)
    return Rule(GENERIC, source, 1)


def _rule(kernel_type: str, mapping: Mapping[str, Any], overrides: Mapping[str, Any], source: str) -> Rule:
    """The reference's dispatch of one mapping (elementwise, attention, moe_fused, compute_scale,
    the matmul kernels, generic compute), with the kernel's own override."""
    own = overrides.get(kernel_type)
    own = own if isinstance(own, dict) else {}
    count = mapping.get("tc_input_count")
    count = count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else None
    mode, dim = mapping.get("query_mode"), own.get("max_interpolation_dim")
    dim = dim if isinstance(dim, int) and not isinstance(dim, bool) and dim > 0 else None
    declared = f"max_interpolation_dim {dim}" if dim else ""
    if mode == "elementwise":
        return Rule(ELEMENTWISE, source, dim or 3, declared or "query_mode elementwise", input_count=count)
    transform = own.get("axis_transform", own.get("shape_transform"))
    if mode == "attention_special" or transform is not None:
        # the reference passes no max_interpolation_dim to its attention path: 1-3-D always
        return Rule(ATTENTION, source, 3, f"axis_transform {transform}" if transform else "",
                    transform="sqrt_seq" if transform in ("sqrt", "sqrt_seq") else "linear")
    if mode == "moe_fused":
        return Rule("unsupported", source, why_not="its moe_fused path (tokens, with the EP size and the seven "
                                                   "inputs' dtypes as regime) is not reproduced by policy mode")
    if mapping.get("compute_subcategory") == "compute_scale":
        return Rule("unsupported", source, why_not="its compute_scale path (M, K, with the scale outputs' mode "
                                                   "as regime) is not reproduced by policy mode")
    if kernel_type in MATMUL_TYPES:
        return Rule(MATMUL, source, dim or 3, declared, input_count=count)
    # the kernel's own generic_compute override first, then the mapping's primary kernel's
    primary = overrides.get(str(mapping.get("kernel_type")))
    generic = own.get("generic_compute") or (primary.get("generic_compute") if isinstance(primary, dict) else None)
    axis = "output_numel" if isinstance(generic, dict) and generic.get("axis") == "output_numel" else "axis_0"
    return Rule(GENERIC, source, 1, "generic_compute output_numel" if axis == "output_numel" else "",
                axis=axis, input_count=count)
