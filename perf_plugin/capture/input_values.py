"""Record, in a real model run, the values a kernel's time depends on: ``capture_input_values``.

A grouped GEMM's time depends on how many rows each expert gets, which the shapes do not say.
Wrap the profiled step in ``capture_input_values`` (inside or outside ``torch.profiler.profile``)::

    with torch.profiler.profile(activities=..., record_shapes=True) as prof:
        with capture_input_values("trace.values.json"):
            model(batch)
    prof.export_chrome_trace("trace.json")

Every call of a watched function (``WATCHED``) is then wrapped in a profiler range named
``perf_values/<token>/<n>`` (``perf_plugin.trace.values_file``), and the values of its small
integer tensor arguments (and of top-k's floating input, kept as quantiles, of a division's
operands, kept as the share of their elements that are zero, of a softmax's input, kept as
the share of its elements that are masked and their runs per row, and of a gather's index, kept as
the share of its values that are distinct) are copied to the host: on an
accelerator asynchronously, on a side stream of the device's own stream API
(``perf_plugin.backends.streams``: ``torch.npu`` on an NPU) that waits for the producing work,
into pinned memory, so the step gains no synchronisation and its stream no extra work; on the
CPU they are read directly.  When the block ends the capture waits for its copies and writes the values file, which ``perfdb ingest``
reads beside the trace (or beside an Ascend profile directory).

The torch_npu MoE operators (the grouped GEMMs' group lists, the token permutation's routing) are
watched as operators: ``torch_npu.npu_grouped_matmul`` is
``torch.ops.npu.npu_grouped_matmul`` itself (torch_npu's ``__init__`` binds every
``torch.ops.npu`` operator into its namespace), and a call of an operator packet or overload
reaches the active ``TorchFunctionMode`` as that packet or overload (torch's operator call path
checks for modes), so the capture watches the packet and each overload.  A ``group_list`` given
as counts (``group_list_type=1``) is recorded as cumulative ends, the rows' form.  None of the
NPU path has run on an NPU: it is tested on the CPU with the real schemas registered in a
stand-in library.

What it costs the profiled step: one Python ``__torch_function__`` dispatch per torch call made
from Python (a ``TorchFunctionMode``), a profiler range and a copy per watched call.  Device
kernels' own durations are not changed; the copies show in the trace as host<->device
transfers, which ingest leaves out.  Calls made from C++ (inside a compiled graph) are not seen.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perf_plugin.capture.pending_copies import PendingCopy, PendingRows, Selection, readable_rows
from perf_plugin.trace.values_file import CapturedCall, CapturedValues, mark_name, write_values_file

if TYPE_CHECKING:
    import torch

# Integer tensors with more elements than this are not recorded (indices of every token): the
# data that changes a kernel's time is its counts, offsets and lengths, a few per group.
MAX_VALUES = 4096
# Floating inputs are copied whole to the host, where their quantiles are taken: a router's
# scores over a prefill's tokens, not a vocabulary's logits over a batch.
MAX_FLOATING_VALUES = 65536
# Index inputs are copied whole too, where their distinct values are counted: a prefill's
# (token, slot) pairs, 8192 tokens at top-8.
MAX_INDEX_VALUES = 65536


@dataclass(frozen=True)
class Watched:
    """A function whose time depends on some arguments' values: per traced operator argument
    position, the keyword and the Python position (None: keyword-only) it is passed by.

    ``list_type``: (keyword, Python position, default) of the argument that says how a group
    list is laid out, torch_npu's ``group_list_type`` (0: the cumulative end row of each group,
    1: the rows of each group).  The values are recorded as cumulative ends either way, which is
    what a row's ``Input Values`` hold; a layout other than 0 or 1 records no values.
    """

    function: str  # dotted name, resolved when the capture starts; ``torch.ops.<ns>.<op>``: every overload
    arguments: dict[int, tuple[str, int | None]]
    list_type: tuple[str, int | None, int] | None = None
    # A floating input whose values set the kernel's time (top-k's): recorded as ``QUANTILES``
    # quantiles of its values, not the values themselves.
    floating: bool = False
    # A top-k, ``(input, k, dim=-1, largest=True, ...)``: its floating input's rows' selection
    # depths are recorded too (``perf_plugin.capture.selection_depth``).
    selects: bool = False
    # Floating inputs whose zero elements set the kernel's time (a division's operands): recorded as
    # the share of each input's elements that are zero (``CapturedCall.zeros``).
    zeros: bool = False
    # A softmax, ``(input, dim, ...)``: the masked elements of its input's rows are recorded
    # (``perf_plugin.capture.masked_rows``).
    masks: bool = False
    # An integer index whose repetitions set the kernel's time (a gather's ``x[index]``): recorded
    # as the share of its values that are distinct (``CapturedCall.distinct``); a call given no
    # integer index tensor there (a slice, a mask, a tuple) runs unwatched, without a range.
    distinct: bool = False
    # A module that registers the operator when imported (``torch.ops.torch_attn`` exists once
    # ``torch.nn.attention.varlen`` is): imported before the function is looked up.
    module: str | None = None


WATCHED: tuple[Watched, ...] = (
    # aten::_grouped_mm(self, mat2, offs, bias, out_dtype): offs = the end row of every group
    Watched("torch._grouped_mm", {2: ("offs", 2)}),
    Watched("torch.nn.functional.grouped_mm", {2: ("offs", None)}),
    # aten::_scaled_grouped_mm(self, mat2, scale_a, scale_b, offs, ...)
    Watched("torch._scaled_grouped_mm", {4: ("offs", 4)}),
    # torch_npu (tests/fixtures/torch_npu/schemas.txt); ``torch_npu.<op>`` is ``torch.ops.npu.<op>``.
    # npu_grouped_matmul(Tensor[] x, Tensor[] weight, *, bias, scale, offset, antiquant_scale,
    # antiquant_offset, per_token_scale, Tensor? group_list (.List: int[]?), ..., int? group_list_type=0, ...)
    Watched("torch.ops.npu.npu_grouped_matmul", {8: ("group_list", None)}, ("group_list_type", None, 0)),
    # npu_grouped_matmul_swiglu_quant(Tensor x, Tensor weight, Tensor group_list, ...): cumulative ends
    Watched("torch.ops.npu.npu_grouped_matmul_swiglu_quant", {2: ("group_list", 2)}),
    # npu_moe_token_permute(Tensor tokens, Tensor indices, int? num_out_tokens, bool padded_mode):
    # the routing, each token's top-k expert ids, which sets how many rows each expert's run of the
    # output gets and which tokens the kernel gathers; npu_moe_token_unpermute(Tensor permuted_tokens,
    # Tensor sorted_indices, ...): the row each (token, slot) pair was permuted to
    Watched("torch.ops.npu.npu_moe_token_permute", {1: ("indices", 1)}),
    Watched("torch.ops.npu.npu_moe_token_unpermute", {1: ("sorted_indices", 1)}),
    # aten::topk(self, k, dim, largest, sorted): its radix selection ends sooner on spread values
    # than on close ones and ties (on an H200, [512,8] top-2: 5.98 us on uniform values, 7.23 on a
    # softmax of near-equal logits, 8.48 on equal values), and a launch takes as long as its
    # deepest rows: recorded as quantiles and as its rows' selection depths
    Watched("torch.topk", {0: ("input", 0)}, floating=True, selects=True),
    Watched("torch.Tensor.topk", {0: ("self", 0)}, floating=True, selects=True),
    # Variable-length attention: a prefill of packed requests costs the sum over requests of
    # their query x KV lengths, which the packed [T, N, D] shapes do not say.
    # torch.nn.attention.varlen.varlen_attn calls torch_attn::_varlen_attn(query, key, value,
    # cu_seq_q, cu_seq_k, max_q, max_k, ...); cu_seq_* = [0, end of each request]
    Watched("torch.ops.torch_attn._varlen_attn", {3: ("cu_seq_q", 3), 4: ("cu_seq_k", 4)},
            module="torch.nn.attention.varlen"),
    # aten::_flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, ...)
    Watched("torch.ops.aten._flash_attention_forward", {3: ("cum_seq_q", 3), 4: ("cum_seq_k", 4)}),
    # npu_fusion_attention(query, key, value, head_num, input_layout, pse, padding_mask, atten_mask,
    # scale, keep_prob, pre_tockens, next_tockens, inner_precise, prefix, int[]? actual_seq_qlen,
    # int[]? actual_seq_kvlen, ...): TND's cumulative ends, host lists
    Watched("torch.ops.npu.npu_fusion_attention",
            {14: ("actual_seq_qlen", 14), 15: ("actual_seq_kvlen", 15)}),
    # aten::index(self, indices) from ``x[index]``: a gather reads each distinct source row once
    # from memory, and an MoE layer's gathers read every row once (``out[inverse_perm]``, the
    # combine) or each token top-k times (``hidden[perm // k]``, the dispatch), where the replay's
    # uniform draw with repetition reads about 63 % of the rows
    Watched("torch.Tensor.__getitem__", {1: ("indices", 1)}, distinct=True),
    # aten::div(self, other): a zero numerator takes the device's slower division (an H200
    # divided PhiMoE's router operands, a zero numerator a row, in 2.05 us, random ones in 1.12:
    # reproduce/wip/division_operand_values.py); ``a / b`` and ``a.div(b)`` reach the mode as the
    # method, ``torch.div`` as the function
    *(Watched(name, {0: (first, 0), 1: ("other", 1)}, zeros=True)
      for name, first in (("torch.div", "input"), ("torch.true_divide", "input"), ("torch.Tensor.div", "self"),
                          ("torch.Tensor.div_", "self"))),
    # aten::bmm(self, mat2): zero operands draw less power, and a batched GEMM over every expert
    # (Llama 4's experts, each fed all tokens, those routed elsewhere zeroed) runs faster on them
    # (an H200's [16,512,8192] x [16,8192,5120] bf16: 795 us with 15 of 16 rows zero, 835 on
    # random values, 764 in the model): recorded as zero shares
    *(Watched(name, {0: (first, 0), 1: ("mat2", 1)}, zeros=True)
      for name, first in (("torch.bmm", "input"), ("torch.Tensor.bmm", "self"))),
    # aten::softmax(self, dim, dtype): elements far below their row's maximum take the slower
    # exponential (an H200's GPT-OSS prefill softmax: 40.5 us on random logits, 52.3 with the
    # causal mask, 62.5 with as many masked at random places: perf_plugin.capture.masked_rows)
    *(Watched(name, {0: (first, 0)}, masks=True)
      for name, first in (("torch.softmax", "input"), ("torch.nn.functional.softmax", "input"),
                          ("torch.Tensor.softmax", "self"))),
)
OPERATORS = "torch.ops."


def _resolve(dotted: str, module: str | None = None) -> list[Any]:
    """What a call of ``dotted`` reaches a ``TorchFunctionMode`` as: the function; for an
    operator (``torch.ops.npu.npu_grouped_matmul``, which torch_npu also binds as
    ``torch_npu.npu_grouped_matmul``) its packet and every overload (``.default``, ``.List``),
    since a call through the packet arrives as the packet and one through an overload as that
    overload.  Empty when this torch (or the absent torch_npu) has no such function."""
    import importlib

    if module is not None:
        try:
            importlib.import_module(module)
        except ImportError:
            return []  # not in this torch release
    if dotted.startswith(OPERATORS):
        import torch

        namespace, _, name = dotted[len(OPERATORS):].partition(".")
        try:
            packet = getattr(getattr(torch.ops, namespace), name)
        except (AttributeError, RuntimeError):
            return []
        return [packet, *(getattr(packet, overload) for overload in packet.overloads())]
    parts = dotted.split(".")
    for split in range(len(parts) - 1, 0, -1):  # the longest importable module, then attributes
        try:
            found: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for attribute in parts[split:]:  # ``torch.Tensor.topk``: the method
                found = getattr(found, attribute)
        except AttributeError:
            return []  # not in this torch release
        return [found]
    return []


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], keyword: str, position: int | None) -> Any:
    if keyword in kwargs:
        return kwargs[keyword]
    return args[position] if position is not None and position < len(args) else None


def _recordable(value: Any) -> bool:
    import torch

    if isinstance(value, (list, tuple)):  # an ``int[]`` argument (npu_grouped_matmul.List): host values
        return len(value) <= MAX_VALUES and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    return (isinstance(value, torch.Tensor) and not value.is_floating_point() and not value.is_complex()
            and value.dtype != torch.bool and value.numel() <= MAX_VALUES)


def _recordable_index(value: Any) -> bool:
    """An integer index tensor small enough to copy whole (not a mask, a slice or a tuple), and
    contiguous: a strided one would first be gathered by a kernel of its own."""
    import torch

    return (isinstance(value, torch.Tensor) and not value.is_floating_point() and not value.is_complex()
            and value.dtype != torch.bool and 0 < value.numel() <= MAX_INDEX_VALUES and value.is_contiguous())


def _recordable_floating(value: Any) -> bool:
    """A floating tensor small enough to copy whole, and contiguous: copying a strided view to the
    host would first launch a gathering kernel in the profiled step."""
    import torch

    return (isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel() > 0
            and value.numel() <= MAX_FLOATING_VALUES and value.is_contiguous())


def _selection(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Selection | None:
    named = (("k", 1), ("dim", 2), ("largest", 3))
    k, dim, largest = (_argument(args, kwargs, name, position) for name, position in named)
    dim = -1 if dim is None else dim
    largest = True if largest is None else largest
    if not isinstance(k, int) or not isinstance(dim, int) or not isinstance(largest, bool):
        return None
    return Selection(k, dim, largest)


def _layout(watched: Watched, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """0 (cumulative ends), 1 (counts), or None for a layout the rows cannot hold."""
    if watched.list_type is None:
        return 0
    keyword, position, default = watched.list_type
    given = _argument(args, kwargs, keyword, position)
    layout = default if given is None else given
    return layout if isinstance(layout, int) and layout in (0, 1) else None


class InputValueCapture:
    """The context manager behind ``capture_input_values``; ``values`` holds what it recorded."""

    def __init__(self, path: str | Path | None, watched: tuple[Watched, ...] = WATCHED) -> None:
        self.path = Path(path) if path is not None else None
        self.values = CapturedValues(uuid.uuid4().hex[:12])
        self._watched = watched
        self._pending: dict[str, tuple[Watched, dict[int, Any], Selection | None]] = {}
        self._streams: dict[Any, Any] = {}
        self._mode: Any = None

    def __enter__(self) -> "InputValueCapture":
        from torch.overrides import TorchFunctionMode
        from torch.profiler import record_function

        # keyed by the callables themselves: one dictionary lookup per torch call of the step
        functions = {f: w for w in self._watched for f in _resolve(w.function, w.module)}
        counter = itertools.count()
        capture = self

        class _Mode(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
                kwargs = kwargs or {}
                watched = functions.get(func)
                if watched is None or (watched.distinct and not _recordable_index(
                        _argument(args, kwargs, *watched.arguments[1]))):
                    return func(*args, **kwargs)
                key = str(next(counter))
                capture._record(key, watched, args, kwargs)
                with record_function(mark_name(capture.values.token, key)):
                    return func(*args, **kwargs)

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def _record(self, key: str, watched: Watched, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        selection = _selection(args, kwargs) if watched.selects else None
        copies: dict[int, Any] = {}
        if watched.distinct:
            copies[1] = PendingCopy(_argument(args, kwargs, *watched.arguments[1]), self._streams, counts=False)
        elif watched.masks:
            value = _argument(args, kwargs, *watched.arguments[0])
            if readable_rows(value, _argument(args, kwargs, "dim", 1)):
                copies[0] = PendingRows(value, self._streams)
        elif watched.floating or watched.zeros:
            # small inputs copied whole, larger ones in blocks of whole rows along the last
            # dimension (a top-k's where it selects along it: Qwen3-Next's 512 experts' scores)
            along = selection.dim if selection is not None else -1
            for position, (keyword, python_position) in watched.arguments.items():
                value = _argument(args, kwargs, keyword, python_position)
                if _recordable_floating(value):
                    copies[position] = PendingCopy(value, self._streams, counts=False)
                elif readable_rows(value, along):
                    copies[position] = PendingRows(value, self._streams)
        else:
            layout = _layout(watched, args, kwargs)
            for position, (keyword, python_position) in watched.arguments.items():
                value = _argument(args, kwargs, keyword, python_position)
                if layout is not None and _recordable(value):
                    copies[position] = PendingCopy(value, self._streams, counts=layout == 1)
        self._pending[key] = (watched, copies, selection)

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)
        for stream in self._streams.values():
            stream.synchronize()  # after the step: the copies are done, the step was not held
        for key, (watched, copies, selection) in self._pending.items():
            if watched.distinct:
                distinct = {arg: copy.distinct_share() for arg, copy in copies.items()}
                self.values.calls[key] = CapturedCall(watched.function, {}, distinct=distinct)
            elif watched.masks:
                summaries = {arg: copy.summary() for arg, copy in copies.items()}
                masked = {arg: (rows.share, rows.runs) for arg, rows in summaries.items()}
                self.values.calls[key] = CapturedCall(watched.function, {}, masked=masked)
            elif watched.zeros:
                zeros = {arg: copy.zero_share() for arg, copy in copies.items()}
                self.values.calls[key] = CapturedCall(watched.function, {}, zeros=zeros)
            elif watched.floating:
                quantiles = {arg: copy.quantiles() for arg, copy in copies.items()}
                depths = {arg: copy.depths(selection) for arg, copy in copies.items()} if selection else {}
                self.values.calls[key] = CapturedCall(watched.function, {}, quantiles,
                                                      {arg: h for arg, h in depths.items() if h})
            else:
                values = {arg: copy.result() for arg, copy in copies.items()}
                self.values.calls[key] = CapturedCall(watched.function, values)
        self._pending.clear()
        if self.path is not None:
            write_values_file(self.path, self.values)


def capture_input_values(path: str | Path | None = None, watched: tuple[Watched, ...] = WATCHED) -> InputValueCapture:
    """A context manager that records the values of the watched calls' small integer arguments
    and, when ``path`` is given, writes them there at its end (``<trace>.values.json``)."""
    return InputValueCapture(path, watched)
