"""Whether a CUDA softmax's time depends on masked logits, and on where they lie in the row.

GPT-OSS's eager attention adds a causal (or 128-token sliding-window) mask holding bf16's lowest
value to its scaled ``q k^T``, appends the sinks, subtracts each row's maximum and takes the
softmax of [1, 64, 512, 513] bf16 logits: 51-59 us in the model on an H200, 40.5 us replayed on
random normal values (0.73).  Here the same kernel (``softmax_warp_forward``) is timed
(``torch.profiler``'s kernel durations, median of 30 calls, the L2 cache flushed before each) on
logits of that shape masked in different ways: by the causal and the sliding-window masks, by
masks of the same share at random places or in a few runs per row, by masks at other values, and
by ``perf_plugin.replay.value_draws.masked_runs`` at the share and runs the capture records of
the causal mask (what the replay builds).

Result on an H200 (torch 2.11, CUDA 13): random logits 40.5 us; causal mask 52.3 us (bf16's lowest
value or ``-inf`` alike); sliding window 58.2 us; the causal mask's share at random places 62.5 us;
half of each row masked in 1 run 52.2 us, 2 runs 53.6, 4 runs 55.6, 16 runs 61.3, 64 runs 62.5.
Masked at 60 below the row's maximum: 40.5 us; at 80 below: 55.5; 88: 67.2; 100: 75.0 (denormal
exponentials); 110: 54.9; 1000: 52.4.  The replay's masks at the causal mask's recorded share
and runs (0.513:1) took 52.6 us.  So a masked element takes a slower exponential, a warp is as
slow as its slowest lane, and the time follows the masked share and how many runs it falls in,
not which rows hold it.

Prerequisites: a CUDA GPU; this project installed.

    python reproduce/wip/softmax_masked_values.py

Expected output: one line per logits set, the softmax's median kernel time in us and the share of
masked elements.
"""

from __future__ import annotations

import json
import statistics
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

from perf_plugin.capture.masked_rows import masked_rows
from perf_plugin.replay.value_draws import masked_runs

DEVICE, BF16 = "cuda", torch.bfloat16
HEADS, QUERIES, KEYS = 64, 512, 512


def softmax_us(x: torch.Tensor, flush: torch.Tensor, calls: int = 30) -> float:
    """The median device time of ``x.softmax(-1)``'s kernel, the L2 cache flushed before each call."""
    for _ in range(3):
        x.softmax(-1)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush.zero_()
            x.softmax(-1)
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as handle:
        prof.export_chrome_trace(handle.name)
        events = json.load(open(handle.name))["traceEvents"]
    return statistics.median(float(e["dur"]) for e in events if e.get("cat") == "kernel" and "softmax" in e["name"])


def with_sinks(logits: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """GPT-OSS's combined logits: the sinks appended, each row's maximum subtracted."""
    combined = torch.cat([logits, sinks], dim=-1)
    return combined - combined.max(dim=-1, keepdim=True).values


def main() -> None:
    torch.manual_seed(0)
    flush = torch.empty(128 * 1024 * 1024, device=DEVICE)  # 512 MB: past the L2 cache
    lowest = torch.finfo(BF16).min
    logits = torch.randn(1, HEADS, QUERIES, KEYS, device=DEVICE, dtype=BF16) * 3
    sinks = torch.randn(1, HEADS, QUERIES, 1, device=DEVICE, dtype=BF16)
    query = torch.arange(QUERIES, device=DEVICE)[:, None]
    key = torch.arange(KEYS, device=DEVICE)[None, :]
    causal, sliding = key > query, (key > query) | (query - key >= 128)
    random_places = torch.rand(1, HEADS, QUERIES, KEYS, device=DEVICE) < float(causal.float().mean())
    cases = {
        "random normal": with_sinks(logits, sinks),
        "causal mask (lowest value)": with_sinks(logits.masked_fill(causal, lowest), sinks),
        "causal mask (-inf)": with_sinks(logits.masked_fill(causal, float("-inf")), sinks),
        "sliding window 128": with_sinks(logits.masked_fill(sliding, lowest), sinks),
        "causal share at random places": with_sinks(logits.masked_fill(random_places, lowest), sinks),
    }
    generator = torch.Generator(DEVICE).manual_seed(0)
    for runs in (1, 2, 4, 16, 64):
        mask = masked_runs(HEADS * QUERIES, KEYS, 0.5, runs, generator).view(1, HEADS, QUERIES, KEYS)
        cases[f"half of each row in {runs} run(s)"] = with_sinks(logits.masked_fill(mask, lowest), sinks)
    for below in (-60, -80, -88, -100, -110, -1000):
        cases[f"causal mask at {below} below the maximum"] = with_sinks(logits, sinks).masked_fill(
            torch.cat([causal, torch.zeros(QUERIES, 1, dtype=torch.bool, device=DEVICE)], -1), below)
    causal_logits = cases["causal mask (lowest value)"]
    recorded = masked_rows(causal_logits[0, :, ::16].float().reshape(-1, KEYS + 1).tolist())  # the capture's record
    rows = masked_runs(HEADS * QUERIES, KEYS + 1, recorded.share, recorded.runs, generator)
    cases[f"the replay's masks at the recorded {recorded.share:.3f}:{recorded.runs:.3f}"] = (
        torch.randn_like(causal_logits).masked_fill(rows.view(causal_logits.shape), lowest))
    for name, x in cases.items():
        share = float((x.float() - x.float().amax(-1, keepdim=True) < -87.34).float().mean())
        print(f"{name:52s} {softmax_us(x, flush):7.2f} us   masked share {share:.3f}", flush=True)


if __name__ == "__main__":
    main()
