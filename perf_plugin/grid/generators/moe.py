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
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from perf_plugin.grid.generators.base import BaseEnv, Generator
from perf_plugin.grid.models import ModelConfig


class MoeGenerator(Generator):
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
