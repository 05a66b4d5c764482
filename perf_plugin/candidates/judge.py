"""Judging a candidate on one case: correctness over fresh input sets, then timing, then a re-check.

The known ways a candidate looks fast without being so, and what stops each here:

* it returns a buffer computed earlier (a cache keyed by shape) or never writes its output:
  every check uses fresh inputs (its own seed), and before every check the outputs of the
  previous one are poisoned (NaN, or an integer's extreme) and a block the size of the row's
  outputs is filled with 0xFF bytes (NaN in every float format) and freed, so that an output
  the allocator hands out again without being written reads as NaN;
* it computes only on the first calls and skips work later: the output of the last timed
  repeat is compared with the reference after the timed range;
* it is timed by a host clock around asynchronous launches, or launches on a side stream:
  the candidate is timed by the run's own collector (device time from the profiler: on CUDA
  every kernel, memcpy and memset launched between the case's markers, on any stream, is
  summed), exactly as the reference replay is.

Each check compares with the replay's reference on the check's inputs (``compute_reference``):
on the device for the GEMM replays on CUDA, on the host where the runner's memory check found
no room for the float64 copies (``host_reference``, active around the judge too).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from perf_plugin.replay.base import compute_reference
from perf_plugin.replay.verify import VerificationError, verify_outputs
from perf_plugin.results import CaseRef

if TYPE_CHECKING:
    import torch

    from perf_plugin.replay.base import OpReplay
    from perf_plugin.replay.tensors import KernelRow

# The ref of a candidate's measurement: the row's case id with this suffix, so that its result
# can never be taken for the reference replay's (collector.SplittingCollector routes it away).
CANDIDATE_SUFFIX = "::candidate"


def candidate_ref(ref: CaseRef) -> CaseRef:
    return CaseRef(ref.case_id + CANDIDATE_SUFFIX, ref.kernel_type, ref.csv_file, ref.row_line, ref.signature_key)


def is_candidate_ref(ref: CaseRef) -> bool:
    return ref.case_id.endswith(CANDIDATE_SUFFIX)


def reference_case_id(ref: CaseRef) -> str:
    return ref.case_id[: -len(CANDIDATE_SUFFIX)] if is_candidate_ref(ref) else ref.case_id


@dataclass
class Verdict:
    """What the judge found for one case (JSON-ready: it travels in test reports under xdist)."""

    case_id: str
    kernel_type: str
    csv_file: str
    row_line: int | None
    correct: bool = False
    checks_passed: int = 0
    checks: int = 0
    timed: bool = False  # a candidate measurement was taken (its result arrives separately)
    reason: str = ""
    log: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__, log=list(self.log))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verdict:
        return cls(**data)


def _outputs(value: Any) -> tuple[Any, ...]:
    import torch

    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, (tuple, list)):
        return tuple(value)
    return ()


def poison_tensor(tensor: "torch.Tensor") -> None:
    """Overwrite a tensor with values no correct op produces here: NaN, or an integer's extreme."""
    import torch

    with torch.no_grad():
        if tensor.is_floating_point() or tensor.is_complex():
            tensor.fill_(math.nan)
        elif tensor.dtype == torch.bool:
            tensor.logical_not_()  # every element wrong
        else:
            tensor.fill_(torch.iinfo(tensor.dtype).min if tensor.dtype.is_signed else torch.iinfo(tensor.dtype).max)


def poison_outputs(outputs: Any) -> None:
    for tensor in _outputs(outputs):
        poison_tensor(tensor)


def poison_allocator(device: "torch.device", nbytes: int) -> None:
    """Fill a freed block of ``nbytes`` with 0xFF, so that a new output that is never written
    reads as NaN (the caching allocator hands the same block out again for the next request of
    that size on CUDA; on the CPU it often does)."""
    import torch

    if nbytes > 0:
        block = torch.full((nbytes,), 0xFF, dtype=torch.uint8, device=device)
        del block


def output_bytes(replay: "OpReplay", row: "KernelRow") -> int:
    total = 0
    for spec in replay.expected_outputs(row):
        try:
            total += spec.nbytes
        except (TypeError, ValueError, AttributeError):
            continue
    return total


