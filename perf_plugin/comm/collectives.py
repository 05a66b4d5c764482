"""The four collectives and four dtypes the benchmarks measure, as plain data (no torch import).

Two sizes describe one measured case, and a collective CSV carries both:

* ``message_bytes`` is the size the Ascend performance model computes from the tensor it sees at
  the call, and looks rows up by (msmodeling ``ProfilingDataSource._lookup_comm``; its HCCL
  microbenchmark writes the same): ``all_reduce`` the buffer, ``all_gather`` one rank's input,
  ``reduce_scatter`` one rank's output (the model's input tensor divided by the group size),
  ``all_to_all`` everything one rank sends;
* ``nccl_tests_bytes`` is the size nccl-tests reports ("size"): the same for all_reduce and
  all_to_all, ``n`` times ``message_bytes`` for all_gather (the gathered output) and
  reduce_scatter (the input), ``n`` being the group size.

Bus bandwidth uses nccl-tests' size and factors, so figures compare with its ``busbw`` column:
``2(n-1)/n`` for all_reduce and ``(n-1)/n`` for the three others.  Plans and cases count in
nccl-tests' size (the buffers a rank allocates); only the written rows convert.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class CommDtype:
    """A dtype of the benchmarks: short key, database spelling, torch name and bit layout."""

    key: str  # what test ids and --comm-dtypes use: bf16, fp16, fp32, int8
    # The Ascend HCCL microbenchmark's spelling (msmodeling comm_bench ``_DTYPE_TO_CSV``):
    # DT_BF16, DT_FP16, DT_FLOAT, DT_INT8.  Its calibration reader accepts DT_BF16, DT_FP16 and
    # DT_FLOAT; no Ascend reader names int8 any other way.
    db_name: str
    torch_name: str
    itemsize: int
    mantissa_bits: int  # explicit fraction bits; 0 for integers
    legacy_names: tuple[str, ...] = ()  # what files written before used (the compute databases' spelling)

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
        "fp16": CommDtype("fp16", "DT_FP16", "float16", 2, 10, ("DT_FLOAT16",)),
        "fp32": CommDtype("fp32", "DT_FLOAT", "float32", 4, 23, ("FLOAT",)),
        "int8": CommDtype("int8", "DT_INT8", "int8", 1, 0, ("INT8",)),
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
        "dt_fp16": "fp16",
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
    """The dtype a database cell names (``DT_BF16``, ``BF16``, ``DT_FLOAT16``, ``FLOAT`` ...), or None."""
    text = name.strip().upper()
    for dtype in COMM_DTYPES.values():
        for spelling in (dtype.db_name, *dtype.legacy_names):
            if text in (spelling, spelling.removeprefix("DT_"), "DT_" + spelling):
                return dtype
    return None


@dataclass(frozen=True)
class Collective:
    """One collective: its name, its database file, and how its message divides among ranks."""

    name: str  # all_reduce, all_gather, reduce_scatter, all_to_all
    hcom_name: str  # the HCCL op name in the database file name
    chunked: bool  # the message is n equal chunks, one per rank (all but all_reduce)
    # message_bytes is one rank's chunk: all_gather's input, reduce_scatter's output
    rank_chunk: bool = False

    @property
    def file_name(self) -> str:
        return f"hcom_{self.hcom_name}_.csv"

    def bus_factor(self, num_devices: int) -> float:
        """nccl-tests' busbw / algbw factor for a group of ``num_devices``."""
        if num_devices < 1:
            raise ValueError(f"a group has at least one device, not {num_devices}")
        share = (num_devices - 1) / num_devices
        return 2 * share if self.name == "all_reduce" else share

    def size_ratio(self, num_devices: int) -> int:
        """nccl_tests_bytes / message_bytes: the group size for all_gather and reduce_scatter, else 1."""
        if num_devices < 1:
            raise ValueError(f"a group has at least one device, not {num_devices}")
        return num_devices if self.rank_chunk else 1

    def message_bytes(self, nccl_tests_bytes: int, num_devices: int) -> int:
        """The size the Ascend performance model looks rows up by, from nccl-tests' size."""
        ratio = self.size_ratio(num_devices)
        if nccl_tests_bytes % ratio:
            raise ValueError(f"{self.name}: {nccl_tests_bytes} bytes are not {num_devices} equal chunks")
        return nccl_tests_bytes // ratio

    def nccl_tests_bytes(self, message_bytes: int, num_devices: int) -> int:
        """nccl-tests' size of a row whose ``message_bytes`` the Ascend performance model reads."""
        return message_bytes * self.size_ratio(num_devices)

    def granule_bytes(self, dtype: CommDtype, num_devices: int) -> int:
        """What ``message_bytes`` must be a multiple of for this op, dtype and group size."""
        return dtype.itemsize * (num_devices if self.chunked else 1)


COLLECTIVES: Mapping[str, Collective] = MappingProxyType(
    {
        "all_reduce": Collective("all_reduce", "allReduce", chunked=False),
        "all_gather": Collective("all_gather", "allGather", chunked=True, rank_chunk=True),
        "reduce_scatter": Collective("reduce_scatter", "reduceScatter", chunked=True, rank_chunk=True),
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
