"""Whether a short kernel runs slower when other kernels' code ran on the device before it.

Investigates the rows of ``benchmarks/model_coverage.py`` that replay 10-30 % faster than they ran
inside the model although their inputs' cache state is reproduced (``produced`` mode): decode
kernels of 1.3-5 us and prefill GEMMs.  An eager model runs some hundred distinct kernels between
two calls of one kernel, so each call may find its code (and its constant banks) out of the
SMs' instruction caches; a replay runs the same kernel over and over, with two other kernels (the
eviction and the input rewrite) between repeats.

For kernels of rows the H100 model runs missed, with their in-model shapes, this times (one
torch.profiler session per case and context, 30 repeats each, the median device duration):

* ``warm``: repeats back to back;
* ``produced``: the harness's ``produced`` mode before the code eviction (an eviction by reading
  256 MB, then every input rewritten in place, then the kernel);
* ``evict,code,rewrite`` and ``code,evict,rewrite``: the harness's code eviction
  (``perf_plugin.replay.code_eviction``: 42 distinct kernels over every SM) after or before the
  data eviction (before, so the data eviction leaves none of their lines dirty, is what the
  harness does);
* ``evict,code-small,rewr``: the same kernels on 1023 elements, each on a block or two;
* ``code,gemms,evict,rewr``: cuBLAS GEMMs added to the code eviction;
* then a sweep over the number N of the code eviction's kernels run before each repeat;

and prints them beside the in-model duration (from the H100 profiles of ``model_coverage.py``).
Prerequisites: an NVIDIA GPU and torch with CUDA.  ``python reproduce/wip/code_cache_effect.py``
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from perf_plugin.backends.cuda import CudaBackend
from perf_plugin.replay.code_eviction import code_eviction, distinct_kernels

REPEATS = 30
COUNTS = (0, 1, 2, 4, 6, 8, 10, 12, 16, 24, 42)


@dataclass
class Case:
    name: str
    op: str  # the profiler's name of the timed operator
    in_model_us: float
    build: Callable[[torch.device], tuple[Callable[[], Any], list[torch.Tensor]]]


def _bf16(*shape: int, device: torch.device) -> torch.Tensor:
    return torch.randn(shape, device=device, dtype=torch.bfloat16)


def _cases() -> list[Case]:
    def sum_decode(d: torch.device) -> tuple[Callable[[], Any], list[torch.Tensor]]:
        x = _bf16(1, 8, 2048, device=d)
        return lambda: x.sum(dim=1), [x]

    def sum_prefill(d: torch.device) -> tuple[Callable[[], Any], list[torch.Tensor]]:
        x = _bf16(512, 8, 2048, device=d)
        return lambda: x.sum(dim=1), [x]

    def cast_0d(d: torch.device) -> tuple[Callable[[], Any], list[torch.Tensor]]:
        x = _bf16(device=d)
        return lambda: x.float(), [x]

    def mul_strided(d: torch.device) -> tuple[Callable[[], Any], list[torch.Tensor]]:
        a, gate_up = _bf16(8, 768, device=d), _bf16(8, 1536, device=d)
        b = gate_up[:, 768:]
        return lambda: a * b, [a, gate_up]

    def masked_fill(d: torch.device) -> tuple[Callable[[], Any], list[torch.Tensor]]:
        x, mask = _bf16(8, 2048, device=d), torch.rand(8, 1, device=d) > 0.5
        return lambda: x.masked_fill(mask, 0.0), [x, mask]

    def add_decode(d: torch.device) -> tuple[Callable[[], Any], list[torch.Tensor]]:
        a, b = _bf16(1, 1, 2048, device=d), _bf16(1, 1, 2048, device=d)
        return lambda: a + b, [a, b]

    def rsqrt_0d(d: torch.device) -> tuple[Callable[[], Any], list[torch.Tensor]]:
        x = torch.rand(1, 1, 1, device=d) + 0.5
        return lambda: torch.rsqrt(x), [x]

    def gemm_prefill(d: torch.device) -> tuple[Callable[[], Any], list[torch.Tensor]]:
        x, w = _bf16(512, 4096, device=d), _bf16(4096, 4096, device=d) * 0.02
        return lambda: F.linear(x, w), [x]

    def fp8_gemm_prefill(d: torch.device) -> tuple[Callable[[], Any], list[torch.Tensor]]:
        x = _bf16(512, 4096, device=d).to(torch.float8_e4m3fn)
        w = (_bf16(4096, 4096, device=d) * 0.02).to(torch.float8_e4m3fn)
        one = torch.ones((), device=d)
        return lambda: torch._scaled_mm(x, w.t(), one, one, out_dtype=torch.bfloat16), [x, one]

    return [
        Case("sum [1,8,2048] dim 1 (Qwen3-MoE decode)", "aten::sum", 5.05, sum_decode),
        Case("sum [512,8,2048] dim 1 (Qwen3-MoE prefill)", "aten::sum", 10.32, sum_prefill),
        Case("cast 0-d bf16->f32 (FP8 decode)", "aten::copy_", 1.58, cast_0d),
        Case("mul [8,768] * strided view (Qwen3-MoE)", "aten::mul", 2.45, mul_strided),
        Case("masked_fill [8,2048], [8,1] (Qwen3-MoE)", "aten::masked_fill_", 2.66, masked_fill),
        Case("add [1,1,2048] (Qwen3-MoE residual)", "aten::add", 1.34, add_decode),
        Case("rsqrt [1,1,1] f32 (Llama norm)", "aten::rsqrt", 1.40, rsqrt_0d),
        Case("linear 512x4096x4096 bf16 (Llama q/o)", "aten::mm", 26.78, gemm_prefill),
        Case("scaled_mm fp8 512x4096x4096 (FP8 q/o)", "aten::_scaled_mm", 16.84, fp8_gemm_prefill),
    ]


def gemm_churn(device: torch.device) -> Callable[[], None]:
    """GEMMs of three dtypes and two shapes (cuBLAS kernels, with large code), none timed."""
    pairs = [(torch.randn(m, 1024, device=device, dtype=dtype), torch.randn(1024, n, device=device, dtype=dtype))
             for dtype in (torch.float32, torch.bfloat16, torch.float16) for m, n in ((8, 1024), (512, 2048))]

    def churn() -> None:
        for a, b in pairs:
            torch.bmm(a.unsqueeze(0), b.unsqueeze(0))  # bmm, not the mm that the GEMM cases time

    return churn


def first(calls: list[Callable[[], Any]], count: int) -> Callable[[], None]:
    def run() -> None:
        for call in calls[:count]:
            call()
    return run


def timed_durations(case: Case, run: Callable[[], None]) -> list[float]:
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return [k.duration for e in prof.events() if e.name == case.op for k in e.kernels]


# Each context: the steps run before every repeat, in order ("evict": read 256 MB; "code": the
# harness's code eviction, 42 distinct kernels over every SM; "code-small": the same kernels over
# 1023 elements, a block each; "gemms": cuBLAS GEMMs; "rewrite": every input rewritten in place).
CONTEXTS = {
    "produced": ("evict", "rewrite"),
    "evict,code,rewrite": ("evict", "code", "rewrite"),
    "code,evict,rewrite": ("code", "evict", "rewrite"),
    "evict,code-small,rewr": ("evict", "code-small", "rewrite"),
    "code,gemms,evict,rewr": ("code", "gemms", "evict", "rewrite"),
}


def contexts(case: Case, device: torch.device, steps: dict[str, Callable[[], Any]],
             variants: dict[str, tuple[str, ...]] = CONTEXTS) -> dict[str, list[float]]:
    timed, inputs = case.build(device)
    storages = {t.untyped_storage().data_ptr(): torch.empty(0, dtype=torch.uint8, device=device).set_(t.untyped_storage())
                for t in inputs}

    def rewrite() -> None:
        for storage in storages.values():
            storage.mul_(1)

    prepare = {**steps, "rewrite": rewrite}

    def context(names: tuple[str, ...]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(REPEATS):
                for name in names:
                    prepare[name]()
                timed()
        return run

    def warm() -> None:
        for _ in range(REPEATS):
            timed()

    warm()
    found = {"warm": timed_durations(case, warm)}
    for label, names in variants.items():
        found[label] = timed_durations(case, context(names))
    return found


def main() -> None:
    device = torch.device("cuda")
    torch.manual_seed(0)
    evict_words = torch.empty(64 << 20, device=device, dtype=torch.int32)
    kernels = distinct_kernels(device, CudaBackend.code_eviction_shape)
    steps: dict[str, Callable[[], Any]] = {
        "evict": evict_words.amax, "code": code_eviction(device, CudaBackend.code_eviction_shape),
        "code-small": code_eviction(device, (31, 33)), "gemms": gemm_churn(device),
        **{f"code{n}": first(kernels, n) for n in COUNTS}}
    for step in steps.values():
        step()
    names = ("warm", *CONTEXTS)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; median device us over {REPEATS} repeats "
          "(ratio to the in-model duration)")
    print(f"{'case':46s} {'model':>7s} " + " ".join(f"{n:>21s}" for n in names))
    for case in _cases():
        found = contexts(case, device, steps)
        cells = []
        for name in names:
            values = found[name]
            if not values:
                cells.append(f"{'-':>20s}")
                continue
            median = statistics.median(values)
            cells.append(f"{median:7.2f} ({median / case.in_model_us:4.2f}) n={len(values):<3d}")
        print(f"{case.name:46s} {case.in_model_us:7.2f} " + " ".join(cells))
    print(f"\nThe same, with the first N of the code eviction's kernels before the eviction and rewrite")
    print(f"{'case':46s} {'model':>7s} " + " ".join(f"{f'N={n}':>7s}" for n in COUNTS))
    for case in _cases():
        found = contexts(case, device, steps, {f"code{n}": (f"code{n}", "evict", "rewrite") for n in COUNTS})
        cells = [f"{statistics.median(found[f'code{n}']):7.2f}" for n in COUNTS]
        print(f"{case.name:46s} {case.in_model_us:7.2f} " + " ".join(cells))


if __name__ == "__main__":
    main()
