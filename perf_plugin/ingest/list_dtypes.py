"""The dtype of a ``cat``'s tensors, which the profiler does not record for a tensor list.

Two pieces of evidence in a CUDA trace settle it:

* PyTorch's CUDA ``cat`` launches its batched-copy kernels (``CatArrayBatchedCopy*``) only when
  every input has the output's dtype, and instantiates them on an opaque element type of that
  size (``OpaqueType<2u>``): such a kernel says that all the row's tensors share one dtype, and
  its size in bytes;
* the operators that run next on the same thread read the result: the first of them with a tensor
  argument of the result's shape and of that element size records the dtype.

When both agree, the row's empty dtype slots take that dtype.  Where no reader in sight takes
the result as it is (attention reshapes it first: MLA's ``cat`` of the rotary and plain halves
of a query), the trace as a whole can still settle it: when every tensor of that element size
the profile recorded has one dtype (a BF16 model records no FLOAT16 tensor), the cat's is that
one (``trace_dtypes_by_size``).

A cat of views that are not contiguous (``torch.stack`` of strided halves: ERNIE-4.5's rotary
interleave) launches no batched copy but one copy per input, and a copy that converts nothing
is instantiated on its element type by name (``gpu_kernel_impl_nocast<direct_copy_kernel_cuda
... {lambda(c10::BFloat16)#1}>``): where every kernel of the row is such a copy of one type,
that type is every slot's dtype (``copy_dtype``; a converting copy loads ``WithCast`` and says
nothing of its inputs).

A cat of one contiguous tensor (the list of one block's output a linear-attention decode step
concatenates: MiniMax's) launches no kernel either: CUDA copies it with one device-to-device
``cudaMemcpyAsync`` (``Memcpy DtoD``), which moves bytes of no element type.  It is read as a
CPU trace's cat is, below: by the views of its result it records as children, then its readers.

A CPU trace launches no kernels.  There a cat that copies its inputs one by one into views of
its result (``result.narrow(...).copy_(input)``: GPT-OSS's rotary halves, on more than one
thread; a small cat, or any on one thread, copies serially) records those views as its
children, and a child's tensor of the result's shape is the result itself: its dtype is the
cat's (``written_dtype``).  Otherwise the first reader of the result's shape alone gives the
dtype (a cat of mixed dtypes, which promotes, is not told apart from one of the result's), and
where nothing in sight reads it (GPT-OSS's decode rotary halves, read by attention after the
key cache's update), the trace as a whole: when every tensor of the inputs' shapes the profile
recorded (the halves are the arguments of the arithmetic that made them) has one dtype, the cat's
is that one (``trace_dtypes_by_shape``).  Anything else (a cat of mixed dtypes on CUDA, two
dtypes of the size in the trace, a CPU cat of shapes recorded in two dtypes or none) leaves them
empty: the row then says why it cannot be replayed rather than carry a guess.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence

from perf_plugin.ingest.trace_attribution import OpSample
from perf_plugin.trace.args import tensor_args
from perf_plugin.trace.events import TraceOp
from perf_plugin.trace.mapped import MappedOp, Slot

CAT_KERNEL = re.compile(r"CatArrayBatchedCopy.*?OpaqueType<(\d+)u?>")
ELEMENT_BYTES = {"DT_BF16": 2, "FLOAT16": 2, "FLOAT": 4, "DOUBLE": 8, "INT64": 8, "INT32": 4, "INT16": 2,
                 "INT8": 1, "UINT8": 1, "BOOL": 1}  # fmt: skip
COPY_KERNEL = re.compile(r"gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda.*?\{lambda\(([^()]+)\)#1\}")
# the element types a copy kernel names, in the Ascend spelling the rows use
COPY_TYPES = {"c10::BFloat16": "DT_BF16", "c10::Half": "FLOAT16", "float": "FLOAT", "double": "DOUBLE",
              "long": "INT64", "int": "INT32", "short": "INT16", "signed char": "INT8", "unsigned char": "UINT8",
              "bool": "BOOL"}  # fmt: skip
MEMCPY = "Memcpy "  # a copy engine's transfer (``Memcpy DtoD (Device -> Device)``): bytes, no element type
READERS_LOOKED_AT = 8  # the result is read right away in the models this is for (RoPE, KV caches)


def cat_element_bytes(kernels: Sequence[str]) -> int | None:
    """The element size of a cat's batched-copy kernels (None unless all agree)."""
    sizes = {int(match.group(1)) for name in kernels if (match := CAT_KERNEL.search(name))}
    return sizes.pop() if len(sizes) == 1 else None


