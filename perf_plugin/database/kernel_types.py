"""Kernel-type names become file names (``{KernelType}.csv``): only plain names are allowed."""

from __future__ import annotations

import re

from perf_plugin.database.errors import DatabaseError

# Real kernel types include names such as ``MatMulV3``, ``hcom_allReduce_``,
# ``split_qkv_rmsnorm_rope_kernel`` and ``mla_preprocess_0_mix_aic``; dots and dashes are
# allowed for CUDA/CPU kernel types derived from operator names (``aten.mm``).
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}$")


def validate_kernel_type(name: str) -> str:
    """Return ``name`` if it is safe to use as a CSV file stem, else raise DatabaseError."""
    if not isinstance(name, str) or not name:
        raise DatabaseError(f"kernel type {name!r} is empty")
    if "/" in name or "\\" in name or name in {".", ".."} or ".." in name:
        raise DatabaseError(f"kernel type {name!r} is not a plain name (path separators or '..')")
    if not _PLAIN_NAME.match(name):
        raise DatabaseError(
            f"kernel type {name!r} is not a plain name: use letters, digits, '_', '.', '-' only"
        )
    return name


def is_valid_kernel_type(name: str) -> bool:
    try:
        validate_kernel_type(name)
    except DatabaseError:
        return False
    return True
