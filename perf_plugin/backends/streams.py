"""Work queued beside the model's on a device's own streams: the input-value capture's copies.

Each device kind has its stream API in its own torch module: ``torch.cuda`` for CUDA, and on an
Ascend NPU ``torch.npu``, which torch_npu registers (``torch._register_device_module("npu",
torch_npu.npu)`` in its ``__init__``) with ``Stream``, ``current_stream``, ``stream`` and the
stream methods ``wait_stream`` / ``synchronize``, and whose streams ``Tensor.record_stream``
takes.  ``stream_api`` names that module; ``copy_to_host`` queues one copy on a side stream.

The NPU branch has never run on an NPU: it is written against torch_npu's registration and
tested on the CPU with stand-ins for the stream module and the device tensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perf_plugin.backends.npu import NpuBackend, import_torch_npu

if TYPE_CHECKING:
    import torch


def stream_api(device: "torch.device") -> Any:
    """The module whose ``Stream``, ``current_stream`` and ``stream`` queue work on ``device``."""
    import torch

    if device.type == NpuBackend.name:
        import_torch_npu()  # torch.npu exists only once torch_npu has registered it
        return torch.npu  # type: ignore[attr-defined]
    return torch.get_device_module(device)


def copy_to_host(tensor: "torch.Tensor", side_streams: dict[Any, Any]) -> "torch.Tensor":
    """A pinned host tensor that ``tensor``'s values are being copied into, on a side stream of
    its device (one per device, kept in ``side_streams``) that first waits for the work queued so
    far on the current stream, which produced them.  The model's stream gets no extra work and
    the host does not wait; the values are there once the side stream has been synchronised."""
    import torch

    api = stream_api(tensor.device)
    side = side_streams.get(tensor.device)
    if side is None:
        side = side_streams[tensor.device] = api.Stream(tensor.device)
    side.wait_stream(api.current_stream(tensor.device))
    with api.stream(side):
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
    tensor.record_stream(side)  # the allocator keeps the block until the copy has read it
    return host
