"""The indices of ``aten::index`` and ``aten::index_put_``, recovered from the operators they called.

The profiler records nothing of a list of optional tensors (``Tensor?[] indices``): its dims
are ``[]`` and its type ``""``, as for a ``None`` argument.  Advanced indexing leaves the
indices' traces in its callees, though (``at::native::make_info``, ATen's TensorIterator set-up
for ``index`` and the non-accumulating ``index_put_``):

* every index tensor is reshaped to the result's broadcast shape, so each is the input of one
  ``aten::reshape`` callee, in list order, with its dims and element type;
* the indexed tensor is restrided over the result (``aten::as_strided``, whose ``Concrete
  Inputs`` hold the new sizes and strides): its leading unindexed dimensions, then the indices'
  broadcast shape with stride 0, then the trailing unindexed dimensions.  How many dimensions
  lead tells how many ``None`` entries come before the first index tensor.

This covers indices that are adjacent and integer (``x[idx]``, ``x[:, idx]``, ``x[a, b]``), and a
lone boolean mask of a gather (``x[mask]``, ``x[:, mask]``): ``index`` turns a mask into integer
indices through an ``aten::nonzero`` callee, whose input is the mask and whose results' length
is the count of true elements.  Non-adjacent indices (the tensor is permuted first), masks mixed
with other indices or in a write, and on CUDA an accumulating ``index_put_`` (it sorts a linear
index instead: bounds checks and index arithmetic, no restride) are not recovered: the row keeps
its measurement and has no replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from perf_plugin.trace.args import Shape, Tensor, broadcast, concrete_value, contiguous_strides, is_int_list, tensor_arg
from perf_plugin.trace.events import TraceOp

# Operators whose argument 1 is ``Tensor?[] indices``; the non-accumulating index_put_ does
# its work in ``_index_put_impl_``, whose callees are the ones read.
INDEXING_OPERATORS = frozenset({"aten::index", "aten::index_put_", "aten::index_put", "aten::_index_put_impl_"})
INDICES_ARGUMENT = 1
_INTEGER_INDEX_DTYPES = frozenset({"INT64", "INT32"})


def recover_indices(op: TraceOp) -> list[Tensor | None] | None:
    """The ``indices`` list of an indexing operator (``None`` for an unindexed leading
    dimension), or None where the callees do not determine it."""
    if op.name not in INDEXING_OPERATORS or _recorded(op):
        return None
    source = tensor_arg(op, 0)
    worker = _worker(op)
    if source is None or worker is None:
        return None
    callees = worker.children
    indices = [tensor for child in callees if child.name == "aten::reshape" and (tensor := _index_tensor(child))]
    restrides = [child for child in callees if child.name == "aten::as_strided"]
    if not indices or len(restrides) != 1 or len(indices) > len(source.shape):
        return None
    leading = _leading_dims(source, restrides[0], indices)
    if leading is None:
        return None
    masks = [child for child in callees if child.name == "aten::nonzero"]
    if not masks:
        return [None] * leading + list(indices)
    mask = _mask(op, masks, indices)
    if mask is None or mask.shape != source.shape[leading : leading + len(indices)]:
        return None
    return [None] * leading + [mask]


def _mask(op: TraceOp, masks: Sequence[TraceOp], indices: Sequence[Tensor]) -> Tensor | None:
    """The boolean mask of ``x[mask]``: ``index`` turns it into one index tensor per mask
    dimension (``nonzero``), whose common length is the count of true elements.  Only a lone
    mask of a gather: a write's count is not in its output's shape."""
    if op.name != "aten::index" or len(masks) != 1:
        return None
    mask = tensor_arg(masks[0], 0)
    if mask is None or mask.dtype != "BOOL" or len(mask.shape) != len(indices):
        return None
    return mask if len({tensor.shape for tensor in indices}) == 1 and len(indices[0].shape) == 1 else None


def indexed_result_shape(op: TraceOp) -> Shape | None:
    """The shape of ``aten::index``'s result: the sizes its callee restrided the tensor to.
    (A boolean mask's result cannot be computed on ``meta`` tensors, whose values are unknown.)"""
    restrides = [child for child in op.children if child.name == "aten::as_strided"]
    sizes = _concrete_list(restrides[0], 1) if op.name == "aten::index" and len(restrides) == 1 else None
    return tuple(sizes) if sizes is not None else None


def _recorded(op: TraceOp) -> bool:
    """True where the profiler did record the list (a future torch may)."""
    dims = op.dims[INDICES_ARGUMENT] if INDICES_ARGUMENT < len(op.dims) else []
    return bool(dims)


def _worker(op: TraceOp) -> TraceOp | None:
    """The operator whose callees set up the indexing: ``index_put_`` (and the out-of-place
    ``index_put``, through it) delegates to ``_index_put_impl_``."""
    if op.name in ("aten::index", "aten::_index_put_impl_"):
        return op
    impl = [node for node in op.descendants() if node.name == "aten::_index_put_impl_"]
    return impl[0] if len(impl) == 1 else None


def _index_tensor(reshape: TraceOp) -> Tensor | None:
    tensor = tensor_arg(reshape, 0)
    return tensor if tensor is not None and tensor.dtype in _INTEGER_INDEX_DTYPES else None


def _leading_dims(source: Tensor, restride: TraceOp, indices: Sequence[Tensor]) -> int | None:
    """How many unindexed dimensions precede the indexed ones, from the restrided sizes and
    strides; None where no placement of the indices reproduces them."""
    seen = tensor_arg(restride, 0)
    sizes, strides = _concrete_list(restride, 1), _concrete_list(restride, 2)
    if seen is None or seen.shape != source.shape or sizes is None or strides is None:
        return None  # the tensor was permuted first (non-adjacent indices) or the values are missing
    source_strides = source.strides if source.strides is not None else contiguous_strides(source.shape)
    shape = _broadcast_shape(indices)
    if shape is None:
        return None
    indexed = len(indices)
    for leading in range(len(source.shape) - indexed + 1):
        trailing = slice(leading + indexed, None)
        expected_sizes = [*source.shape[:leading], *shape, *source.shape[trailing]]
        expected_strides = [*source_strides[:leading], *([0] * len(shape)), *source_strides[trailing]]
        if list(sizes) == expected_sizes and list(strides) == expected_strides:
            return leading
    return None


def _broadcast_shape(indices: Sequence[Tensor]) -> Shape | None:
    shape: Shape | None = indices[0].shape
    for tensor in indices[1:]:
        shape = broadcast(shape, tensor.shape) if shape is not None else None
    return shape


def _concrete_list(op: TraceOp, index: int) -> list[int] | None:
    raw: Any = op.concrete[index] if index < len(op.concrete) else ""
    value = concrete_value(raw) if raw != "" else None
    return list(value) if is_int_list(value) else None
