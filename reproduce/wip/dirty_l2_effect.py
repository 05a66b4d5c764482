"""Whether the dirty lines a model's element-wise kernels leave in L2 slow its prefill GEMMs.

In the H100 profiles of ``benchmarks/model_coverage.py`` the prefill GEMMs run 11-15 % longer in
the model than replayed (bf16 512x4096x4096: 26.1-27.4 us against 23.4-23.8), while decode GEMMs
replay within a few percent.  Before every prefill GEMM the model ran element-wise kernels that
write megabytes (an RMSNorm in float32 over 512x4096 writes ~30 MB); a decode step writes
kilobytes.  The harness evicts the cache by reading a buffer, which leaves clean lines; a dirty
line costs a write-back to memory when the GEMM's weight stream evicts it.

Part 1, isolated: per GEMM, the median device duration over 30 repeats, each after an eviction
by reads, then ``D`` bytes written (dirty lines), then the activation rewritten; ``full``: the
eviction by writes (a buffer twice the L2 overwritten).

Part 2, inside the model (Llama-3.1-8B dimensions, 4 layers, a 512-token prefill, bf16 and FP8
as ``model_coverage.py`` builds them): the q, gate and down GEMMs of every layer timed as the
model runs them (``as-is``), and with a step inserted just before each: the activation
rewritten (``rewrite``, the control), an eviction by reads then the rewrite (``clean``), an
eviction by writes then the rewrite (``dirty``).

Result on an H100 (80GB HBM3), in us, isolated: the bf16 q GEMM 23.42 after an eviction by
reads, 24.10 / 25.44 / 26.56 with 8 / 16 / 24 MB written after it, 26.5-26.7 with more or after
an eviction by writes; gate 87.8 -> 92.3, down 76.9 -> 80.4, the FP8 q GEMM 14.34 -> 16.43, FP8
down 40.5 -> 45.0, a decode GEMV of 4096x4096 7.81 -> 9.9.  Inside the model (as-is / rewrite /
clean / dirty): bf16 q 26.72 / 26.31 / 23.71 / 27.15, FP8 q 16.58 / 16.43 / 14.93 / 16.94, FP8
down 45.57 / 44.77 / 41.63 / 45.87.  Evicted by reads just before it, the model's own GEMM runs
as fast as the replay did; the model left the cache dirty.  (The bf16 down GEMM is the
exception: 76.9 as-is, 80.2 clean.)

Prerequisites: an NVIDIA GPU, torch with CUDA, ``transformers``.
``python reproduce/wip/dirty_l2_effect.py``
"""

from __future__ import annotations

import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

REPEATS = 30
MIB = 1 << 20
FP8 = torch.float8_e4m3fn
GEMM_OPS = ("aten::mm", "aten::_scaled_mm", "aten::addmm")


