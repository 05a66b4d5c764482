"""Measure a device's peaks for the roofline: a large GEMM per dtype, a large copy.

What a roofline divides by must be what this device reaches, not a datasheet's figure: a
square GEMM per dtype (``torch.mm``; FP8 through ``torch._scaled_mm`` on CUDA devices that have
it) at a few sizes, and a device-to-device copy, each timed over repeats with the backend's
device events (host clock and synchronisation on the CPU).  The best repeat of the best size is
the peak: a roofline is an upper bound on throughput.  FLOAT is measured as torch runs it by
default (no TF32 for matmul), which is how float32 rows are replayed.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from perf_plugin.lookup.peaks import CACHE_BYTES, MULTIPROCESSORS, DevicePeaks
from perf_plugin.replay.tensors import DTYPES

if TYPE_CHECKING:
    import torch

    from perf_plugin.backends.base import Backend

MATMUL_DTYPES = ("BF16", "FLOAT16", "FLOAT", "FLOAT8_E4M3FN")


def _timer(backend: "Backend") -> Callable[[Callable[[], object], int], float]:
    """Seconds per call of ``fn``, the best of ``repeats`` timed calls after two warm-ups."""
    event = backend.timing_event()

    def best(fn: Callable[[], object], repeats: int) -> float:
        for _ in range(2):
            fn()
        backend.synchronize()
        times: list[float] = []
        for _ in range(repeats):
            if event is not None:
                start, end = event(enable_timing=True), event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(float(start.elapsed_time(end)) / 1e3)
            else:
                began = time.perf_counter()
                fn()
                backend.synchronize()
                times.append(time.perf_counter() - began)
        return min(times)

    return best


def _gemm(dtype: str, n: int, device: "torch.device", fp8: bool) -> Callable[[], object] | None:
    import torch

    if dtype == "FLOAT8_E4M3FN":
        if not fp8:
            return None  # no FP8 tensor cores to measure
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm takes it
        scale = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)
    torch_dtype = getattr(torch, DTYPES[dtype][0])
    x = torch.randn(n, n, device=device, dtype=torch_dtype)
    w = torch.randn(n, n, device=device, dtype=torch_dtype)
    return lambda: torch.mm(x, w)


def measure_peaks(backend: "Backend", sizes: Sequence[int], copy_mib: int, repeats: int = 10,
                  dtypes: Sequence[str] = MATMUL_DTYPES) -> DevicePeaks:
    """The device's peaks, measured now (``sizes``: the GEMMs' edge; ``copy_mib``: the copy's source)."""
    import torch

    device = backend.bind()
    best = _timer(backend)
    matmul: dict[str, float] = {}
    for dtype in dtypes:
        for n in sizes:
            fn = _gemm(dtype, n, device, backend.fp8_gemm())
            if fn is None:
                break
            tflops = 2.0 * n**3 / best(fn, repeats) / 1e12
            matmul[dtype] = max(matmul.get(dtype, 0.0), tflops)
            del fn
            backend.empty_cache()
    elements = copy_mib * 2**20 // 4
    source = torch.empty(elements, device=device, dtype=torch.float32).uniform_()
    target = torch.empty_like(source)
    copy_gbps = 2 * source.numel() * 4 / best(lambda: target.copy_(source), repeats) / 1e9
    details: dict[str, object] = {
        "measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "torch": str(torch.__version__), "machine": platform.machine(),
        "method": f"best of {repeats} repeats: square GEMMs of edge {', '.join(map(str, sizes))} per dtype "
                  f"(torch.mm; FP8 via torch._scaled_mm), a {copy_mib} MiB device-to-device copy "
                  "(read plus written bytes)",
    }
    units = backend.compute_units()
    if units:
        details[MULTIPROCESSORS] = units  # a tiled kernel's waves (grouped GEMMs, lookup/grouped.py)
    cache = backend.cache_bytes()
    if cache:
        details[CACHE_BYTES] = cache  # which inputs the replay's rotate kept cached (lookup/cache_state.py)
    return DevicePeaks(backend.device_name(), backend.name, matmul, copy_gbps, details)
