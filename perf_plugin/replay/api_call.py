"""The call that launches a row's kernel on an Ascend NPU, described as data.

On an NPU a replay must launch the very kernel its row names: msprof reports every kernel by its
``OP Type``, and a composition of other operators (an RMSNorm as pow, mean, rsqrt and mul) is
recorded as those kernels, never as the row's.  ``op_mapping.yaml`` names, per kernel type, the
API that launches it (``torch_npu_reference.<kernel type>.microbench_api``: ``torch_npu.npu_rms_norm``,
``torch.ops._C_ascend.npu_add_rms_norm_bias``, ``atb._npu_reshape_and_cache`` ...).

A replay describes that call as an ``ApiCall``: the API's dotted name, the arguments (the inputs
its ``make_inputs`` built, and host values derived from the row) and which of the API's results
are the row's outputs.  Building it imports nothing, so tests check every replay's call on real
rows on any machine; the NPU backend resolves the name (``resolve_api``, importing torch_npu or
the package that registers the operator namespace) and binds the call once per case
(``bind_call``).  An argument wrapped in ``NpuFormat`` is handed to the API in that private
storage format (a ``FRACTAL_NZ`` weight), cast once before timing through
``torch_npu.npu_format_cast``.

None of this has run on an NPU: it is written against torch_npu's and vllm-ascend's documented
entry points and tested through what runs without the device.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

# aclFormat ids of the storage formats a row may name (torch_npu.npu_format_cast's second argument).
ACL_FORMATS: Mapping[str, int] = MappingProxyType(
    {"NCHW": 0, "NHWC": 1, "ND": 2, "NC1HWC0": 3, "FRACTAL_Z": 4, "FRACTAL_NZ": 29, "NDC1HWC0": 32}
)

# The package whose import makes an API path resolvable, by the path's first parts.  vllm-ascend
# registers the ``_C_ascend`` custom operators and its Triton operators (``torch.ops.vllm``);
# torch_npu registers ``torch.ops.npu`` and exposes the ATB operators as ``torch_npu._npu_*``.
_PROVIDERS: tuple[tuple[str, str], ...] = (
    ("torch.ops._C_ascend.", "vllm_ascend"),
    ("torch.ops.vllm.", "vllm_ascend"),
    ("torch.ops.npu.", "torch_npu"),
    ("torch_npu.", "torch_npu"),
    ("atb.", "torch_npu"),
    ("torch.", "torch"),
)


@dataclass(frozen=True)
class NpuFormat:
    """An input the API takes in a private NPU storage format (cast once, before timing)."""

    tensor: Any
    format: str

    def __post_init__(self) -> None:
        if self.format not in ACL_FORMATS:
            raise ValueError(f"unknown NPU format {self.format!r} (known: {', '.join(ACL_FORMATS)})")


@dataclass(frozen=True)
class ApiCall:
    """``api(*args, **kwargs)``; ``outputs`` picks the row's outputs from what it returns.

    ``outputs`` holds indices into the API's returned tuple, in the row's output order; None
    means the result is the row's outputs as it is (one tensor, or a tuple in row order).
    ``written`` names keyword arguments the API writes the row's outputs into (an API that
    returns nothing, such as ``atb._npu_reshape_and_cache``): they are the outputs then.
    """

    api: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    outputs: tuple[int, ...] | None = None
    written: tuple[str, ...] = ()

    def select(self, result: Any, kwargs: Mapping[str, Any] | None = None) -> Any:
        if self.written:
            given = self.kwargs if kwargs is None else kwargs
            outputs = tuple(given[name] for name in self.written)
            return outputs[0] if len(outputs) == 1 else outputs
        if self.outputs is None:
            return result
        items = result if isinstance(result, (tuple, list)) else (result,)
        picked = tuple(items[i] for i in self.outputs)
        return picked[0] if len(picked) == 1 else picked


def provider_of(api: str) -> str:
    """The package to import before ``api`` can be resolved."""
    for prefix, package in _PROVIDERS:
        if api.startswith(prefix):
            return package
    raise ValueError(f"API {api!r} is not in a known namespace (torch, torch_npu, torch.ops.*, atb)")


def resolve_api(api: str, importer: Callable[[str], Any] = importlib.import_module) -> Callable[..., Any]:
    """The callable ``api`` names, importing its provider first (raises ImportError with the reason)."""
    provider = provider_of(api)
    try:
        importer(provider)
    except ImportError as exc:
        raise ImportError(f"{api} needs the package {provider}, which cannot be imported: {exc}") from exc
    if api.startswith("atb."):
        root: Any = importer("torch_npu")
        parts = api.split(".")[1:]
    else:
        root = importer(api.split(".")[0])
        parts = api.split(".")[1:]
    target = root
    for part in parts:
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ImportError(f"{api}: {type(target).__name__} has no attribute {part!r} (is {provider} too old?)") from None
    if not callable(target):
        raise ImportError(f"{api} is not callable")
    return target  # type: ignore[no-any-return]


def prepare_arguments(call: ApiCall, format_cast: Callable[[Any, int], Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's arguments with every ``NpuFormat`` cast to its format (lists and tuples too)."""

    def convert(value: Any) -> Any:
        if isinstance(value, NpuFormat):
            return format_cast(value.tensor, ACL_FORMATS[value.format])
        if isinstance(value, (list, tuple)):
            return type(value)(convert(item) for item in value)
        return value

    return tuple(convert(a) for a in call.args), {k: convert(v) for k, v in call.kwargs.items()}


def bind_call(call: ApiCall, function: Callable[..., Any], format_cast: Callable[[Any, int], Any]) -> Callable[[], Any]:
    """A function of no arguments that makes the call and returns the row's outputs."""
    args, kwargs = prepare_arguments(call, format_cast)

    def launch() -> Any:
        return call.select(function(*args, **kwargs), kwargs)

    return launch


def unwrap(value: Any) -> Any:
    """The plain tensor behind an ``NpuFormat`` (the reference computes on the logical values)."""
    return value.tensor if isinstance(value, NpuFormat) else value
