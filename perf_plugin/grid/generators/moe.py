"""Mixture-of-experts kernels: expert GEMMs (GroupedMatmul) and routing (top-k gating).

Base environments, for each MoE model:

* expert parallelism, one per ``ep`` in ``ep_sizes``: ``experts_per_rank = num_experts / ep``
  whole experts (``moe_intermediate_per_rank = moe_intermediate``), attention sizes at TP 1;
* tensor parallelism, one per TP size: every expert on every rank, sharded
  (``experts_per_rank = num_experts``, ``moe_intermediate_per_rank = moe_intermediate / tp``,
  ``ep = 1``).

The patterns take the tokens each local expert receives from a grid (``tokens_per_expert``):
with balanced routing a rank's experts see ``tokens_per_expert * experts_per_rank`` routed rows,
which come from ``ceil(rows / top_k)`` tokens.

Options: ``expert_loads`` (a list of ``balanced``, ``zipf S``, ``max_mean R``;
``perf_plugin.grid.expert_load``) writes every grouped GEMM shape once per load, its rows per
expert in ``Input Values`` at the group list's slot ``group_slot`` (default 7, GroupedMatmul's).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from perf_plugin.database.schema import INPUT_VALUES, INPUT_VALUES_SOURCE
from perf_plugin.grid.expert_load import parse_load, with_loads
from perf_plugin.grid.generators.base import BaseEnv, Generator
from perf_plugin.grid.models import ModelConfig

GROUPED_GEMM_GROUP_SLOT = 7


class MoeGenerator(Generator):
    def resolve_options(self, raw: Mapping[str, Any], grids: Mapping[str, tuple[int, ...]]) -> Mapping[str, Any]:
        unknown = set(raw) - {"expert_loads", "group_slot"}
        if unknown:
            raise ValueError(f"generator {self.name!r} takes expert_loads and group_slot (got {', '.join(sorted(unknown))})")
        loads = raw.get("expert_loads") or []
        if not isinstance(loads, list):
            raise ValueError("expert_loads: expected a list such as [balanced, zipf 1.0, max_mean 2]")
        slot = raw.get("group_slot", GROUPED_GEMM_GROUP_SLOT)
        if not isinstance(slot, int) or slot < 1:
            raise ValueError(f"group_slot: expected an input slot index >= 1, got {slot!r}")
        return {"expert_loads": tuple(parse_load(text) for text in loads), "group_slot": slot} if loads else {}

    def row_columns(self, options: Mapping[str, Any]) -> tuple[str, ...]:
        return (INPUT_VALUES, INPUT_VALUES_SOURCE) if options.get("expert_loads") else ()

    def variants(self, options: Mapping[str, Any], cells: dict[str, str]) -> list[dict[str, str]]:
        return with_loads(cells, options.get("expert_loads", ()), options.get("group_slot", GROUPED_GEMM_GROUP_SLOT))

    def variables(self, options: Mapping[str, Any]) -> frozenset[str]:
        return frozenset({"ep", "experts_per_rank"})

    def base_envs(
        self, models: Sequence[ModelConfig], options: Mapping[str, Any], restricted: bool
    ) -> Iterator[BaseEnv]:
        for model in models:
            if not model.is_moe:
                continue
            for ep in model.ep_sizes:
                env = model.at_tp(1)
                env.update(ep=ep, experts_per_rank=model.num_experts // ep)
                yield model.name, env
            for tp in model.tp_sizes:
                env = model.at_tp(tp)
                env.update(ep=1, experts_per_rank=model.num_experts)
                yield model.name, env
