"""KV-cache writes: ``ReshapeAndCacheNdKernel`` (ATB) and ``ScatterNdUpdate`` (aclnn).

``ReshapeAndCacheNdKernel`` rows are ``key;value;key_cache;value_cache;slot_indices ->
key_cache;value_cache``: ``key [T,H,Dk]`` and ``value [T,H,Dv]`` are written, token ``t`` to the
slot ``slot_indices[t]`` of the paged caches ``[num_blocks,block_size,H,D]`` (block
``s // block_size``, offset ``s % block_size``); the outputs are the two caches, updated in
place.  That is the layout of Ascend/msmodeling's replay script (``ReshapeAndCacheNdKernel_run.py``,
five inputs, slot indices INT32) and of the ATB binding in Ascend/op-plugin (``atb::
_npu_reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache,
Tensor slot_indices) -> ()``).  On an NPU the replay calls it as vllm-ascend does
(``vllm_ascend/device/device_op.py``: ``torch_npu._npu_reshape_and_cache(key=..., value=...,
key_cache=..., value_cache=..., slot_indices=...)``), under the name op_mapping.yaml gives,
``atb._npu_reshape_and_cache``.  MLA rows (``kv_c [T,1,512]`` and ``k_pe [T,1,64]``) have
different key and value widths; each pair only has to agree with its own cache.

``ScatterNdUpdate`` rows are ``data;indices;updates -> data``: ``indices [...,K]`` address the
first ``K`` dims of ``data`` and ``updates`` is ``indices.shape[:-1] + data.shape[K:]`` (the DSA
indexer cache write ``data [slots,128]``, ``indices [N,1]`` INT32, ``updates [N,128]``, per
msmodeling's ``ScatterNdUpdate_run.py``).  On an NPU: ``torch_npu.npu_scatter_nd_update_``, the
in-place variant vllm-ascend calls; the out-of-place ``npu_scatter_nd_update`` clones ``data``
first (op-plugin ``ScatterNdUpdateKernelNpuOpApi.cpp``), a copy kernel in every timed call.

Portable path: one ``index_put_`` per cache (``Tensor.index_put_`` takes INT32 indices), into
the caches viewed as ``[slots,...]``.  Slots and index rows are distinct and in range, so the
writes do not race.  Both ops write their inputs, and a timed call's result feeds the next, so
the caches start filled with a constant no input value takes (``_SENTINEL``): the reference
rebuilds them from that constant instead of reading the caches a run already wrote, and any
write outside the addressed slots shows as a mismatch.  Verification is exact (tolerance 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.base import CaseBuildError, OpReplay
from perf_plugin.replay.tensors import KernelRow, TensorSpec, shape_text

if TYPE_CHECKING:
    import torch

INDEX_DTYPES = frozenset({"INT32", "INT64"})
# Cache contents no drawn input has: floats are drawn in +-[0.5, 1.5], integers in [1, 100).
_FLOAT_SENTINEL = 2.0
_INT_SENTINEL = 101


def _sentinel(shape: tuple[int, ...], dtype: "torch.dtype", device: "torch.device | str") -> "torch.Tensor":
    """A cache of ``shape`` holding a value no drawn input has."""
    import torch

    value: float | int | bool = _FLOAT_SENTINEL if dtype.is_floating_point else _INT_SENTINEL
    if dtype == torch.bool:
        value = True
    return torch.full(shape, value, dtype=dtype, device=device)


def _distinct_rows(count: int, total: int, device: "torch.device", generator: "torch.Generator") -> "torch.Tensor":
    """``count`` distinct positions in ``[0, total)`` (int64), in random order."""
    import torch

    return torch.randperm(total, generator=generator, device=device)[:count]


def _slots(row: KernelRow, names: tuple[str, ...]) -> tuple[TensorSpec, ...]:
    inputs = row.inputs
    if len(inputs) < len(names) or not all(s.present for s in inputs[: len(names)]):
        raise CaseBuildError(
            f"{row.kernel_type} needs input slots {';'.join(names)}, got "
            + ";".join(shape_text(s) for s in inputs)
        )
    extra = [i for i, s in enumerate(inputs[len(names) :], start=len(names)) if s.present]
    if extra:
        raise CaseBuildError(f"{row.kernel_type} has an unexpected input in slot {extra[0]}")
    if any(s.format.startswith("FRACTAL") for s in inputs[: len(names)]):
        raise CaseBuildError(f"{row.kernel_type}: private-format (FRACTAL_NZ) caches are not replayed; ND only")
    return inputs[: len(names)]


def _outputs_are(row: KernelRow, expected: tuple[TensorSpec, ...], names: str) -> None:
    got = tuple((s.shape, s.dtype) for s in row.present_outputs)
    if got != tuple((s.shape, s.dtype) for s in expected):
        raise CaseBuildError(
            f"{row.kernel_type} outputs should be the updated {names} "
            + ";".join(f"{shape_text(s)} {s.dtype}" for s in expected)
            + ", got "
            + (";".join(f"{shape_text(s)} {s.dtype}" for s in row.present_outputs) or "none")
        )


class _CacheWriteReplay(OpReplay):
    """Exact verification; the reference rebuilds the written tensors from the sentinel."""

    def tolerance(self, output: TensorSpec) -> float:
        return 0.0


class ReshapeAndCacheReplay(_CacheWriteReplay):
    kernel_types = ("ReshapeAndCacheNdKernel",)
    npu_api = "atb._npu_reshape_and_cache"

    def _specs(self, row: KernelRow) -> tuple[TensorSpec, ...]:
        key, value, key_cache, value_cache, slots = _slots(
            row, ("key", "value", "key_cache", "value_cache", "slot_indices")
        )
        assert key.shape is not None and value.shape is not None and slots.shape is not None
        tokens = key.shape[0] if key.shape else -1
        for name, tensor, cache in (("key", key, key_cache), ("value", value, value_cache)):
            assert tensor.shape is not None and cache.shape is not None
            if len(tensor.shape) < 2 or len(cache.shape) != len(tensor.shape) + 1 or cache.shape[2:] != tensor.shape[1:]:
                raise CaseBuildError(
                    f"{row.kernel_type} {name}_cache {shape_text(cache)} is not [num_blocks,block_size] + the "
                    f"per-token shape of {name} {shape_text(tensor)}"
                )
            if cache.dtype != tensor.dtype:
                raise CaseBuildError(f"{row.kernel_type} {name}_cache dtype {cache.dtype} differs from {name} {tensor.dtype}")
        if value.shape[0] != tokens or slots.shape != (tokens,):
            raise CaseBuildError(
                f"{row.kernel_type} key {shape_text(key)}, value {shape_text(value)} and slot_indices "
                f"{shape_text(slots)} disagree on the token count"
            )
        if slots.dtype not in INDEX_DTYPES:
            raise CaseBuildError(f"{row.kernel_type} slot_indices dtype {slots.dtype} is not INT32/INT64")
        for cache in (key_cache, value_cache):
            assert cache.shape is not None
            if tokens > cache.shape[0] * cache.shape[1]:
                raise CaseBuildError(
                    f"{row.kernel_type} {tokens} tokens do not fit the {cache.shape[0] * cache.shape[1]} slots of "
                    f"{shape_text(cache)}: slots would repeat"
                )
        _outputs_are(row, (key_cache, value_cache), "key_cache;value_cache")
        return key, value, key_cache, value_cache, slots

    def check(self, row: KernelRow) -> None:
        self._specs(row)

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        key, value, key_cache, value_cache, slots = self._specs(row)
        assert key_cache.shape is not None and value_cache.shape is not None and slots.shape is not None
        capacity = min(c.shape[0] * c.shape[1] for c in (key_cache, value_cache) if c.shape is not None)
        slot_indices = _distinct_rows(slots.shape[0], capacity, device, generator).to(slots.torch_dtype())
        return (
            self.random(key, device, generator),
            self.random(value, device, generator),
            _sentinel(key_cache.shape, key_cache.torch_dtype(), device),
            _sentinel(value_cache.shape, value_cache.torch_dtype(), device),
            slot_indices,
        )

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        key, value, key_cache, value_cache, slot_indices = args
        assert self.npu_api is not None
        kwargs: Mapping[str, Any] = {
            "key": key, "value": value, "key_cache": key_cache, "value_cache": value_cache, "slot_indices": slot_indices,
        }  # fmt: skip
        return ApiCall(self.npu_api or "", (), kwargs, written=("key_cache", "value_cache"))

    def run(
        self,
        key: "torch.Tensor",
        value: "torch.Tensor",
        key_cache: "torch.Tensor",
        value_cache: "torch.Tensor",
        slot_indices: "torch.Tensor",
    ) -> tuple["torch.Tensor", "torch.Tensor"]:
        # [num_blocks, block_size, ...] viewed as [slots, ...]: slot s is block s // block_size,
        # offset s % block_size, which is what the flat index of a contiguous cache means.
        key_cache.view(-1, *key_cache.shape[2:]).index_put_((slot_indices,), key)
        value_cache.view(-1, *value_cache.shape[2:]).index_put_((slot_indices,), value)
        return key_cache, value_cache

    def reference(
        self,
        key: "torch.Tensor",
        value: "torch.Tensor",
        key_cache: "torch.Tensor",
        value_cache: "torch.Tensor",
        slot_indices: "torch.Tensor",
    ) -> tuple["torch.Tensor", "torch.Tensor"]:
        fresh = [_sentinel(tuple(c.shape), c.dtype, "cpu") for c in (key_cache, value_cache)]
        return self.run(key.cpu(), value.cpu(), fresh[0], fresh[1], slot_indices.cpu())


class ScatterNdUpdateReplay(_CacheWriteReplay):
    kernel_types = ("ScatterNdUpdate",)
    npu_api = "torch_npu.npu_scatter_nd_update_"

    def _specs(self, row: KernelRow) -> tuple[TensorSpec, TensorSpec, TensorSpec]:
        data, indices, updates = _slots(row, ("data", "indices", "updates"))
        assert data.shape is not None and indices.shape is not None and updates.shape is not None
        if indices.dtype not in INDEX_DTYPES:
            raise CaseBuildError(f"{row.kernel_type} indices dtype {indices.dtype} is not INT32/INT64")
        depth = indices.shape[-1] if indices.shape else 0
        if not 1 <= depth <= len(data.shape):
            raise CaseBuildError(
                f"{row.kernel_type} indices {shape_text(indices)} must end in K (1 <= K <= rank of data "
                f"{shape_text(data)}): each row addresses the first K dims"
            )
        expected = indices.shape[:-1] + data.shape[depth:]
        if updates.shape != expected:
            raise CaseBuildError(
                f"{row.kernel_type} updates {shape_text(updates)} should be {shape_text(expected)} "
                f"(indices {shape_text(indices)} without K, then data {shape_text(data)} after its first {depth} dims)"
            )
        if updates.dtype != data.dtype:
            raise CaseBuildError(f"{row.kernel_type} updates dtype {updates.dtype} differs from data {data.dtype}")
        addressable = math.prod(data.shape[:depth])
        count = math.prod(indices.shape[:-1])
        if count > addressable:
            raise CaseBuildError(
                f"{row.kernel_type} {count} index rows do not fit the {addressable} rows of data {shape_text(data)}: "
                "rows would repeat and the result would depend on the write order"
            )
        _outputs_are(row, (data,), "data")
        return data, indices, updates

    def check(self, row: KernelRow) -> None:
        self._specs(row)

    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        import torch

        data, indices, updates = self._specs(row)
        assert data.shape is not None and indices.shape is not None
        depth = indices.shape[-1]
        lead = data.shape[:depth]
        flat = _distinct_rows(math.prod(indices.shape[:-1]), max(1, math.prod(lead)), device, generator)
        columns = []
        for size in reversed(lead):  # unravel the flat row numbers into K coordinates
            columns.append(flat % size)
            flat = torch.div(flat, size, rounding_mode="floor")
        index = torch.stack(columns[::-1], dim=-1).reshape(indices.shape).to(indices.torch_dtype())
        assert data.shape is not None
        return _sentinel(data.shape, data.torch_dtype(), device), index, self.random(updates, device, generator)

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall:
        data, indices, updates = args
        return self.api_call(data, indices, updates)  # returns ``data``, updated in place

    def run(
        self, data: "torch.Tensor", indices: "torch.Tensor", updates: "torch.Tensor"
    ) -> "torch.Tensor":
        # the K columns of ``indices`` index the first K dims of ``data``: one advanced-indexing
        # write; unbind gives views, so this is one kernel
        return data.index_put_(indices.unbind(-1), updates)

    def reference(
        self, data: "torch.Tensor", indices: "torch.Tensor", updates: "torch.Tensor"
    ) -> "torch.Tensor":
        fresh = _sentinel(tuple(data.shape), data.dtype, "cpu")
        return self.run(fresh, indices.cpu(), updates.cpu())

