"""Generators by name, as ``config.yaml`` routes kernel types to them."""

from __future__ import annotations

from perf_plugin.grid.generators.attention import AttentionGenerator, FlashAttentionGenerator
from perf_plugin.grid.generators.base import BaseEnv, Generator
from perf_plugin.grid.generators.gemm import GemmGenerator
from perf_plugin.grid.generators.moe import MoeGenerator
from perf_plugin.grid.generators.tokenwise import TokenwiseGenerator

GENERATORS: dict[str, Generator] = {
    generator.name: generator
    for generator in (
        GemmGenerator("gemm"),
        AttentionGenerator("attention"),
        FlashAttentionGenerator("flash_attention"),
        MoeGenerator("moe"),
        TokenwiseGenerator("norm"),
        TokenwiseGenerator("rope"),
        TokenwiseGenerator("elementwise"),
    )
}

__all__ = ["GENERATORS", "BaseEnv", "Generator"]
