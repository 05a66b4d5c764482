"""The GEMM family (MatMulV2, MatMulV3, MatMulCommon, BatchMatMulV2, and the FP8 GEMMs of
``aten._scaled_mm``): N and K from the models.

Each base environment is one projection of one model at one TP size (``projections`` lists
them) and defines ``n``, ``k`` and, for batched projections, ``b`` (the batch of heads);
the patterns cross them with token counts ``m``.  ``options.kind`` picks the linear projections
(``linear``: MatMul kernels, and FP8 linear layers) or the batched ones (``bmm``: BatchMatMulV2).
How a kernel lays the projection out (operand order, dtypes, a transposed weight's strides, the
``torch.ops.aten`` call's arguments) is its patterns' business, not the generator's: a bf16
MatMulV2 row and an FP8 ``aten._scaled_mm`` row of one projection share its environment.

Without ``--target-models`` the candidate set also holds a generic grid (``generic_n`` x
``generic_k``, and ``generic_batch`` for ``bmm``) labelled ``generic``; with it, only the
pairs the named models need at their TP sizes remain.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from perf_plugin.grid.generators.base import BaseEnv, Generator
from perf_plugin.grid.models import ModelConfig
from perf_plugin.grid.projections import model_projections

GENERIC_LABEL = "generic"
_KINDS = ("linear", "bmm")


class GemmGenerator(Generator):
    def resolve_options(self, raw: Mapping[str, Any], grids: Mapping[str, tuple[int, ...]]) -> Mapping[str, Any]:
        allowed = {"kind", "generic_n", "generic_k", "generic_batch"}
        unknown = sorted(set(map(str, raw)) - allowed)
        if unknown:
            raise ValueError(f"unknown option {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})")
        kind = raw.get("kind", "linear")
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {', '.join(_KINDS)}, got {kind!r}")
        options: dict[str, Any] = {"kind": kind}
        for name in ("generic_n", "generic_k", "generic_batch"):
            if name in raw:
                grid = raw[name]
                if grid not in grids:
                    raise ValueError(f"{name}: unknown grid {grid!r}")
                options[name] = grids[grid]
        if kind == "linear" and "generic_batch" in options:
            raise ValueError("generic_batch applies to kind bmm only")
        wanted = ("generic_n", "generic_k") + (("generic_batch",) if kind == "bmm" else ())
        given = [name for name in wanted if name in options]
        if given and len(given) != len(wanted):
            raise ValueError(f"a generic grid needs all of {', '.join(wanted)}")
        return options

    def variables(self, options: Mapping[str, Any]) -> frozenset[str]:
        return frozenset({"n", "k", "b"})

    def base_envs(
        self, models: Sequence[ModelConfig], options: Mapping[str, Any], restricted: bool
    ) -> Iterator[BaseEnv]:
        kind = options.get("kind", "linear")
        for model in models:
            seen: set[tuple[int, int, int]] = set()
            for tp, projection in model_projections(model):
                key = (projection.n, projection.k, projection.batch)
                if projection.kind != kind or key in seen:
                    continue
                seen.add(key)
                yield model.name, {**model.at_tp(tp), "n": projection.n, "k": projection.k, "b": projection.batch}
        if restricted or "generic_n" not in options:
            return
        batches = options.get("generic_batch", (0,))
        for b in batches:
            for n in options["generic_n"]:
                for k in options["generic_k"]:
                    yield GENERIC_LABEL, {"n": n, "k": k, "b": b}
