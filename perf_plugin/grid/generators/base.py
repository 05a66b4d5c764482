"""The generator protocol: where the variables of a kernel type's shape patterns come from.

A generator turns the selected models into *base environments*: mappings of variable names
(model parameters, per-rank sizes, generator-specific values such as a projection's N and K) to
integers, each labelled with the model it came from.  The patterns of ``config.yaml`` then
cross every base environment with their grid variables (``over``), derive more values
(``let``), filter (``where``) and evaluate the slot shapes.  Generators know about models;
patterns know about kernel slot layouts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from perf_plugin.grid.models import ModelConfig

BaseEnv = tuple[str, dict[str, int]]  # (origin model label, variables)


class Generator(ABC):
    """Base class of generators; instances are registered by name in ``GENERATORS``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def resolve_options(self, raw: Mapping[str, Any], grids: Mapping[str, tuple[int, ...]]) -> Mapping[str, Any]:
        """Check the ``options`` of a route; raise ValueError with a readable reason."""
        if raw:
            raise ValueError(f"generator {self.name!r} takes no options (got {', '.join(map(str, raw))})")
        return {}

    def variables(self, options: Mapping[str, Any]) -> frozenset[str]:
        """Names this generator adds to the model parameters (for config checking)."""
        return frozenset()

    def row_columns(self, options: Mapping[str, Any]) -> tuple[str, ...]:
        """Columns ``variants`` writes beside the identity (part of a generated row's key)."""
        return ()

    def variants(self, options: Mapping[str, Any], cells: dict[str, str]) -> list[dict[str, str]]:
        """The rows one generated shape becomes (itself, by default)."""
        return [cells]

    @abstractmethod
    def base_envs(
        self, models: Sequence[ModelConfig], options: Mapping[str, Any], restricted: bool
    ) -> Iterator[BaseEnv]:
        """Base environments for ``models``; ``restricted`` is True under ``--target-models``."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


class PerRankGenerator(Generator):
    """One environment per (model, TP size): the model's per-rank sizes (see ``models``)."""

    def base_envs(
        self, models: Sequence[ModelConfig], options: Mapping[str, Any], restricted: bool
    ) -> Iterator[BaseEnv]:
        for model in models:
            for tp in model.tp_sizes:
                yield model.name, model.at_tp(tp)
