"""One rank's collective session: process groups, the per-case protocol, agreement, rank-0 writes.

Protocol of a case, identical on every rank:

1. build this rank's buffers (once per case) and its expected result;
2. run the collective once and check the result on this rank;
3. warm up, then time ``iters`` calls (see ``timing``);
4. agree: every rank sends its status and reason over a separate gloo *control* group; all
   pass, all skip (the library does not support the op), or all fail together, each rank's
   reason in the message, so one rank's failure never leaves the others waiting;
5. take the per-iteration maximum of the durations over all ranks; rank 0 upserts the row and
   the ranks agree once more on whether the write worked.

The world is split into consecutive groups of ``num_devices`` ranks that run the collective at
the same time (as tensor-parallel groups do in a model).  Every rank creates every group in the
same order at start-up.  The control group's timeout is twice the data timeout plus a minute, so
a rank stuck in a data collective reaches the agreement before its peers give up waiting there.
After a collective raised (a timeout, a library error), the process groups may be unusable:
every later case fails at once with the first error as its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from perf_plugin.comm.ccl import CclSpec, activate, rank_backend
from perf_plugin.comm.execute import build_buffers, check_result, make_call
from perf_plugin.comm.launch import RankInfo
from perf_plugin.comm.plan import CommCase, CommPlan
from perf_plugin.comm.record import CommResult, utc_timestamp
from perf_plugin.comm.settings import CommSettings
from perf_plugin.comm.timing import MeasurementError, NoDeviceWork, time_collective, warm_up_profiler
from perf_plugin.comm.writer import upsert_result
from perf_plugin.database.errors import DatabaseError

PASSED = "passed"
SKIPPED = "skipped"
FAILED = "failed"
_UNSUPPORTED_WORDS = ("not supported", "unsupported", "does not support", "not implemented")


@dataclass(frozen=True)
class CaseOutcome:
    status: str  # passed, skipped, failed
    reason: str = ""
    result: CommResult | None = None
    written_to: Path | None = None


def _looks_unsupported(exc: BaseException) -> bool:
    if isinstance(exc, NotImplementedError):
        return True
    text = str(exc).lower()
    return isinstance(exc, (RuntimeError, ValueError)) and any(word in text for word in _UNSUPPORTED_WORDS)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


class CommRunner:
    """Owns the process groups of this rank for the whole pytest session."""

    def __init__(self, plan: CommPlan, settings: CommSettings, spec: CclSpec, info: RankInfo, output_dir: Path) -> None:
        self.plan = plan
        self.settings = settings
        self.spec = spec
        self.info = info
        self.output_dir = output_dir
        self.device: Any = None
        self.backend = rank_backend(spec, info.local_rank)  # constructing it touches no device
        self.control: Any = None
        self.groups: dict[int, Any] = {}
        self.broken: str | None = None
        self._owns_default_group = False
        self._started = False

    # ------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if self._started:
            return
        import torch.distributed as dist

        self.device = activate(self.spec, self.info.local_rank)
        timeout = timedelta(seconds=self.settings.timeout_s)
        if not dist.is_initialized():
            if self.info.launched:
                dist.init_process_group(**self.spec.init_kwargs(self.settings.timeout_s, self.device))
            else:
                # a world of one, no torchrun: an in-memory store needs no address or port
                dist.init_process_group(
                    backend=self.spec.ccl, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout  # type: ignore[attr-defined]
                )
            self._owns_default_group = True
        if dist.get_world_size() != self.plan.world_size:
            raise RuntimeError(
                f"the process group has {dist.get_world_size()} ranks, the plan {self.plan.world_size}"
            )
        control_timeout = timedelta(seconds=2 * self.settings.timeout_s + 60)
        self.control = dist.new_group(backend="gloo", timeout=control_timeout)
        for size in self.plan.group_sizes:  # the same order on every rank
            if size == self.plan.world_size:
                self.groups[size] = dist.group.WORLD
            else:
                self.groups[size], _ = dist.new_subgroups(group_size=size, timeout=timeout)  # type: ignore[no-untyped-call]
        if self.settings.mode == "kernel":
            warm_up_profiler(self.backend)
        self._started = True

    def close(self) -> None:
        import torch.distributed as dist

        if self._owns_default_group and dist.is_initialized():
            dist.destroy_process_group()
        self._started = False

    # ------------------------------------------------------------------------- one case
    def _measure(self, case: CommCase) -> tuple[str, str, list[float], bool]:
        """(status, reason, per-iteration us, collective raised) on this rank."""
        rank_in_group = self.info.rank % case.num_devices
        try:
            buffers = build_buffers(case, rank_in_group, self.device)
            call = make_call(case, buffers, self.groups[case.num_devices])
        except Exception as exc:  # allocation, dtype support: before any communication
            return FAILED, _one_line(exc), [], False
        try:
            call()
            mismatch = check_result(buffers)
            buffers.expected = None  # free it before the timed loop
            if mismatch:
                return FAILED, f"wrong result: {mismatch}", [], False
            for _ in range(self.settings.warmup):
                call()
            samples = time_collective(
                call, self.settings.iters, self.settings.mode, self.backend, case.num_devices
            )
        except NoDeviceWork as exc:
            return SKIPPED, f"nothing to time: {exc}", [], False
        except MeasurementError as exc:  # the collective itself worked: the groups stay usable
            return FAILED, _one_line(exc), [], False
        except Exception as exc:
            if _looks_unsupported(exc):
                return SKIPPED, f"{self.spec.ccl} does not support {case.op.name} of {case.dtype.key}: {_one_line(exc)}", [], False
            return FAILED, _one_line(exc), [], True
        if len(samples) != self.settings.iters or min(samples) <= 0:
            return FAILED, f"timing gave {len(samples)} samples, min {min(samples, default=0):g} us", [], False
        return PASSED, "", samples, False

    def _agree(self, status: str, reason: str, raised: bool) -> tuple[str, str, bool]:
        import torch.distributed as dist

        everyone: list[Any] = [None] * self.plan.world_size
        dist.all_gather_object(everyone, (status, reason, raised), group=self.control)
        statuses = {entry[0] for entry in everyone}
        any_raised = any(entry[2] for entry in everyone)
        if statuses == {PASSED}:
            return PASSED, "", False
        if statuses == {SKIPPED}:
            return SKIPPED, everyone[0][1], False
        reasons = "; ".join(f"rank {r}: {entry[1] or entry[0]}" for r, entry in enumerate(everyone) if entry[0] != PASSED)
        return FAILED, reasons, any_raised

    def _max_over_ranks(self, samples: list[float]) -> list[float]:
        import torch
        import torch.distributed as dist

        tensor = torch.tensor(samples, dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.control)
        return tensor.tolist()

    def _write(self, result: CommResult) -> tuple[Path | None, str]:
        import torch.distributed as dist

        written, error = None, ""
        if self.info.rank == 0:
            try:
                written = upsert_result(self.output_dir, result)
            except (DatabaseError, OSError) as exc:
                error = f"rank 0 could not write the result: {exc}"
        shared = [error]
        dist.broadcast_object_list(shared, src=0, group=self.control)
        return written, shared[0]

    def run(self, case: CommCase) -> CaseOutcome:
        """Measure one case on every rank; every rank returns the same status."""
        if self.broken:
            return CaseOutcome(FAILED, f"not run: an earlier collective failed ({self.broken})")
        status, reason, samples, raised = self._measure(case)
        status, reason, raised = self._agree(status, reason, raised)
        if raised:
            self.broken = reason
        if status != PASSED:
            return CaseOutcome(status, reason)
        result = CommResult(
            case=case,
            samples_us=tuple(self._max_over_ranks(samples)),
            mode=self.settings.mode,
            ccl=self.spec.ccl,
            world_size=self.plan.world_size,
            timestamp=utc_timestamp(),
        )
        written, error = self._write(result)
        if error:
            return CaseOutcome(FAILED, error, result)
        return CaseOutcome(PASSED, "", result, written)
