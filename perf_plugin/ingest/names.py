"""Kernel-type names as ingest writes them: variant suffixes stripped, communication set apart.

Variant rule
------------
Some Triton and custom kernels are reported under a numbered name per compiled variant
(``split_qkv_rmsnorm_rope_kernel_0``, ``muls_add_kernel_1``); the number identifies a
specialisation of the same kernel, not a different operator, so its samples belong in one CSV.
The rule is deliberately small and explicit: **a trailing ``_<digits>`` is stripped only from the
kernel families listed in** ``VARIANT_FAMILIES``.  Every other name is kept as the profiler wrote
it: ``reshape_and_cache_200000000`` (the number is a Triton configuration that existing
databases keep as its own kernel type), ``mla_preprocess_0_mix_aic`` (digits in the middle) and
``Conv2D1`` (no underscore) are unchanged.  To add a family, add its base name to the table.

Communication
-------------
Collectives are measured separately (``hcom_*_.csv`` under the collective directory), so rows
whose ``Type`` or ``Name`` starts with ``hcom_``, or whose ``Accelerator Core`` is
``COMMUNICATION`` (torch_npu 2.x) or ``HCCL`` (older releases), are kept out of the compute CSVs
and only counted per type in the ingest report.
"""

from __future__ import annotations

import re

# Base names of kernels whose numbered variants are one kernel type.
VARIANT_FAMILIES: frozenset[str] = frozenset(
    {
        "split_qkv_rmsnorm_rope_kernel",
        "muls_add_kernel",
    }
)

COMMUNICATION_PREFIX = "hcom_"
COMMUNICATION_CORES: frozenset[str] = frozenset({"COMMUNICATION", "HCCL"})

_VARIANT_SUFFIX = re.compile(r"^(?P<base>.+)_(?P<number>\d+)$")


def normalise_kernel_type(name: str) -> str:
    """``split_qkv_rmsnorm_rope_kernel_0`` -> ``split_qkv_rmsnorm_rope_kernel``; others unchanged."""
    name = name.strip()
    match = _VARIANT_SUFFIX.match(name)
    if match and match.group("base") in VARIANT_FAMILIES:
        return match.group("base")
    return name


def is_communication(kernel_type: str, name: str = "", accelerator_core: str = "") -> bool:
    return (
        kernel_type.strip().startswith(COMMUNICATION_PREFIX)
        or name.strip().startswith(COMMUNICATION_PREFIX)
        or accelerator_core.strip().upper() in COMMUNICATION_CORES
    )
