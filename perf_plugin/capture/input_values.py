"""Record, in a real model run, the values a kernel's time depends on: ``capture_input_values``.

A grouped GEMM's time depends on how many rows each expert gets, which the shapes do not say.
Wrap the profiled step in ``capture_input_values`` (inside or outside ``torch.profiler.profile``)::

    with torch.profiler.profile(activities=..., record_shapes=True) as prof:
        with capture_input_values("trace.values.json"):
            model(batch)
    prof.export_chrome_trace("trace.json")

Every call of a watched function (``WATCHED``) is then wrapped in a profiler range named
``perf_values/<token>/<n>`` (``perf_plugin.trace.values_file``), and the values of its small
integer tensor arguments are copied to the host: on an accelerator asynchronously, on a side
stream that waits for the producing work and into pinned memory, so the step gains no
synchronisation and its stream no extra work; on the CPU they are read directly.  When the
block ends the capture waits for its copies and writes the values file, which ``perfdb ingest``
reads beside the trace.

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

from perf_plugin.trace.values_file import CapturedCall, CapturedValues, mark_name, write_values_file

if TYPE_CHECKING:
    import torch

# Integer tensors with more elements than this are not recorded (indices of every token): the
# data that changes a kernel's time is its counts, offsets and lengths, a few per group.
MAX_VALUES = 4096


@dataclass(frozen=True)
class Watched:
    """A function whose time depends on some arguments' values: per traced operator argument
    position, the keyword and the Python position (None: keyword-only) it is passed by."""

    function: str  # dotted name, resolved when the capture starts
    arguments: dict[int, tuple[str, int | None]]


WATCHED: tuple[Watched, ...] = (
    # aten::_grouped_mm(self, mat2, offs, bias, out_dtype): offs = the end row of every group
    Watched("torch._grouped_mm", {2: ("offs", 2)}),
    Watched("torch.nn.functional.grouped_mm", {2: ("offs", None)}),
    # aten::_scaled_grouped_mm(self, mat2, scale_a, scale_b, offs, ...)
    Watched("torch._scaled_grouped_mm", {4: ("offs", 4)}),
)


def _resolve(dotted: str) -> Any:
    import importlib

    module_name, _, attribute = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError):
        return None  # not in this torch release


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], keyword: str, position: int | None) -> Any:
    if keyword in kwargs:
        return kwargs[keyword]
    return args[position] if position is not None and position < len(args) else None


def _recordable(value: Any) -> bool:
    import torch

    return (isinstance(value, torch.Tensor) and not value.is_floating_point() and not value.is_complex()
            and value.dtype != torch.bool and value.numel() <= MAX_VALUES)


class _PendingCopy:
    """Values on their way to the host: a pinned buffer filled on a side stream."""

    def __init__(self, tensor: "torch.Tensor", streams: dict[Any, Any]) -> None:
        import torch

        self.values: tuple[int, ...] | None = None
        if tensor.device.type == "cpu":  # already on the host: read now, before anything changes them
            # (``tolist`` records no operator that does work; a reshape or clone would add rows)
            self.values = _flat(tensor.tolist())
            return
        module = torch.get_device_module(tensor.device)
        side = streams.get(tensor.device)
        if side is None:
            side = streams[tensor.device] = module.Stream(tensor.device)
        side.wait_stream(module.current_stream(tensor.device))  # after the work that produced the values
        with module.stream(side):
            self.host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self.host.copy_(tensor, non_blocking=True)
        tensor.record_stream(side)  # the allocator keeps the block until the copy has read it

    def result(self) -> tuple[int, ...]:
        if self.values is None:
            self.values = _flat(self.host.tolist())
        return self.values


def _flat(nested: Any) -> tuple[int, ...]:
    """``Tensor.tolist()`` of any rank, flattened in row-major order."""
    if not isinstance(nested, list):
        return (int(nested),)
    out: list[int] = []
    stack = [iter(nested)]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
        elif isinstance(item, list):
            stack.append(iter(item))
        else:
            out.append(int(item))
    return tuple(out)


class InputValueCapture:
    """The context manager behind ``capture_input_values``; ``values`` holds what it recorded."""

    def __init__(self, path: str | Path | None, watched: tuple[Watched, ...] = WATCHED) -> None:
        self.path = Path(path) if path is not None else None
        self.values = CapturedValues(uuid.uuid4().hex[:12])
        self._watched = watched
        self._pending: dict[str, tuple[str, dict[int, _PendingCopy]]] = {}
        self._streams: dict[Any, Any] = {}
        self._mode: Any = None

    def __enter__(self) -> "InputValueCapture":
        from torch.overrides import TorchFunctionMode
        from torch.profiler import record_function

        functions = {f: w for w in self._watched if (f := _resolve(w.function)) is not None}
        counter = itertools.count()
        capture = self

        class _Mode(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
                kwargs = kwargs or {}
                watched = functions.get(func)
                if watched is None:
                    return func(*args, **kwargs)
                key = str(next(counter))
                capture._record(key, watched, args, kwargs)
                with record_function(mark_name(capture.values.token, key)):
                    return func(*args, **kwargs)

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def _record(self, key: str, watched: Watched, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        copies = {}
        for position, (keyword, python_position) in watched.arguments.items():
            value = _argument(args, kwargs, keyword, python_position)
            if _recordable(value):
                copies[position] = _PendingCopy(value, self._streams)
        self._pending[key] = (watched.function, copies)

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)
        for stream in self._streams.values():
            stream.synchronize()  # after the step: the copies are done, the step was not held
        for key, (function, copies) in self._pending.items():
            self.values.calls[key] = CapturedCall(function, {arg: copy.result() for arg, copy in copies.items()})
        self._pending.clear()
        if self.path is not None:
            write_values_file(self.path, self.values)


def capture_input_values(path: str | Path | None = None, watched: tuple[Watched, ...] = WATCHED) -> InputValueCapture:
    """A context manager that records the values of the watched calls' small integer arguments
    and, when ``path`` is given, writes them there at its end (``<trace>.values.json``)."""
    return InputValueCapture(path, watched)
