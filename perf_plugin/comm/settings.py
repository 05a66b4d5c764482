"""Collective benchmark options, parsed into one frozen CommSettings (no torch import).

List options take values separated by commas or spaces and may be repeated
(``--comm-dtypes bf16,fp32`` == ``--comm-dtypes "bf16 fp32"`` == ``--comm-dtypes bf16 --comm-dtypes
fp32``); each option takes one argument, so paths after it stay paths.  Sizes accept plain integers and the suffixes
K, M, G (powers of 1024, as nccl-tests' ``-b 1K`` and the seed's default grid
1024 ... 536870912 use them; ``KB``/``KiB`` mean the same), and a doubling range ``1K..1M``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, overload

from perf_plugin.comm.collectives import COLLECTIVES, Collective, CommDtype, parse_dtype, parse_op
from perf_plugin.comm.topology import TIERS, parse_grid_shape

MODES = ("kernel", "event")
CCL_CHOICES = ("auto", "gloo", "nccl", "hccl")
KiB = 1024
MiB = 1024 * KiB
# Default message sizes: 1 KB to 512 MB (the seed's grid); gloo on the CPU stops at 1 MB so a
# CI machine measures the whole default grid in seconds, not minutes.
DEFAULT_MIN_BYTES = KiB
DEFAULT_MAX_BYTES = 512 * MiB
GLOO_DEFAULT_MAX_BYTES = MiB
DEFAULT_DTYPES = ("bf16",)
DEFAULT_WARMUP = 5
DEFAULT_ITERS = 20
DEFAULT_TIMEOUT_S = 300.0

T = TypeVar("T")
_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": KiB, "m": MiB, "g": 1024 * MiB}


class CommConfigError(ValueError):
    """A collective benchmark option that cannot be honoured; shown as one line to the user."""


def parse_size(text: str) -> int:
    """``1K`` -> 1024, ``4MB`` -> 4194304, ``512`` -> 512; ValueError otherwise."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a byte size (e.g. 1024, 1K, 4M, 1G)")
    value = int(match.group(1)) * _UNITS[match.group(2).lower()]
    if value < 1:
        raise ValueError(f"{text!r} is not a positive byte size")
    return value


def doubling_range(low: int, high: int) -> tuple[int, ...]:
    """``low, 2*low, ...`` up to and including ``high`` (when reached)."""
    if low > high:
        raise ValueError(f"range {low}..{high} is empty")
    sizes = []
    size = low
    while size <= high:
        sizes.append(size)
        size *= 2
    return tuple(sizes)


