"""Which DispatchFFNCombine rows can run in a given EP group: the constraint probe, per row, without a device.

The seed lists ``probe_dfc_constraints.py`` ("DFC kernel constraint probe") and, for
``start_microbench.py``, the launch options ``--dispatch-ffn-combine-ep-size`` (default 16),
``--dispatch-ffn-combine-nproc-per-node``, ``-nnodes`` (1), ``-node-rank`` (0), ``-master-addr``
(127.0.0.1) and ``-master-port``.  msmodeling's probe runs the kernel on an NPU in child processes
over sweeps of H, I, M and E and prints the alignments it observes; it records no result, so
nothing here claims an alignment rule.  What is decided without a device:

* EP size.  The kernel sends each token to the rank owning its expert over the HCCL group it is
  given; the ``EP Size`` column says how many ranks the profiled run had, and the same shapes on
  another group size move other data.  A row runs only in a group of exactly its ``EP Size``
  ranks (msmodeling's replay skips rows of another EP size; a run at EP size N is ``torchrun
  --nproc_per_node`` x ``--nnodes`` = N processes: ``perf_plugin.run.ep_launch``).  The replay
  calls the probe with the size of the group the case runs in (one rank outside such a session).
* Experts.  ``expert_idx`` spans experts-per-rank x EP size ids; top-k cannot exceed that.
* HCCL window.  The tiling (vllm-ascend ``csrc/dispatch_ffn_combine/op_host/dispatch_ffn_combine_tiling.cpp``)
  refuses a call when ``M * topK * H * 3 + 10 MiB`` exceeds ``HCCL_BUFFSIZE`` (MiB, default
  200; a value it cannot read or above 65535 falls back to the default).

Nothing of this has run on an NPU: the rules are read from the sources named above.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

HCCL_BUFFSIZE_ENV = "HCCL_BUFFSIZE"
DEFAULT_HCCL_BUFFSIZE_MB = 200
WINDOW_RESERVE_BYTES = 10 * 1024 * 1024
MIB = 1024 * 1024
_LEADING_DIGITS = re.compile(r"\s*(\d+)")


@dataclass(frozen=True)
class DfcShape:
    """What the constraints look at in a row."""

    tokens: int  # M
    hidden: int  # H
    top_k: int
    experts: int  # per rank
    ep_size: int  # the row's EP Size


def hccl_window_mb(environ: Mapping[str, str]) -> int:
    """The HCCL window the kernel will see, as its tiling reads ``HCCL_BUFFSIZE`` (``std::stoul``:
    leading digits; unreadable or above 65535 -> the 200 MiB default)."""
    match = _LEADING_DIGITS.match(environ.get(HCCL_BUFFSIZE_ENV, ""))
    value = int(match.group(1)) if match else DEFAULT_HCCL_BUFFSIZE_MB
    return value if value <= 0xFFFF else DEFAULT_HCCL_BUFFSIZE_MB


def window_bytes_needed(shape: DfcShape) -> int:
    return shape.tokens * shape.top_k * shape.hidden * 3 + WINDOW_RESERVE_BYTES


def dfc_blocker(shape: DfcShape, group_ep_size: int, window_mb: int) -> str | None:
    """Why the row cannot run in an EP group of ``group_ep_size`` ranks, or None when it can."""
    if shape.ep_size != group_ep_size:
        return (
            f"EP Size {shape.ep_size}: the kernel dispatches tokens over an HCCL group of exactly {shape.ep_size} "
            f"rank(s) (torchrun --nproc_per_node={shape.ep_size}, or nproc_per_node x nnodes = {shape.ep_size} across "
            f"hosts); this run's group has {group_ep_size} (an NPU run replays such rows under torchrun with "
            f"--perf-dispatch-ffn-combine-ep-size {shape.ep_size})"
        )
    if shape.top_k > shape.experts * shape.ep_size:
        return f"top-k {shape.top_k} exceeds the {shape.experts * shape.ep_size} experts"
    needed = window_bytes_needed(shape)
    if needed > window_mb * MIB:
        return (
            f"M {shape.tokens} x top-k {shape.top_k} x H {shape.hidden} x 3 + 10 MiB = {math.ceil(needed / MIB)} MiB "
            f"exceeds the HCCL window ({HCCL_BUFFSIZE_ENV}={window_mb} MiB); the kernel's tiling refuses it"
        )
    return None

