"""The four collectives and four dtypes the benchmarks measure, as plain data (no torch import).

``message_bytes`` is the per-rank message size as nccl-tests counts it ("size" in its output):

* ``all_reduce``: the bytes of the buffer every rank reduces (in place);
* ``all_gather``: the bytes of the gathered output on each rank (``n`` times the input);
* ``reduce_scatter``: the bytes of the input on each rank (``n`` times the output);
* ``all_to_all``: the bytes each rank sends (and receives), ``n`` chunks of ``message_bytes / n``.

Bus bandwidth uses nccl-tests' factors, so figures compare with its ``busbw`` column:
``2(n-1)/n`` for all_reduce and ``(n-1)/n`` for the three others.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class CommDtype:
    """A dtype of the benchmarks: short key, database spelling, torch name and bit layout."""

    key: str  # what test ids and --comm-dtypes use: bf16, fp16, fp32, int8
    db_name: str  # the spelling of the Ascend databases: DT_BF16, DT_FLOAT16, FLOAT, INT8
    torch_name: str
    itemsize: int
    mantissa_bits: int  # explicit fraction bits; 0 for integers

    @property
    def floating(self) -> bool:
        return self.mantissa_bits > 0

    def exact_integer_limit(self) -> int:
        """Largest n such that every integer in [0, n] is representable exactly."""
        if not self.floating:
            return int(2 ** (8 * self.itemsize - 1)) - 1  # int: typeshed types a power as Any
        return int(2 ** (self.mantissa_bits + 1))


COMM_DTYPES: Mapping[str, CommDtype] = MappingProxyType(
    {
        "bf16": CommDtype("bf16", "DT_BF16", "bfloat16", 2, 7),
        "fp16": CommDtype("fp16", "DT_FLOAT16", "float16", 2, 10),
        "fp32": CommDtype("fp32", "FLOAT", "float32", 4, 23),
        "int8": CommDtype("int8", "INT8", "int8", 1, 0),
    }
)

_DTYPE_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "bf16": "bf16",
        "bfloat16": "bf16",
        "torch.bfloat16": "bf16",
        "dt_bf16": "bf16",
        "fp16": "fp16",
        "float16": "fp16",
        "half": "fp16",
        "torch.float16": "fp16",
        "dt_float16": "fp16",
        "fp32": "fp32",
        "float32": "fp32",
        "float": "fp32",
        "torch.float32": "fp32",
        "dt_float": "fp32",
        "int8": "int8",
        "torch.int8": "int8",
        "dt_int8": "int8",
    }
)


def parse_dtype(text: str) -> CommDtype:
    """``bf16`` / ``torch.bfloat16`` / ``DT_BF16`` ... -> CommDtype; ValueError for anything else."""
    key = _DTYPE_ALIASES.get(text.strip().lower())
    if key is None:
        raise ValueError(f"unknown dtype {text!r} (choose from {', '.join(COMM_DTYPES)})")
    return COMM_DTYPES[key]


def dtype_by_db_name(name: str) -> CommDtype | None:
    """The dtype a database cell names (``DT_BF16``, ``BF16``, ``FLOAT`` ...), or None."""
    text = name.strip().upper()
    for dtype in COMM_DTYPES.values():
        if text in (dtype.db_name, dtype.db_name.removeprefix("DT_"), "DT_" + dtype.db_name):
            return dtype
    return None


@dataclass(frozen=True)
class Collective:
    """One collective: its name, its database file, and how its message divides among ranks."""

    name: str  # all_reduce, all_gather, reduce_scatter, all_to_all
    hcom_name: str  # the HCCL op name in the database file name
    chunked: bool  # the message is n equal chunks, one per rank (all but all_reduce)

    @property
    def file_name(self) -> str:
        return f"hcom_{self.hcom_name}_.csv"

    def bus_factor(self, num_devices: int) -> float:
        """nccl-tests' busbw / algbw factor for a group of ``num_devices``."""
        if num_devices < 1:
            raise ValueError(f"a group has at least one device, not {num_devices}")
        share = (num_devices - 1) / num_devices
        return 2 * share if self.name == "all_reduce" else share

    def granule_bytes(self, dtype: CommDtype, num_devices: int) -> int:
        """What ``message_bytes`` must be a multiple of for this op, dtype and group size."""
        return dtype.itemsize * (num_devices if self.chunked else 1)


COLLECTIVES: Mapping[str, Collective] = MappingProxyType(
    {
        "all_reduce": Collective("all_reduce", "allReduce", chunked=False),
        "all_gather": Collective("all_gather", "allGather", chunked=True),
        "reduce_scatter": Collective("reduce_scatter", "reduceScatter", chunked=True),
        "all_to_all": Collective("all_to_all", "alltoallv", chunked=True),
    }
)

_OP_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        **{name: name for name in COLLECTIVES},
        **{name.replace("_", ""): name for name in COLLECTIVES},
        **{c.hcom_name.lower(): c.name for c in COLLECTIVES.values()},
        "alltoall": "all_to_all",
        "all_to_all_single": "all_to_all",
        "all_gather_into_tensor": "all_gather",
        "reduce_scatter_tensor": "reduce_scatter",
    }
)


def parse_op(text: str) -> Collective:
    """``all_reduce`` / ``allReduce`` / ``hcom_allReduce_`` ... -> Collective; ValueError otherwise."""
    token = text.strip().lower()
    token = token.removeprefix("hcom_").removesuffix(".csv").rstrip("_")
    name = _OP_ALIASES.get(token)
    if name is None:
        raise ValueError(f"unknown collective {text!r} (choose from {', '.join(COLLECTIVES)})")
    return COLLECTIVES[name]


def op_for_file_name(file_name: str) -> Collective | None:
    """The collective a database file holds (``hcom_allReduce_.csv`` -> all_reduce), or None."""
    for collective in COLLECTIVES.values():
        if collective.file_name == file_name:
            return collective
    return None
