"""Whether a decode kernel's in-model duration depends on its code being in the L2 cache.

In the H100 profile of the FP8 Llama model (``benchmarks/model_coverage.py``), the per-token
``x / scale`` of ``[1,4096]`` bf16 by a 0-d float32 scale took 3.42-3.58 us in the calls where
less than 17 MB moved through the device since the kernel last ran, and 3.94-4.16 us where a
58 MB FP8 weight (or a whole step) streamed through in between; its replay, which evicts the
instruction caches and then the data cache before each repeat, took 4.1 us.  If the code's
trip from memory is the difference, a replay that leaves the code in L2 but not in the SMs'
instruction caches should take the short time.

Per kernel (the FP8 model's decode quantization kernels, with their in-model durations of both
kinds), the median device duration over 30 repeats after each context (steps before every
repeat, in order):

* ``code,evict,rewrite``: what the harness runs (its code eviction, a read of 256 MB, the inputs
  rewritten in place);
* ``evict,scratch,code,rewrite``: the read, the same kernel once on other tensors (its code
  into L2 and the instruction caches), the code eviction, the rewrite;
* ``evict,scratch,rewrite``: the same without the code eviction (the code in every cache).

Prerequisites: an NVIDIA GPU and torch with CUDA.  ``python reproduce/wip/code_l2_effect.py``
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

from perf_plugin.backends.cuda import CudaBackend
from perf_plugin.replay.code_eviction import code_eviction

REPEATS = 30
CONTEXTS = {
    "code,evict,rewrite": ("code", "evict", "rewrite"),
    "evict,scratch,code,rewrite": ("evict", "scratch", "code", "rewrite"),
    "evict,scratch,rewrite": ("evict", "scratch", "rewrite"),
}
Build = Callable[[torch.device], tuple[Callable[[], Any], list[torch.Tensor]]]


def divide(d: torch.device) -> tuple[Callable[[], Any], list[torch.Tensor]]:
    x = torch.randn(1, 4096, device=d, dtype=torch.bfloat16)
    scale = torch.full((), 0.01, device=d)
    return lambda: x / scale, [x, scale]


def amax(d: torch.device) -> tuple[Callable[[], Any], list[torch.Tensor]]:
    x = torch.randn(1, 4096, device=d, dtype=torch.bfloat16).abs()
    return lambda: x.amax(), [x]


def cast(d: torch.device) -> tuple[Callable[[], Any], list[torch.Tensor]]:
    x = torch.randn(1, 4096, device=d, dtype=torch.bfloat16)
    return lambda: x.to(torch.float8_e4m3fn), [x]


def absolute(d: torch.device) -> tuple[Callable[[], Any], list[torch.Tensor]]:
    x = torch.randn(1, 4096, device=d, dtype=torch.bfloat16)
    return lambda: x.abs(), [x]


# name, profiler op name, in-model us with < 17 MB since the kernel last ran, and with >= 58 MB
CASES: list[tuple[str, str, float, float, Build]] = [
    ("div [1,4096] bf16 / 0-d f32", "aten::div", 3.46, 4.10, divide),
    ("amax [1,4096] bf16", "aten::amax", 2.88, 3.12, amax),
    ("cast [1,4096] bf16 -> fp8", "aten::copy_", 1.39, 1.62, cast),
    ("abs [1,4096] bf16", "aten::abs", 1.09, 1.09, absolute),
]


def durations(op: str, run: Callable[[], None]) -> list[float]:
    """The device durations of ``op`` on a ``[1,4096]`` input (the code eviction runs ``abs`` and
    ``amax`` too, on its own shape)."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                            torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        run()
        torch.cuda.synchronize()
    return [k.duration for e in prof.events()
            if e.name == op and e.input_shapes and e.input_shapes[0] == [1, 4096] for k in e.kernels]


def measure(build: Build, op: str, device: torch.device, steps: dict[str, Callable[[], Any]]) -> dict[str, float]:
    timed, inputs = build(device)
    scratch, _ = build(device)  # the same kernel on tensors of its own
    storages = [torch.empty(0, dtype=torch.uint8, device=device).set_(t.untyped_storage()) for t in inputs]
    prepare = {**steps, "scratch": scratch, "rewrite": lambda: [s.mul_(1) for s in storages]}

    def context(names: tuple[str, ...]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(REPEATS):
                for name in names:
                    prepare[name]()
                timed()
        return run

    found = {}
    for label, names in CONTEXTS.items():
        context(names)()
        values = durations(op, context(names))
        values = values[1::2] if "scratch" in names else values  # each repeat's scratch call comes first
        found[label] = statistics.median(values) if values else float("nan")
    return found


def main() -> None:
    device = torch.device("cuda")
    torch.manual_seed(0)
    evict_words = torch.empty(64 << 20, device=device, dtype=torch.int32)
    steps: dict[str, Callable[[], Any]] = {
        "evict": evict_words.amax, "code": code_eviction(device, CudaBackend.code_eviction_shape)}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; median device us over {REPEATS} repeats")
    print(f"{'kernel':30s} {'model L2':>8s} {'model mem':>9s} " + " ".join(f"{n:>27s}" for n in CONTEXTS))
    for name, op, near, far, build in CASES:
        found = measure(build, op, device, steps)
        print(f"{name:30s} {near:8.2f} {far:9.2f} " + " ".join(f"{found[n]:27.2f}" for n in CONTEXTS))


if __name__ == "__main__":
    main()
