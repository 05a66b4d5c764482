"""Whether a CUDA batched GEMM's time depends on how many of its operand's elements are zero.

Llama 4's experts (transformers' ``Llama4TextExperts``) multiply every token by every expert's
weights with one ``bmm``, the tokens routed to other experts scaled by a router score of zero:
15 of 16 rows of each expert's input are zero.  Its prefill down projection, [16,512,8192] x
[16,8192,5120] bf16, took 764 us in the model on an H200 and 850 us replayed on random values
(1.11).  Here the same product is timed (``torch.profiler``'s kernel durations, median of 20
back-to-back calls) on inputs with none, half, 15 of 16 rows zero, or 94 % of the elements zero
at random places, and on values uniform in [0.5, 1.5], for the down and the gate-up
([16,512,5120] x [16,5120,16384]) projections; then the down projection on the replay's default
draws (uniform in +-[0.5, 1.5]) and on an activation's values (``silu(g) * u``) with and without
5 ms of idle time before each call, the SM clock read after each set.

Result on an H200 (torch 2.11, CUDA 13), median (min) us:

    product   normal   half rows zero   15/16 rows zero   94 % elements zero   uniform [0.5, 1.5]
    down      875      850              795               783                  835
    gate-up   1807     1753             1905 (1729)       1773 (1669)          1891

    down, back to back / after 5 ms idle: +-[0.5, 1.5] 837 / 837; silu(g) * u 872 / 871
    (SM clock 1830-1980 MHz); one token a row ([16,1,8192]): 291-293 on both

Idle time does not move them; the operand's zeros (and its values) do.  Zeros at random places
and zero rows run alike, so a replay that zeroes the recorded share at random places reproduces
the model's rows (Llama 4: 60.3 % of its time within 10 % without the share, 96.7 % with it;
docs/coverage.md).

Prerequisites: a CUDA GPU.

    python reproduce/wip/gemm_operand_zeros.py

Expected output: one line per product and operand, the median and least kernel time in us; then
one per idle time, with the SM clock and power after it.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile

DEVICE, BF16 = "cuda", torch.bfloat16
EXPERTS, TOKENS = 16, 512


def bmm_us(a: torch.Tensor, b: torch.Tensor, idle_s: float = 0.0, calls: int = 20) -> tuple[float, float]:
    """The median and least device time of ``torch.bmm(a, b)``'s kernel, each call after
    ``idle_s`` of idle device (0: back to back)."""
    torch.bmm(a, b)
    torch.cuda.synchronize()
    if idle_s:
        time.sleep(0.5)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            if idle_s:
                torch.cuda.synchronize()
                time.sleep(idle_s)
            torch.bmm(a, b)
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as handle:
        prof.export_chrome_trace(handle.name)
        events = json.load(open(handle.name))["traceEvents"]
    durations = [float(e["dur"]) for e in events if e.get("cat") == "kernel"]
    return statistics.median(durations), min(durations)


def sm_clock() -> str:
    query = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader"]
    return subprocess.run(query, capture_output=True, text=True).stdout.strip()


def main() -> None:
    torch.manual_seed(0)
    for name, (k, n) in (("down", (8192, 5120)), ("gate-up", (5120, 16384))):
        weights = (torch.randn(EXPERTS, k, n, device=DEVICE) * 0.02).to(BF16)
        x = torch.randn(EXPERTS, TOKENS, k, device=DEVICE, dtype=BF16)
        rows = torch.rand(EXPERTS, TOKENS, 1, device=DEVICE)
        cases = {
            "normal": x,
            "half rows zero": x * (rows < 0.5),
            "15/16 rows zero": x * (rows < 1 / 16),
            "94 % elements zero": x * (torch.rand(x.shape, device=DEVICE) < 1 / 16),
            "uniform [0.5, 1.5]": (torch.rand(x.shape, device=DEVICE) + 0.5).to(BF16),
        }
        for case, a in cases.items():
            median, least = bmm_us(a, weights)
            print(f"{name:8s} {case:22s} {median:8.1f} us (min {least:.1f})", flush=True)
    for tokens in (TOKENS, 1):
        shape = (EXPERTS, tokens, 8192)
        default = ((torch.rand(shape, device=DEVICE) + 0.5) * (torch.randint(0, 2, shape, device=DEVICE) * 2 - 1)).to(BF16)
        activation = torch.nn.functional.silu(torch.randn(shape, device=DEVICE, dtype=BF16)) * torch.randn(
            shape, device=DEVICE, dtype=BF16)
        weights = (torch.randn(EXPERTS, 8192, 5120, device=DEVICE) * 0.02).to(BF16)
        for case, a in (("+-[0.5, 1.5]", default), ("silu(g) * u", activation)):
            for idle in (0.0, 0.005):
                print(f"down, {tokens} token(s) a row, {case:13s} idle {idle * 1000:.0f} ms: "
                      f"{bmm_us(a, weights, idle)[0]:8.1f} us  ({sm_clock()})", flush=True)


if __name__ == "__main__":
    main()