def split_values(values: Iterable[str] | str | None) -> list[str]:
    """Values separated by commas or spaces, from one or several (repeated) options."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [token for value in values for token in re.split(r"[\s,]+", str(value)) if token]


def parse_bytes_grid(values: Iterable[str] | str | None) -> tuple[int, ...] | None:
    """``["1K,4K", "1M"]`` -> (1024, 4096, 1048576); ``1K..8K`` doubles; None when not given."""
    tokens = split_values(values)
    if not tokens:
        return None
    sizes: list[int] = []
    for token in tokens:
        if ".." in token:
            low, _, high = token.partition("..")
            sizes.extend(doubling_range(parse_size(low), parse_size(high)))
        else:
            sizes.append(parse_size(token))
    return tuple(dict.fromkeys(sizes))  # keep the order given, drop repeats


def parse_positive_ints(values: Iterable[str] | str | None, what: str) -> tuple[int, ...] | None:
    tokens = split_values(values)
    if not tokens:
        return None
    numbers = []
    for token in tokens:
        try:
            number = int(token)
        except ValueError:
            raise ValueError(f"{what} {token!r} is not an integer") from None
        if number < 1:
            raise ValueError(f"{what} {number} is not positive")
        numbers.append(number)
    return tuple(dict.fromkeys(numbers))


@dataclass(frozen=True)
class CommSettings:
    ops: tuple[Collective, ...]
    bytes_grid: tuple[int, ...] | None  # None: the backend's default grid
    dtypes: tuple[CommDtype, ...]
    num_devices: tuple[int, ...] | None  # None: the whole world
    grid_shape: tuple[int, ...] | None
    topology_tier: int | None
    mode: str
    warmup: int
    iters: int
    timeout_s: float
    nproc: int | None
    ccl: str  # auto, gloo, nccl, hccl
    output_dir: Path | None
    device: str | None
    ccl_version: str | None
    cann_version: str | None
    database_root: Path | None


def default_bytes_grid(ccl: str) -> tuple[int, ...]:
    high = GLOO_DEFAULT_MAX_BYTES if ccl == "gloo" else DEFAULT_MAX_BYTES
    return doubling_range(DEFAULT_MIN_BYTES, high)


def build_settings(
    *,
    ops: Sequence[str] | str | None = None,
    bytes_grid: Sequence[str] | str | None = None,
    dtypes: Sequence[str] | str | None = None,
    num_devices: Sequence[str] | str | None = None,
    grid_shape: str | None = None,
    topology_tier: int | str | None = None,
    mode: str | None = None,
    warmup: int | str | None = None,
    iters: int | str | None = None,
    timeout_s: float | str | None = None,
    nproc: int | str | None = None,
    ccl: str | None = None,
    output_dir: str | Path | None = None,
    device: str | None = None,
    ccl_version: str | None = None,
    cann_version: str | None = None,
    database_root: str | Path | None = None,
) -> CommSettings:
    """Parse raw option values; CommConfigError names the option that is wrong."""
    chosen_mode = mode or "kernel"
    if chosen_mode not in MODES:
        raise CommConfigError(f"--comm-mode: {chosen_mode!r} is not one of {', '.join(MODES)}")
    chosen_ccl = (ccl or "auto").lower()
    if chosen_ccl not in CCL_CHOICES:
        raise CommConfigError(f"--comm-backend: {ccl!r} is not one of {', '.join(CCL_CHOICES)}")
    return CommSettings(
        ops=_parsed("--comm-ops", lambda: tuple(dict.fromkeys(parse_op(t) for t in split_values(ops)))
                    or tuple(COLLECTIVES.values())),
        bytes_grid=_parsed("--bytes-grid", lambda: parse_bytes_grid(bytes_grid)),
        dtypes=_parsed("--comm-dtypes", lambda: tuple(dict.fromkeys(parse_dtype(t) for t in split_values(dtypes)
                                                                    or DEFAULT_DTYPES))),
        num_devices=_parsed("--num-devices", lambda: parse_positive_ints(num_devices, "group size")),
        grid_shape=_parsed("--grid-shape", lambda: parse_grid_shape(grid_shape) if grid_shape not in (None, "") else None),
        topology_tier=_tier(topology_tier),
        mode=chosen_mode,
        warmup=_count("--comm-warmup", warmup, DEFAULT_WARMUP, 0),
        iters=_count("--comm-iters", iters, DEFAULT_ITERS, 1),
        timeout_s=_timeout(timeout_s),
        nproc=_count("--comm-nproc", nproc, None, 1),
        ccl=chosen_ccl,
        output_dir=Path(output_dir) if output_dir else None,
        device=device or None,
        ccl_version=ccl_version or None,
        cann_version=cann_version or None,
        database_root=Path(database_root) if database_root else None,
    )


def _parsed(option: str, parse: Callable[[], T]) -> T:
    """``parse()``, its ValueError turned into the CommConfigError that names ``option``."""
    try:
        return parse()
    except ValueError as exc:
        raise CommConfigError(f"{option}: {exc}") from None


def _tier(raw: int | str | None) -> int | None:
    if raw in (None, ""):
        return None
    try:
        tier = int(raw)
    except ValueError:
        tier = -1
    if tier not in TIERS:
        raise CommConfigError(f"--topology-tier: {raw!r} is not 0 (inter-pod), 1 (intra-pod) or 2 (die-level)")
    return tier


@overload
def _count(option: str, raw: int | str | None, default: int, low: int) -> int: ...


@overload
def _count(option: str, raw: int | str | None, default: None, low: int) -> int | None: ...


def _count(option: str, raw: int | str | None, default: int | None, low: int) -> int | None:
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise CommConfigError(f"{option}: {raw!r} is not an integer") from None
    if value < low:
        raise CommConfigError(f"{option}: {raw} is below {low}")
    return value


def _timeout(raw: float | str | None) -> float:
    try:
        timeout = float(raw) if raw not in (None, "") else DEFAULT_TIMEOUT_S
    except ValueError:
        raise CommConfigError(f"--comm-timeout: {raw!r} is not a number of seconds") from None
    if not timeout > 0:
        raise CommConfigError(f"--comm-timeout: {raw!r} is not a positive number of seconds")
    return timeout
