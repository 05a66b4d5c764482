"""Whether a CUDA division's time depends on its operands' values.

PhiMoE's router (``sparsemixer``) divides ``max - scores`` by ``|scores|`` clamped at the max: a
``RealDiv`` of two [512, 16] bf16 tensors that took 2.18 us in the model on an H200 and 1.22 us
replayed on random normal operands (0.56).  Here the same kernel is timed (``torch.profiler``'s
kernel durations, median of 30 calls) on operands of the same shape and dtype whose values
differ: random normal ones, ones with zero numerators, the router's own, and the router's with
its zeros (or its small numerators) moved.

Result on an H200 (torch 2.11, CUDA 13): random normal operands 1.12 us; the router's operands
2.05 us (513 of 8192 numerators zero: each row's maximum); the same with those zeros set to 0.01,
1.12 us, and with its small non-zero numerators raised instead, 2.02 us; every numerator zero
1.98 us; one zero numerator per row in the first column, 1.25 us.  Zero numerators send the
device's division down a slower path, by how much depends on where they lie, so a replay on
random values ran at 0.55 of the model's time.

Prerequisites: a CUDA GPU.

    python reproduce/wip/division_operand_values.py

Expected output: one line per operand set, the division's median kernel time in us and how many
of its numerators are zero.
"""

from __future__ import annotations

import json
import statistics
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile


def division_us(numerator: torch.Tensor, denominator: torch.Tensor, calls: int = 30) -> float:
    """The median device time of ``numerator / denominator``'s kernel."""
    for _ in range(3):
        numerator / denominator
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            numerator / denominator
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as handle:
        prof.export_chrome_trace(handle.name)
        events = json.load(open(handle.name))["traceEvents"]
    durations = [float(e["dur"]) for e in events if e.get("cat") == "kernel" and "DivFunctor" in e["name"]]
    return statistics.median(durations)


def main() -> None:
    torch.manual_seed(0)
    device, bf16 = "cuda", torch.bfloat16
    scores = torch.randn(512, 16, device=device, dtype=bf16)
    top = scores.max(dim=-1, keepdim=True).values
    router = (top - scores, scores.abs().clamp(min=top))  # sparsemixer's quotient
    numerator = router[0]
    first_column = torch.arange(16, device=device) == 0
    cases = {
        "random normal / random normal": (torch.randn_like(scores), torch.randn_like(scores)),
        "router's operands": router,
        "router's, zero numerators set to 0.01": (torch.where(numerator == 0, 0.01, numerator).to(bf16), router[1]),
        "router's, numerators below 0.05 (not zero) set to 0.05": (
            torch.where((numerator != 0) & (numerator < 0.05), 0.05, numerator).to(bf16), router[1]),
        "router's plus 0.01": ((numerator + 0.01).to(bf16), router[1]),
        "random normal, one zero numerator per row": (torch.where(first_column, 0.0, torch.randn_like(scores)).to(bf16),
                                                      torch.randn_like(scores)),
        "every numerator zero / random normal": (torch.zeros_like(scores), torch.randn_like(scores)),
    }
    for name, (a, b) in cases.items():
        zeros = int((a == 0).sum())
        print(f"{name:58s} {division_us(a, b):6.3f} us   zero numerators {zeros}/{a.numel()}")


if __name__ == "__main__":
    main()