def copy_dtype(kernels: Sequence[str]) -> str | None:
    """The dtype every kernel of ``kernels`` copies without converting (None unless all are such
    copies of one known type)."""
    types = {match.group(1) if (match := COPY_KERNEL.search(name)) else None for name in kernels}
    if len(types) != 1 or None in types:
        return None
    return COPY_TYPES.get(types.pop() or "")


def trace_dtypes_by_size(ops: Iterable[TraceOp]) -> dict[int, frozenset[str]]:
    """Element size -> the dtypes of that size among every tensor argument the trace recorded."""
    found: dict[int, set[str]] = {}
    for op in ops:
        for tensor in tensor_args(op):
            size = ELEMENT_BYTES.get(tensor.dtype)
            if size is not None:
                found.setdefault(size, set()).add(tensor.dtype)
    return {size: frozenset(dtypes) for size, dtypes in found.items()}


def trace_dtypes_by_shape(ops: Iterable[TraceOp]) -> dict[tuple[int, ...], frozenset[str]]:
    """Shape -> the dtypes among every tensor argument of that shape the trace recorded."""
    found: dict[tuple[int, ...], set[str]] = {}
    for op in ops:
        for tensor in tensor_args(op):
            if tensor.dtype in ELEMENT_BYTES:
                found.setdefault(tuple(tensor.shape), set()).add(tensor.dtype)
    return {shape: frozenset(dtypes) for shape, dtypes in found.items()}


def resolve_cat_dtypes(
    mapped: MappedOp, sample: OpSample, following: Sequence[OpSample],
    trace_dtypes: Mapping[int, frozenset[str]] | None = None,
    shape_dtypes: Mapping[tuple[int, ...], frozenset[str]] | None = None,
) -> MappedOp:
    """``mapped`` with its empty dtype slots filled where the evidence above settles them."""
    if mapped.kernel_type != "ConcatD" or len(mapped.outputs) != 1 or mapped.outputs[0].shape is None:
        return mapped
    if all(slot.dtype for slot in (*mapped.inputs, *mapped.outputs)):
        return mapped
    copied = copy_dtype(sample.kernels)
    if copied is not None:
        return _with_dtype(mapped, copied)
    size = cat_element_bytes(sample.kernels)
    # no kernel (a CPU trace) or only a memcpy: nothing of the element type, as a CPU trace's cat
    untyped_copy = all(name.startswith(MEMCPY) for name in sample.kernels)
    if size is None and not untyped_copy:
        return mapped
    shape = mapped.outputs[0].shape
    written = written_dtype(sample.descendants(), shape) if untyped_copy else None
    if written is not None:
        return _with_dtype(mapped, written)
    for reader in following[:READERS_LOOKED_AT]:
        for tensor in tensor_args(reader.op):
            # without a kernel that names its size (``size`` None) the reader alone says
            if tensor.shape == shape and tensor.dtype in ELEMENT_BYTES and size in (None, ELEMENT_BYTES[tensor.dtype]):
                return _with_dtype(mapped, tensor.dtype)
    if size is None:  # no kernel named the size: the dtypes the trace's tensors of the inputs' shapes had
        shapes = {tuple(slot.shape) for slot in mapped.inputs if slot.shape is not None}
        recorded = set().union(*((shape_dtypes or {}).get(shape, frozenset()) for shape in shapes))
        return _with_dtype(mapped, recorded.pop()) if len(recorded) == 1 else mapped
    only = (trace_dtypes or {}).get(size, frozenset())
    return _with_dtype(mapped, next(iter(only))) if len(only) == 1 else mapped


def written_dtype(children: Iterable[TraceOp], shape: tuple[int, ...]) -> str | None:
    """The dtype of a tensor of the result's ``shape`` among a CPU cat's own children (the views
    of its result it copies the inputs into), None where none has one."""
    for child in children:
        for tensor in tensor_args(child):
            if tensor.shape == shape and tensor.dtype in ELEMENT_BYTES:
                return tensor.dtype
    return None


def _with_dtype(mapped: MappedOp, dtype: str) -> MappedOp:
    def fill(slots: tuple[Slot, ...]) -> tuple[Slot, ...]:
        return tuple(Slot(s.shape, s.dtype or (dtype if s.shape is not None else "")) for s in slots)

    return dataclasses.replace(mapped, inputs=fill(mapped.inputs), outputs=fill(mapped.outputs))