def durations_by_range(run: Callable[[], Any]) -> dict[str, list[float]]:
    """Device durations (us) of the GEMM kernels ``run`` launches, keyed by the innermost
    ``record_function`` range around them."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    found: dict[str, list[float]] = defaultdict(list)
    for event in prof.events():
        if event.name not in GEMM_OPS:
            continue
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("probe:"):
            parent = parent.cpu_parent
        key = parent.name if parent is not None else "unranged"
        found[key].extend(k.duration for k in event.kernels)
    return found


class Cache:
    """Steps that leave the L2 clean (evicted by reads) or partly / wholly dirty."""

    def __init__(self, device: torch.device) -> None:
        self.l2 = torch.cuda.get_device_properties(device).L2_cache_size
        self.read_buffer = torch.ones(2 * self.l2 // 4, dtype=torch.int32, device=device)
        self.write_buffer = torch.empty(2 * self.l2, dtype=torch.uint8, device=device)

    def clean(self) -> None:
        self.read_buffer.amax()

    def dirty(self, nbytes: int) -> None:
        self.clean()
        if nbytes:
            self.write_buffer[:nbytes].fill_(1)

    def full(self) -> None:
        self.write_buffer.fill_(1)


def bf16_case(m: int, n: int, k: int, d: torch.device) -> tuple[Callable[[], Any], torch.Tensor]:
    x = torch.randn(m, k, device=d, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=d, dtype=torch.bfloat16) * 0.02
    return lambda: F.linear(x, w), x


def fp8_case(m: int, n: int, k: int, d: torch.device) -> tuple[Callable[[], Any], torch.Tensor]:
    x = torch.randn(m, k, device=d).to(FP8)
    w = (torch.randn(n, k, device=d) * 0.02).to(FP8)
    one = torch.ones((), device=d)
    return lambda: torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), x.view(torch.uint8)


CASES = {
    "bf16 q 512x4096x4096": lambda d: bf16_case(512, 4096, 4096, d),
    "bf16 gate 512x14336x4096": lambda d: bf16_case(512, 14336, 4096, d),
    "bf16 down 512x4096x14336": lambda d: bf16_case(512, 4096, 14336, d),
    "bf16 decode 1x4096x4096": lambda d: bf16_case(1, 4096, 4096, d),
    "fp8 q 512x4096x4096": lambda d: fp8_case(512, 4096, 4096, d),
    "fp8 down 512x4096x14336": lambda d: fp8_case(512, 4096, 14336, d),
}


def isolated(cache: Cache, device: torch.device) -> None:
    steps: dict[str, Callable[[], None]] = {f"dirty {mb} MB": (lambda mb=mb: cache.dirty(mb * MIB))
                                            for mb in (0, 8, 16, 24, 32, 40, 50)}
    steps["full"] = cache.full
    print(f"\nPart 1, isolated (L2 {cache.l2 / MIB:.0f} MiB): median us over {REPEATS} repeats")
    print(f"{'GEMM':<28}" + "".join(f"{name:>12}" for name in steps))
    for case, build in CASES.items():
        run, activation = build(device)
        cells = []
        for step in steps.values():
            def repeats() -> None:
                for _ in range(REPEATS):
                    step()
                    activation.mul_(1)
                    with record_function("probe:gemm"):
                        run()
            run()
            values = durations_by_range(repeats)["probe:gemm"]
            cells.append(statistics.median(values))
        print(f"{case:<28}" + "".join(f"{c:12.2f}" for c in cells))


class Probe(torch.nn.Module):
    """Runs ``before(x)`` and then the wrapped linear layer inside a named range."""

    def __init__(self, name: str, inner: Any) -> None:
        super().__init__()
        self.name, self.inner = name, inner
        self.before: Callable[[torch.Tensor], None] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        function = getattr(self.inner, "function", None)
        if function is not None:  # an FP8 linear: the step goes between quantization and GEMM
            return self.fp8(function, x)
        if self.before is not None:
            self.before(x)
        with record_function(f"probe:{self.name}"):
            return self.inner(x)

    def fp8(self, layer: Any, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        scale = (flat.abs().amax().float() / 448.0).clamp(min=1e-12)
        quantized = (flat / scale).to(FP8)
        if self.before is not None:
            self.before(quantized.view(torch.uint8))
        with record_function(f"probe:{self.name}"):
            out = torch._scaled_mm(quantized, layer.weight, scale_a=scale, scale_b=layer.weight_scale,
                                   out_dtype=x.dtype)
        return out.reshape(*x.shape[:-1], out.shape[-1])


def in_model(cache: Cache, name: str) -> None:
    import model_coverage

    model = model_coverage.build_model(name, 4, "cuda", False, 512)
    probes = []
    for layer in model.model.layers:
        for owner, attr in ((layer.self_attn, "q_proj"), (layer.mlp, "gate_proj"), (layer.mlp, "down_proj")):
            probe = Probe(attr.split("_")[0], getattr(owner, attr))
            setattr(owner, attr, probe)
            probes.append(probe)
    ids = model_coverage.prefill_ids(model, "cuda", 512)
    def rewrite(x: torch.Tensor) -> None:
        x.mul_(1)

    def clean(x: torch.Tensor) -> None:
        cache.clean()
        rewrite(x)

    def dirty(x: torch.Tensor) -> None:
        cache.full()
        rewrite(x)

    variants: dict[str, Callable[[torch.Tensor], None] | None] = {
        "as-is": None, "rewrite": rewrite, "clean": clean, "dirty": dirty}
    results: dict[str, dict[str, float]] = {}
    for variant, before in variants.items():
        for probe in probes:
            probe.before = before
        with torch.no_grad():
            model(input_ids=ids)

            def prefills() -> None:
                for _ in range(3):
                    model(input_ids=ids)
                    torch.cuda.synchronize()
                    time.sleep(0.01)
            found = durations_by_range(prefills)
        results[variant] = {key: statistics.median(v) for key, v in found.items() if key.startswith("probe:")}
    print(f"\nPart 2, inside the {name} model: median us over 4 layers x 3 prefills")
    print(f"{'GEMM':<14}" + "".join(f"{v:>16}" for v in variants))
    for key in sorted(results["as-is"]):
        base = results["as-is"][key]
        print(f"{key:<14}" + "".join(f"{results[v][key]:8.2f} ({results[v][key] / base:4.2f})" for v in variants))
    del model
    torch.cuda.empty_cache()


def main() -> None:
    device = torch.device("cuda")
    torch.manual_seed(0)
    cache = Cache(device)
    isolated(cache, device)
    for name in ("llama", "llama-fp8"):
        in_model(cache, name)


if __name__ == "__main__":
    main()
