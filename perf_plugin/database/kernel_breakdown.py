"""The kernel-breakdown cell: which device kernels a row's call launched, and their time.

``Profiling Kernels`` (written by the ingest of a PyTorch trace: the kernels the operator launched
in the model) and ``MicroBench Kernels`` (written back by a run: the kernels of the case's timed
repeats) share one format, the kernels by descending time, each with its mean microseconds per
call, at most ``BREAKDOWN_LIMIT`` of them::

    nvjet_sm90_tst_384x8_64x4_2x1_v_bz_TNT=371.37;Memset (Device)=0.996

Comparing the two (``kernel_difference``) tells whether a replay measured the kernel the model
ran: a composition of element-wise kernels standing in for a fused one, or a GEMM that cuBLAS
served with another kernel (other operand layout, other tile), shows up as names on one side
only.  Kernels holding less than ``NEGLIGIBLE_SHARE`` of their side's time are not compared (a
workspace memset beside a GEMM is not another kernel choice).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from perf_plugin.database.schema import format_number

BREAKDOWN_LIMIT = 8
NEGLIGIBLE_SHARE = 0.05
_SEPARATOR = ";"


def format_breakdown(mean_us: Mapping[str, float] | Iterable[tuple[str, float]], limit: int = BREAKDOWN_LIMIT) -> str:
    """``name=us;...`` by descending time (ties in the given order), the first ``limit``."""
    items = list(mean_us.items() if isinstance(mean_us, Mapping) else mean_us)
    ordered = sorted(items, key=lambda item: -item[1])[:limit]
    return _SEPARATOR.join(f"{_clean(name)}={format_number(value)}" for name, value in ordered)


def _clean(name: str) -> str:
    # the cell's own separators cannot appear inside a name (C++ names have neither in practice)
    return name.replace(_SEPARATOR, ",").replace("=", ":")


def parse_breakdown(cell: str) -> dict[str, float]:
    """Kernel name -> mean microseconds; entries that are not ``name=number`` are skipped."""
    parsed: dict[str, float] = {}
    for entry in cell.split(_SEPARATOR):
        name, _, value = entry.rpartition("=")
        try:
            parsed[name.strip()] = float(value)
        except ValueError:
            continue
    parsed.pop("", None)
    return parsed


@dataclass(frozen=True)
class KernelDifference:
    """Kernels one side launched that the other did not (names, by descending time)."""

    replay_only: tuple[str, ...]
    profile_only: tuple[str, ...]

    def describe(self) -> str:
        parts = []
        if self.replay_only:
            parts.append("replay launched " + ", ".join(self.replay_only))
        if self.profile_only:
            parts.append("the profile has " + ", ".join(self.profile_only))
        return "; ".join(parts)


def _significant(breakdown: Mapping[str, float]) -> list[str]:
    total = sum(breakdown.values())
    ordered = sorted(breakdown.items(), key=lambda item: -item[1])
    return [name for name, value in ordered if total <= 0 or value >= NEGLIGIBLE_SHARE * total]


def kernel_difference(profiled_cell: str, replayed_cell: str) -> KernelDifference | None:
    """None when either cell is empty or both launched the same significant kernels."""
    profiled, replayed = parse_breakdown(profiled_cell), parse_breakdown(replayed_cell)
    if not profiled or not replayed:
        return None
    replay_only = tuple(name for name in _significant(replayed) if name not in profiled)
    profile_only = tuple(name for name in _significant(profiled) if name not in replayed)
    if not replay_only and not profile_only:
        return None
    return KernelDifference(replay_only, profile_only)
