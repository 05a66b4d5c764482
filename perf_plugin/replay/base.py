"""The replay protocol: build inputs from a row, run the op, compare with a reference.

A replay is one class per kernel type (or small family), in one module of
``perf_plugin.replay.kernels`` (or a third-party module named by an entry point); the kernel
catalog (``perf_plugin.replay.registry``) finds it.  Besides the protocol, the class declares
everything else the package needs to know about its kernel types: their family, how their rows
are compared, the traced operators they stand for, and the API that launches them on an NPU.

The harness owns the lifecycle: ``check`` at collection (cheap, no allocation), ``make_inputs``
once per case, ``run`` once for verification against ``reference``, then the warm-up and timed
repeats of ``run``.  Replays never time anything themselves.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from perf_plugin.database.signature import PLAIN, SignatureRule
from perf_plugin.replay.api_call import ApiCall
from perf_plugin.replay.tensors import DTYPES, KernelRow, TensorSpec, random_tensor
from perf_plugin.trace.mapped import TraceMapper

if TYPE_CHECKING:
    import torch


class CaseBuildError(Exception):
    """The row cannot become a replay case (unsupported pattern, inconsistent shapes...)."""


# Relative-error thresholds ||out - ref|| / ||ref|| by output dtype.  Float32 on GPUs runs
# without TF32 for matmul (torch's default), so 1e-4 covers accumulation-order differences;
# half-precision thresholds follow the rounding of one bf16/fp16 output element.
RELATIVE_TOLERANCE: dict[str, float] = {
    "FLOAT": 1e-4,
    "FLOAT32": 1e-4,
    "DOUBLE": 1e-10,
    "FLOAT64": 1e-10,
    "FLOAT16": 2e-3,
    "BF16": 1.6e-2,
    # complex numbers (a rotary embedding's ``polar``, Llama 4's): their parts' thresholds
    "COMPLEX64": 1e-4,
    "COMPLEX128": 1e-10,
    "COMPLEX32": 2e-3,
}


# Torch device types whose float64 GEMMs (cuBLAS DGEMM) make a float64 reference affordable there:
# an M=N=K=8192 product took 18 ms on an H200 (the H100's float64 peak is the same), 1.7 s on
# its host's 16 cores, and more on smaller hosts.  NPUs have no float64 matmul; on the CPU the
# inputs are where the reference runs anyway.
FLOAT64_DEVICE_TYPES = frozenset({"cuda"})
# Set by ``host_reference``: references computed now run on the CPU whatever the replay opts into.
_HOST_ONLY: ContextVar[bool] = ContextVar("perf_plugin_host_reference", default=False)


def has_float64_kernels(device_type: str) -> bool:
    """Whether tensors of this torch device type can be computed on in float64, fast."""
    return device_type in FLOAT64_DEVICE_TYPES


def reference_on_device(opted_in: bool, device_type: str, fits: bool = True) -> bool:
    """Whether a replay's float64 reference runs on its inputs' device rather than on the CPU:
    only where the replay opts in (``OpReplay.reference_on_device``), the device is one whose
    float64 kernels exist and are fast (``FLOAT64_DEVICE_TYPES``), and the float64 copies fit
    in its free memory beside the case's tensors (``fits``, the runner's accounting)."""
    return opted_in and fits and has_float64_kernels(device_type)


@contextlib.contextmanager
def host_reference(active: bool = True) -> Iterator[None]:
    """While active, every reference is computed on the CPU: the runner's fallback for a case
    whose float64 copies would not fit on the device (covers the candidate judge's checks too)."""
    token = _HOST_ONLY.set(active or _HOST_ONLY.get())
    try:
        yield
    finally:
        _HOST_ONLY.reset(token)


class OpReplay(ABC):
    """Base class of kernel replays.

    Subclasses set ``kernel_types`` and implement ``make_inputs`` and ``run``; ``check`` raises
    CaseBuildError for rows the replay cannot reproduce; ``reference`` defaults to ``run`` on
    float64 copies of the inputs, which suits every op whose math is dtype-generic: on the CPU,
    or on the inputs' device where the replay sets ``reference_on_device`` (see
    ``reference_device``).
    """

    # The database kernel types (CSV names) this class replays.
    kernel_types: ClassVar[tuple[str, ...]] = ()
    # Kernel-type name prefixes it replays when no class claims the exact name (``aten.``: rows
    # named after the traced operator itself, replayed through torch.ops.aten).
    kernel_type_prefixes: ClassVar[tuple[str, ...]] = ()
    # Kernel types one call launches interchangeably, the library choosing (MatMulV2 / V3 /
    # Common for ``torch.mm``), share a family name: a profiler's record of any of them is a
    # measurement of the row, written to the CSV of the type it reports.  None: each kernel
    # type is its own family.
    family: ClassVar[str | None] = None
    # How rows of these kernel types are compared (perf_plugin.database.signature).
    signature_rule: ClassVar[SignatureRule] = PLAIN
    # Trace ingest: traced operator (``aten::mm``) -> a function giving the row it becomes.
    trace_ops: ClassVar[Mapping[str, TraceMapper]] = MappingProxyType({})
    # When a wrapper operator (``matmul``, ``einsum``) called several mapped operators, a row
    # of a primary kernel type (the GEMMs) is the one it becomes.
    trace_primary: ClassVar[bool] = False
    # The API that launches the kernel on an NPU, as op_mapping.yaml's
    # ``torch_npu_reference.<kernel type>.microbench_api`` names it.
    npu_api: ClassVar[str | None] = None
    # Whether ``run`` runs on any torch device (CPU, CUDA); False for a kernel whose only
    # implementation is the NPU API (its rows are then unsupported elsewhere, with the reason).
    portable: ClassVar[bool] = True
    # Input slots whose values, not only their shapes, set the kernel's time (a grouped GEMM's
    # group list), each with what the replay uses when the row records none (``Input Values``):
    # ingest writes ``Input Values Source`` on these kernel types' rows.
    data_inputs: ClassVar[Mapping[int, str]] = MappingProxyType({})
    # Floating input slots the replay draws from a row's ``Profiling Input Quantiles`` (top-k's
    # input): the ingest of an Ascend profile gives slot i the quantiles a capture recorded of
    # the call's argument i (``perf_plugin.ingest.ascend_values``).
    quantile_inputs: ClassVar[tuple[int, ...]] = ()
    # Floating input slots the replay zeroes a share of, as a row's ``Profiling Input Zero Shares``
    # says (a division's operands: a zero numerator takes the device's slower division); the
    # ingest of an Ascend profile gives slot i the share a capture recorded of the call's argument i.
    zero_share_inputs: ClassVar[tuple[int, ...]] = ()
    # Floating input slots the replay masks, as a row's ``Profiling Input Masked Shares`` says (a
    # softmax's logits: a masked one takes the slower exponential); the ingest of an Ascend profile
    # gives slot i the share and runs a capture recorded of the call's argument i.
    masked_inputs: ClassVar[tuple[int, ...]] = ()
    # The row column that says how many ranks a collective kernel spans (``group_size``), named
    # in the reason a row is skipped when the run cannot form that group.
    group_column: ClassVar[str] = ""
    # Whether the float64 reference runs on the inputs' device where that device has fast float64
    # kernels (``reference_on_device``; CUDA): the GEMMs, whose float64 product on the host takes
    # seconds per prefill-sized row, which makes thousands of GEMM rows unmeasurable.  Element-wise
    # references are cheap on the host and stay there (one path for every device, NPUs included).
    reference_on_device: ClassVar[bool] = False

    def check(self, row: KernelRow) -> None:
        """Raise CaseBuildError if the row cannot be replayed.  Must not allocate tensors.

        For a row of a collective kernel (``group_size`` > 1) the run makes the group it would
        run in active first (``perf_plugin.replay.rank_group``), only planned: its size is known."""

    def group_size(self, row: KernelRow) -> int:
        """How many ranks the row's kernel runs over (1: one device, no process group).  A row
        of more runs in a process group of exactly that many ranks, active while it runs
        (``perf_plugin.replay.rank_group.active_group``); raise CaseBuildError if the row does
        not say."""
        return 1

    @abstractmethod
    def make_inputs(
        self, row: KernelRow, device: "torch.device", generator: "torch.Generator"
    ) -> tuple[Any, ...]:
        """Build the op's arguments (tensors and host values) once per case."""

    @abstractmethod
    def run(self, *args: Any) -> "torch.Tensor | tuple[torch.Tensor, ...]":
        """Run the op once; must return its outputs (aligned with the row's present outputs)."""

    def npu_call(self, row: KernelRow, args: tuple[Any, ...]) -> ApiCall | None:
        """The call of ``npu_api`` that launches this row's kernel on an NPU, on the inputs
        ``make_inputs`` built (see ``perf_plugin.replay.api_call``).

        None when ``run`` itself is that call: a ``torch.*`` operator whose NPU implementation
        launches the row's kernel (``torch.add`` -> aclnnAdd -> ``Add``).
        """
        return None

    def api_call(self, *args: Any, select: tuple[int, ...] | None = None, **kwargs: Any) -> ApiCall:
        """``npu_api(*args, **kwargs)``, ``select`` picking the row's outputs (``ApiCall.outputs``)."""
        if not self.npu_api:
            raise TypeError(f"{type(self).__name__} declares no npu_api")
        return ApiCall(self.npu_api, args, kwargs, select)

    def parameters(self, row: KernelRow, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The tensors among ``args`` (what ``make_inputs`` built) that hold a model's parameters.

        A model reads its weights from memory, not from what the previous kernel left in the
        cache, so the ``produced`` cache mode leaves them out of the cache while it rewrites the
        other inputs.  None by default: every input is an activation.
        """
        return ()

    def reference(self, *args: Any) -> "torch.Tensor | tuple[torch.Tensor, ...]":
        where = self.reference_device(args)
        return self.run(*[_to_reference(a, where) for a in args])

    def reference_device(self, args: Sequence[Any]) -> "torch.device":
        """Where ``reference`` computes: the device of the first tensor among ``args`` (or in a
        tuple or list among them: ``aten.*`` replays pass their tensors so) where
        ``reference_on_device`` says so and no ``host_reference`` is active, else the CPU."""
        import torch

        for value in args:
            for item in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(item, torch.Tensor):
                    if reference_on_device(self.reference_on_device, item.device.type, fits=not _HOST_ONLY.get()):
                        return item.device
                    return torch.device("cpu")
        return torch.device("cpu")

    def reference_bytes(self, row: KernelRow) -> int:
        """Device bytes a reference on the device holds at its peak, for the runner's memory
        check: float64 copies of every input and the float64 outputs (8 bytes per element, an
        upper bound for integer slots copied in their own dtype).  A reference that holds more
        at once (temporaries) says so by overriding this."""
        return 8 * sum(spec.numel for spec in (*row.inputs, *row.outputs))

    def tolerance(self, output: TensorSpec) -> float:
        if output.dtype in RELATIVE_TOLERANCE:
            return RELATIVE_TOLERANCE[output.dtype]
        # other spellings of the same floating type (FP16, HALF, BFLOAT16, FP32...) share its threshold
        torch_name = DTYPES.get(output.dtype, ("", 0))[0]
        for name, value in RELATIVE_TOLERANCE.items():
            if DTYPES.get(name, ("", 0))[0] == torch_name:
                return value
        return 0.0

    def comparable(self, args: tuple[Any, ...], outputs: Any) -> Any:
        """``outputs`` (the replay's or the reference's) in the form they are compared in: as they
        are by default.  An operator whose results a correct kernel may order or pick differently
        (a top-k with ``sorted=False``, ties) maps both to what every correct kernel agrees on,
        raising ``VerificationError`` for what no correct kernel returns."""
        return outputs

    def values_verifiable(self, row: KernelRow) -> bool:
        """False where the outputs are random draws that no reference reproduces (verified for
        shapes, dtypes and finite values only)."""
        return True

    def expected_outputs(self, row: KernelRow) -> Sequence[TensorSpec]:
        """The row's output slots this replay produces (all present outputs by default)."""
        return row.present_outputs

    # helpers for subclasses -----------------------------------------------------------
    @staticmethod
    def random(spec: TensorSpec, device: "torch.device", generator: "torch.Generator", **kw: Any) -> "torch.Tensor":
        return random_tensor(spec, device, generator, **kw)


def _to_reference(value: Any, where: "torch.device | str" = "cpu") -> Any:
    """A tensor's float64 copy (a clone of a non-floating one) on ``where``; other values as they are."""
    import torch

    if isinstance(value, torch.Tensor):
        value = value.detach().to(where)
        return value.double() if value.is_floating_point() else value.clone()
    return value


def compute_reference(replay: OpReplay, args: Sequence[Any]) -> Any:
    """``replay.reference(*args)``; a reference on the device that runs out of memory (another
    process took some after the runner's check) is computed again on the CPU, not failed."""
    try:
        return replay.reference(*args)
    except RuntimeError as exc:  # torch.OutOfMemoryError is one
        if replay.reference_device(args).type == "cpu" or "out of memory" not in str(exc).lower():
            raise
    # outside the ``except``: the failed attempt's tensors are released with its traceback first
    with host_reference():
        return replay.reference(*args)
