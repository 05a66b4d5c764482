"""Policy mode: the answer the Ascend performance model's interpolation policy would give from the
same database, to show beside this project's own (``api.lookup``).

The reference is msmodeling's ``InterpolatingDataSource`` (tensor_cast profiling database),
learnt from its design documents (Phase 1 RFC 54917517350, Phase 2 RFCs 54670681107 and
57863448009), its tests (54747573056, 59143393629) and its code (54971664474, 59095779982,
59596865515).  It reads ``interpolation_policy.kernel_overrides`` and ``operator_mappings`` of
the database's ``op_mapping.yaml`` (``policy_axes.policy_rules``), and answers:

1. exact first: the row ``api.matches`` picks, with the same duration column;
2. else, among the timed rows of the query's regime (``policy_axes``: kernel type, dtypes, and
   what else the kernel's reading fixes), along the reading's axis groups in the reference's fixed
   order, lowest dimension first (compute: M, K, N, then (M, K), (M, N), (K, N), then (M, K, N);
   attention: seq, batch, heads, head_dim alone, then pairs, then triples), up to the declared
   ``max_interpolation_dim`` (3 by default; attention always 3, as the reference passes none):
   the first group whose other axes equal the query's and whose rows surround it answers.  One
   axis: linear between the two adjacent measured points.  Two or three: linear in the Delaunay
   simplex that holds the query (scipy's ``LinearNDInterpolator``, what
   ``griddata(method="linear")`` builds), after the reference's checks (at least dim+1 distinct
   points, two values per axis, not all in a lower plane).  The latency is interpolated itself,
   not an efficiency;
3. no extrapolation: a query outside every such hull gets ``none``, the reason giving the ranges.

Details the reference fixes and this follows: rows at one coordinate merge to their *median*
(its code; the RFC says mean: the two agree for two rows); rows whose duration comes from the
CSV's preferred column and rows that fell back to another are never mixed; a matmul's rows group
by input formats, ND first; ``axis_transform: sqrt_seq`` interpolates in ``sqrt(seq)``.
Conservative readings where the reference is unclear or out of reach: a query's formats, where it
names them, restrict rows as exact lookup does; dtypes match exactly (the reference relaxes
BF16/FLOAT for MatMulV2); an attention call's seq and batch come from its slots and the
``avg_seq_len`` / ``Runtime ...`` cells (a query's ``attributes``), and a paged call without them
has no seq; moe_fused and compute_scale kernels get no answer.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from perf_plugin.database.schema import DURATION_PREFERENCE
from perf_plugin.database.shapes import Shape, format_shape_cell, split_slots
from perf_plugin.database.signature import normalise_dtype
from perf_plugin.lookup.answer import INTERPOLATED, NONE, Answer, Query
from perf_plugin.lookup.api import exact_step
from perf_plugin.lookup.policy_axes import (ATTENTION, MATMUL, Coordinates, Rule, Sample, coordinates,
                                            policy_rules, q_tokens_match)
from perf_plugin.lookup.rows import MeasuredRow

COMPUTE_GROUPS = (("M",), ("K",), ("N",), ("M", "K"), ("M", "N"), ("K", "N"), ("M", "K", "N"))
ATTENTION_GROUPS = tuple(group for size in (1, 2, 3)
                         for group in itertools.combinations(("seq", "batch", "heads", "head_dim"), size))


@dataclass(frozen=True)
class _Point:
    raw: Mapping[str, float]  # the axes as the row (or query) gives them
    at: Mapping[str, float]  # after the policy's axis transform
    latency: float
    lines: tuple[int, ...]


@dataclass(frozen=True)
class _Fit:
    value: float
    axes: tuple[str, ...]
    used: tuple[_Point, ...]  # the merged points the value comes from
    candidates: int


def lookup_by_policy(database: str | Path, query: Query, mapping_path: Path | None = None) -> Answer:
    """The duration of ``query`` as the Ascend performance model's interpolation policy gives it
    from the database directory ``database`` and its ``op_mapping.yaml`` (or ``mapping_path``)."""
    step = exact_step(database, query)
    if step.answer is not None:
        return step.answer
    path, rows, exact = step.path, step.rows, step.exact
    untimed = f"row {exact[0].line} has these inputs but no duration; " if exact else ""
    rules = policy_rules(query.kernel_type, mapping_path or Path(database) / "op_mapping.yaml")
    if isinstance(rules, str):
        return Answer(query, NONE, reason=untimed + rules)
    answers = []
    for rule in rules:
        answer = _by_rule(rule, query, rows, path.name)
        if answer.duration_us is not None:
            return answer
        answers.append(answer)
    more = f"; {len(rules) - 1} other mapping(s) of {query.kernel_type} answer neither" if len(rules) > 1 else ""
    return Answer(query, NONE, reason=untimed + answers[0].reason + more)


def _by_rule(rule: Rule, query: Query, rows: Sequence[MeasuredRow], csv_name: str) -> Answer:
    wanted = coordinates(rule, _query_sample(query))
    if isinstance(wanted, str):
        return Answer(query, NONE, reason=f"the query: {wanted}; policy from {rule.source}")
    target = _point(rule, wanted, 0.0, ())
    subsets = _subsets(rule, query, rows, wanted)
    if not subsets:
        return Answer(query, NONE, reason=f"no timed row of {csv_name} shares the query's regime ({wanted.label}); "
                                          f"policy from {rule.source}")
    groups = COMPUTE_GROUPS if rule.kind == MATMUL else ATTENTION_GROUPS if rule.kind == ATTENTION \
        else (tuple(wanted.axes),)
    misses: list[tuple[str, str, int]] = []
    for subset in subsets:
        found = _fit(target, subset, groups, rule.max_dim)
        if isinstance(found, _Fit):
            return _interpolated(query, rule, target, found)
        misses += [miss for miss in found if miss not in misses]
    axes = dict.fromkeys(a for g in groups if len(g) <= rule.max_dim and all(a in target.at for a in g) for a in g)
    return Answer(query, NONE, reason=f"{_why(misses, rule, list(axes))}; policy from {rule.source}")


def _subsets(rule: Rule, query: Query, rows: Sequence[MeasuredRow], wanted: Coordinates) -> list[list[_Point]]:
    """The query's regime's timed rows as the reference tries them: by input formats (a matmul's:
    all-ND first, then the larger group), each split into the rows timed by the CSV's preferred
    duration column and those that fell back to another, never mixed."""
    preferred = next((name for name in DURATION_PREFERENCE if rows and name in rows[0].cells), "")
    own_formats = _formats(query.input_shapes, query.input_formats)
    by_format: dict[tuple[str, ...], list[tuple[bool, _Point]]] = {}
    for row in rows:
        if row.duration_us is None or (query.input_formats and _formats(row.input_shapes, row.input_formats)
                                       != own_formats):
            continue  # a query's formats restrict rows as exact lookup does
        got = coordinates(rule, _row_sample(row, query.kernel_type))
        if isinstance(got, str) or got.regime != wanted.regime:
            continue
        key = tuple(f or "ND" for f in got.formats) if rule.kind == MATMUL else ()
        by_format.setdefault(key, []).append((row.column == preferred, _point(rule, got, row.duration_us, (row.line,))))
    order = sorted(by_format, key=lambda key: (any(f != "ND" for f in key), -len(by_format[key])))
    return [subset for key in order for first in (True, False)
            if (subset := [point for own, point in by_format[key] if own is first])]


def _formats(shapes: Sequence[Shape | None], formats: Sequence[str]) -> tuple[str, ...]:
    return tuple((formats[i] if i < len(formats) else "") or "ND" for i, s in enumerate(shapes) if s is not None)


def _point(rule: Rule, got: Coordinates, latency: float, lines: tuple[int, ...]) -> _Point:
    at = dict(got.axes)
    if rule.transform == "sqrt_seq" and "seq" in at:
        at["seq"] = math.sqrt(at["seq"])  # both rows and query, as the reference transforms both
    return _Point(got.axes, at, latency, lines)


def _query_sample(query: Query) -> Sample:
    outputs = query.output_dtypes or query.input_dtypes[:1]
    cells = {"Input Shapes": format_shape_cell(list(query.input_shapes)),
             "Input Data Types": ";".join(query.input_dtypes), "Input Formats": ";".join(query.input_formats),
             "Output Shapes": format_shape_cell(list(query.output_shapes)),
             "Output Data Types": ";".join(outputs), **dict(query.attributes)}
    return Sample(query.kernel_type, query.input_shapes, query.input_dtypes, query.input_formats,
                  query.output_shapes, query.output_dtypes, cells)


def _row_sample(row: MeasuredRow, kernel_type: str) -> Sample:
    outputs = tuple(normalise_dtype(t) for t in split_slots(row.cells.get("Output Data Types", "")))
    return Sample(kernel_type, row.input_shapes, row.input_dtypes, row.input_formats, row.output_shapes,
                  outputs, row.cells)


def _fit(target: _Point, points: Sequence[_Point], groups: Sequence[tuple[str, ...]],
         max_dim: int) -> _Fit | list[tuple[str, str, int]]:
    """The first axis group that answers, or each group's miss as (status, where, dimension)."""
    misses: list[tuple[str, str, int]] = []
    for axes in groups:
        if any(axis not in target.at for axis in axes):
            continue
        if len(axes) > max_dim:
            misses.append(("disabled", _names(axes), len(axes)))
            continue
        near = [p for p in points if all(_same(name, p.at.get(name), value) for name, value in target.at.items()
                                         if name not in axes) and all(a in p.at for a in axes)]
        if len(near) < 2:
            continue
        where = _where(axes, target, near)
        if any(not min(p.at[a] for p in near) <= target.at[a] <= max(p.at[a] for p in near) for a in axes):
            misses.append(("outside", where, len(axes)))
            continue
        merged = _merge(near, axes)
        found = _linear(merged, target, axes[0]) if len(axes) == 1 else _simplex(merged, target, axes)
        if isinstance(found, str):
            misses.append((found, where, len(axes)))
            continue
        return _Fit(found[0], axes, found[1], len(near))
    return misses


