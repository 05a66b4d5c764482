"""Why Jamba's Mamba scan steps replayed 1.22-1.26x their in-model time, and what a step costs.

Jamba's slow scan runs, per token, ``ssm_state = dA[:, :, i] * ssm_state + dBu[:, :, i]`` over
``[1,8192,512,16]`` float32 tensors written before the loop: each step reads a 64-byte run of
every channel, next to the run the step before it read.  In the model a ``Mul`` step took 2.50 us
on an H100; the replay took 3.07 (``Add``: 2.52 and 3.18).  The row recorded the slice as cached:
the previous step's read of the neighbouring slice counted as a use of the whole tensor, so
``produced`` rewrote the whole 256 MB storage before each repeat.

Here, timed from ``torch.profiler``'s kernel durations (median), the model's loop itself, and one
step's ``mul`` after a read of twice the last-level cache and a rewrite of ``ssm_state``: the same
slice every repeat or the next one, with the previous slice read just before or not, with no
eviction, after some megabytes of dirty lines, after the code-evicting kernels, and after a
rewrite of the tail of ``dA``'s storage.

Result on an H100 80GB HBM3 (torch 2.11, CUDA 13), us: the model's loop 2.50 (``Add`` 2.53);
evicted and the same slice 2.50, the next slice 2.50, the previous slice read first 2.50; not
evicted, the next slice 2.46, the same slice 1.89; after 5 or 15 MB of dirty lines 2.50, 30 MB
3.14, 45 MB 3.11; after the code eviction 2.75; after rewriting the last 8 MB of ``dA`` 2.50, the
last 30 MB 3.10.  The slices' order does not matter; the dirty lines the rewrite left do.  Ingest
now counts a read of a view as a use of that part only (``perf_plugin.ingest.written_tensors.part_view``).

Prerequisites: a CUDA GPU, this project installed.

    python reproduce/wip/scan_slice_reads.py

Expected output: one line per scenario, ``scenario  MEDIAN_US``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from perf_plugin.backends.cuda import CudaBackend
from perf_plugin.replay.code_eviction import code_eviction

CHANNELS, STEPS, STATE = 8192, 512, 16
STEP_SHAPE = [1, CHANNELS, STATE]


def kernel_us(prof: profile, name: str, two_inputs: bool) -> list[float]:
    """Device time of each call of ``name`` on step-shaped inputs, in order."""
    return [sum(k.duration for k in event.kernels) for event in prof.events()
            if event.name == name and event.kernels and event.input_shapes[0] == STEP_SHAPE
            and (not two_inputs or event.input_shapes[1] == STEP_SHAPE)]


def median_of(values: list[float], skip: int) -> float:
    return statistics.median(values[skip:])


def main() -> None:
    device = torch.device("cuda")
    generator = torch.Generator(device=device).manual_seed(0)
    dt = torch.nn.functional.softplus(torch.randn(1, CHANNELS, STEPS, device=device, generator=generator)) * 0.1
    a = -torch.exp(torch.randn(CHANNELS, STATE, device=device, generator=generator))
    d_a = torch.exp(a[None, :, None, :] * dt[:, :, :, None])
    d_bu = torch.randn(1, CHANNELS, STEPS, STATE, device=device, generator=generator)
    c = torch.randn(1, STEPS, STATE, device=device, generator=generator).bfloat16()

    def scan() -> None:
        state = torch.zeros(1, CHANNELS, STATE, device=device, dtype=torch.bfloat16)
        for i in range(STEPS):
            state = d_a[:, :, i] * state + d_bu[:, :, i]
            torch.matmul(state.to(torch.bfloat16), c[:, i, :].unsqueeze(-1))

    scan()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        scan()
        torch.cuda.synchronize()
    print(f"model loop mul  {median_of(kernel_us(prof, 'aten::mul', False), 2):.3f}")
    print(f"model loop add  {median_of(kernel_us(prof, 'aten::add', False), 2):.3f}")

    cache = torch.cuda.get_device_properties(device).L2_cache_size
    buffer = torch.zeros(2 * cache, dtype=torch.uint8, device=device)
    words = buffer.view(torch.int32)
    evict_code = code_eviction(device, CudaBackend.code_eviction_shape)
    state = torch.randn(1, CHANNELS, STATE, device=device)
    flat = d_a.view(-1)

    def step(walk: bool = False, evict: bool = True, previous: bool = False, dirty_mb: int = 0,
             code: bool = False, tail_mb: int = 0) -> Callable[[int], None]:
        def run(k: int) -> None:
            i = (k + 1) % STEPS if walk else 0
            if code:
                evict_code()
            if evict:
                words.amax()
            if dirty_mb:
                buffer[: dirty_mb * 2**20].fill_(1)
            if tail_mb:
                flat[-tail_mb * 2**18:].mul_(1)
            if previous:
                torch.neg(d_a[:, :, i - 1])
            state.mul_(1)
            torch.mul(d_a[:, :, i], state)
        return run

    scenarios = {
        "evicted, same slice": step(), "evicted, next slice": step(walk=True),
        "evicted, previous slice read first": step(walk=True, previous=True),
        "not evicted, next slice": step(walk=True, evict=False), "not evicted, same slice": step(evict=False),
        **{f"evicted, {mb} MB dirty": step(dirty_mb=mb) for mb in (5, 15, 30, 45)},
        "evicted, code evicted": step(code=True),
        **{f"evicted, last {mb} MB of dA rewritten": step(tail_mb=mb) for mb in (8, 30)},
    }
    for name, run in scenarios.items():
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            for k in range(60):
                run(k)
            torch.cuda.synchronize()
        print(f"{name:<40} {median_of(kernel_us(prof, 'aten::mul', True), 5):.3f}")


if __name__ == "__main__":
    main()