def check_once(
    function: Callable[..., Any], replay: "OpReplay", row: "KernelRow", args: tuple[Any, ...], synchronize: Callable[[], Any]
) -> tuple[Any, str | None]:
    """Run the candidate on ``args`` and compare with the replay's reference; (outputs, error)."""
    try:
        outputs = function(*args)
        synchronize()
    except Exception as exc:  # the candidate's own error is its verdict, not the run's
        first = str(exc).splitlines()[0] if str(exc) else ""
        return None, f"raised {type(exc).__name__}: {first}"
    reference = compute_reference(replay, args)
    try:
        verify_outputs(replay, row, outputs, reference, args)
    except VerificationError as exc:
        return outputs, str(exc)
    except Exception as exc:  # outputs of the wrong kind (not tensors, wrong count)
        return outputs, f"outputs cannot be compared: {type(exc).__name__}: {exc}"
    return outputs, None


def check_candidate(
    function: Callable[..., Any],
    replay: "OpReplay",
    row: "KernelRow",
    device: "torch.device",
    make_generator: Callable[[int], "torch.Generator"],
    seeds: list[int],
    synchronize: Callable[[], Any],
    verdict: Verdict,
) -> bool:
    """Correctness over one fresh input set per seed, the previous outputs and a block of the
    allocator poisoned before each run; stops at the first failure.  Fills ``verdict``."""
    poison = output_bytes(replay, row)
    previous: Any = None
    verdict.checks = len(seeds)
    for number, seed in enumerate(seeds, 1):
        args = replay.make_inputs(row, device, make_generator(seed))
        if previous is not None:
            poison_outputs(previous)
        poison_allocator(device, poison)
        synchronize()
        previous, error = check_once(function, replay, row, args, synchronize)
        if error is not None:
            verdict.reason = f"check {number} of {len(seeds)} (seed {seed}): {error}"
            verdict.log.append(f"FAIL {verdict.reason}")
            return False
        verdict.checks_passed += 1
        verdict.log.append(f"PASS check {number} of {len(seeds)} (seed {seed})")
    return True


class LastCall:
    """Wraps the candidate for the timed repeats, keeping the last call's arguments and outputs
    for the comparison after the timed range (a Python attribute store per call: host time only).

    An exception is kept, not raised: a measurement stopped halfway would leave the collector's
    markers unbalanced and spoil the other cases of its profiler batch.
    """

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function
        self.args: tuple[Any, ...] | None = None
        self.outputs: Any = None
        self.error: str | None = None

    def __call__(self, *args: Any) -> Any:
        if self.error is not None:
            return None
        self.args = args
        try:
            self.outputs = self.function(*args)
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            self.error = f"raised {type(exc).__name__}: {first}"
            self.outputs = None
        return self.outputs


def check_after_timing(last: LastCall, replay: "OpReplay", row: "KernelRow", verdict: Verdict) -> bool:
    """The last timed repeat's outputs against the reference on its inputs."""
    if last.error is not None:
        verdict.correct = False
        verdict.reason = f"while timed: {last.error}"
        verdict.log.append(f"FAIL {verdict.reason}")
        return False
    if last.args is None:
        verdict.log.append("no timed repeat ran: nothing to compare after the timed range")
        return True
    reference = compute_reference(replay, last.args)
    try:
        verify_outputs(replay, row, last.outputs, reference, last.args)
    except (VerificationError, TypeError, ValueError) as exc:
        verdict.correct = False
        verdict.reason = f"after the timed range: {exc}"
        verdict.log.append(f"FAIL {verdict.reason}")
        return False
    verdict.log.append("PASS the last timed repeat's outputs match the reference")
    return True


__all__ = (
    "CANDIDATE_SUFFIX",
    "LastCall",
    "Verdict",
    "candidate_ref",
    "check_after_timing",
    "check_candidate",
    "check_once",
    "is_candidate_ref",
    "poison_allocator",
    "poison_outputs",
    "poison_tensor",
    "reference_case_id",
)