def _same(name: str, value: float | None, wanted: float) -> bool:
    if value is None:
        return False
    return q_tokens_match(value, wanted) if name == "q_tokens" else value == wanted


def _merge(points: Sequence[_Point], axes: tuple[str, ...]) -> list[_Point]:
    """One point per coordinate on ``axes``: the rows' median latency (the reference's code)."""
    groups: dict[tuple[float, ...], list[_Point]] = {}
    for point in points:
        groups.setdefault(tuple(point.at[a] for a in axes), []).append(point)
    return [_Point(group[0].raw, group[0].at, statistics.median(p.latency for p in group),
                   tuple(line for p in group for line in p.lines)) for group in groups.values()]


def _linear(points: Sequence[_Point], target: _Point, axis: str) -> tuple[float, tuple[_Point, ...]]:
    aim = target.at[axis]
    low = max((p for p in points if p.at[axis] <= aim), key=lambda p: p.at[axis])
    high = min((p for p in points if p.at[axis] >= aim), key=lambda p: p.at[axis])
    if low is high:
        return low.latency, (low,)
    share = (aim - low.at[axis]) / (high.at[axis] - low.at[axis])
    return low.latency + share * (high.latency - low.latency), (low, high)


def _simplex(points: Sequence[_Point], target: _Point, axes: tuple[str, ...]) -> tuple[float, tuple[_Point, ...]] | str:
    import numpy as np
    from scipy.interpolate import LinearNDInterpolator

    if len(points) < len(axes) + 1 or any(len({p.at[a] for p in points}) < 2 for a in axes):
        return "too few"
    sites = np.array([[p.at[a] for a in axes] for p in points], dtype=float)
    aim = np.array([[target.at[a] for a in axes]], dtype=float)
    if np.linalg.matrix_rank(sites - sites[0]) < len(axes):
        return "degenerate"
    try:
        interpolator = LinearNDInterpolator(sites, np.array([p.latency for p in points], dtype=float))
        value = float(interpolator(aim)[0])
        simplex = int(interpolator.tri.find_simplex(aim)[0])
    except (ValueError, RuntimeError):  # Qhull's errors are RuntimeErrors
        return "degenerate"
    if simplex < 0 or not math.isfinite(value) or value <= 0:
        return "outside"
    return value, tuple(points[int(v)] for v in interpolator.tri.simplices[simplex])


def _names(axes: Sequence[str]) -> str:
    return axes[0] if len(axes) == 1 else f"({', '.join(axes)})"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def _where(axes: tuple[str, ...], target: _Point, near: Sequence[_Point]) -> str:
    """``N in [2048, 6144] with M = 4096, K = 1024``: the measured range where a group was tried."""
    ranges = ", ".join(f"{a} in [{_num(min(p.raw[a] for p in near))}, {_num(max(p.raw[a] for p in near))}]"
                       for a in axes)
    fixed = ", ".join(f"{a} = {_num(v)}" for a, v in target.raw.items() if a not in axes)
    return f"{ranges} with {fixed}" if fixed else ranges


def _why(misses: Sequence[tuple[str, str, int]], rule: Rule, axes: Sequence[str]) -> str:
    outside = [(dim, where) for status, where, dim in misses if status == "outside"]
    if outside:  # the lowest-dimensional ranges say most: the line or plane through the query
        return "outside the measured hull: " + "; ".join(w for d, w in outside if d == min(outside)[0])
    odd = [f"{where} (rows {'in a lower-dimensional plane' if status == 'degenerate' else 'too few to span it'})"
           for status, where, _ in misses if status in ("degenerate", "too few")]
    disabled = [where for status, where, _ in misses if status == "disabled"]
    if disabled:
        head = (f"policy {rule.declared} allows interpolation along at most {rule.max_dim} ax"
                f"{'is' if rule.max_dim == 1 else 'es'} at once, and no such line of measured rows of this "
                f"regime passes through the query ({', '.join(disabled)} not allowed)")
    else:
        head = f"no two measured rows of this regime differ from the query only in {', '.join(axes)}" + \
            (f" (up to {rule.max_dim} at once)" if rule.max_dim > 1 and len(axes) > 1 else "")
    return "; ".join([head, *odd])


def _interpolated(query: Query, rule: Rule, target: _Point, fit: _Fit) -> Answer:
    details = {"interpolation_dim": float(len(fit.axes)), "candidates": float(fit.candidates)}
    for axis in fit.axes:
        details[axis] = target.raw[axis]
        details[f"{axis}_low"] = min(p.raw[axis] for p in fit.used)
        details[f"{axis}_high"] = max(p.raw[axis] for p in fit.used)
    shown = [f"sqrt({a})" if rule.transform == "sqrt_seq" and a == "seq" else a for a in fit.axes]
    how = (f"linear in {shown[0]} between {_num(details[fit.axes[0] + '_low'])} and "
           f"{_num(details[fit.axes[0] + '_high'])}") if len(fit.axes) == 1 else f"griddata linear in {_names(shown)}"
    method = f"policy {rule.declared}: {how}" if rule.declared else f"policy {how}"
    lines = tuple(sorted({line for p in fit.used for line in p.lines}))
    return Answer(query, INTERPOLATED, fit.value, lines, method, reason=f"policy from {rule.source}", details=details)
