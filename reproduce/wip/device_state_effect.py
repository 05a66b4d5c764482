"""Whether a decode GEMM that streams a large weight depends on what the device did just before.

Two fresh models replayed their weight-streaming decode kernels slower than the model ran them,
in every cache mode (H200, ``benchmarks/model_coverage.py --models hf:granitemoe,hf:ernie4_5_moe``):
GraniteMoE's gate/up grouped GEMM of 2 rows over 8 experts of 4096 x 22016 (a transposed weight)
at 141-146 us in the model and 174 us replayed (``warm``, ``rotate``, ``idle``, ``produced`` and
``cold`` alike: 1.21-1.26), ERNIE-4.5's vocabulary GEMV (1 x 2560 by 103424) at 125.7 us in the
model and 131-145 us replayed.  Here both kernels are timed alone (CUDA events around one call,
the host waiting for each) after several kinds of preceding work, and on weights of several
value distributions.

Result on an H200 (torch 2.11, CUDA 13), median us of 30 calls (three runs of this script's
parts, before they were joined into it):

* the GEMV after nothing (the host's wait only) 158-166, after 1 ms of idle device 230, after a
  20 us device-side spin 157, after a 200 us or 2 ms spin 130 (the model: 125.7), after 30 or
  300 small kernels launched from the host 195-215; the grouped GEMM 214, 259, 211, 180, 181,
  201-203 (the model: 141-146);
* the GEMV with idle gaps between calls of 0, 0.5, 2, 10 and 50 ms: 149, 155, 232, 327 and 391;
  50 calls back to back, 133 each;
* the weight's values (uniform in +-[0.5, 1.5] as the replay draws, normal with std 0.02 as the
  models initialise, standard normal, zeros): the grouped GEMM 196-206, the GEMV 144-155, no
  order between them.

So the values do not matter and the device's state does: a kernel that streams hundreds of MB
runs up to 1.8x slower on a device that was idle, and a device kept busy (on one SM, with no
memory traffic) for 200 us before it brings the GEMV to the model's time.  A replay that spins
the device before every repeat was built; its spin launched the kernel the harness marks
repeats with (``torch.cuda._sleep``), and the attribution refused every case, so its effect on
the replays is not measured yet.

Prerequisites: a CUDA GPU with ``torch._grouped_mm`` (Hopper), torch with ``torch.cuda._sleep``.

    python reproduce/wip/device_state_effect.py

Expected output: one line per kernel and preceding work, then one per kernel and idle gap, one
for the GEMVs back to back, then one per kernel and weight fill.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

DEVICE = "cuda"
CYCLES_PER_US = 1980  # the H200's SM clock in MHz: torch.cuda._sleep counts clock cycles


def median_us(call: Callable[[], object], before: Callable[[], object], reps: int = 30) -> float:
    """Median time of ``call`` (CUDA events), the host waiting for the device before ``before``."""
    for _ in range(5):
        before()
        call()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return float(round(sorted(times)[reps // 2], 1))


def fill(tensor: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "uniform +-[0.5, 1.5]":
        tensor.uniform_(0.5, 1.5).mul_(torch.randint(0, 2, tensor.shape, device=DEVICE).to(tensor.dtype) * 2 - 1)
    elif kind == "normal std 0.02":
        tensor.normal_(0, 0.02)
    elif kind == "normal":
        tensor.normal_()
    else:
        tensor.zero_()
    return tensor


def main() -> None:
    experts = torch.empty(8, 22016, 4096, device=DEVICE, dtype=torch.bfloat16).normal_(0, 0.02)
    tokens = torch.randn(2, 4096, device=DEVICE, dtype=torch.bfloat16)
    offsets = torch.tensor([0, 1, 2, 2, 2, 2, 2, 2], device=DEVICE, dtype=torch.int32)  # one row to each of two experts
    vocabulary = torch.empty(103424, 2560, device=DEVICE, dtype=torch.bfloat16).normal_(0, 0.02)
    hidden = torch.randn(1, 2560, device=DEVICE, dtype=torch.bfloat16)
    small = torch.randn(1, 4096, device=DEVICE)
    kernels: dict[str, Callable[[], object]] = {
        "grouped GEMM": lambda: torch._grouped_mm(tokens, experts.transpose(1, 2), offs=offsets),
        "vocabulary GEMV": lambda: torch.nn.functional.linear(hidden, vocabulary),
    }

    def spin(us: int) -> Callable[[], object]:
        return lambda: torch.cuda._sleep(us * CYCLES_PER_US)

    def small_kernels(count: int) -> Callable[[], object]:
        return lambda: [small.mul_(1.0001) for _ in range(count)]

    preceding: dict[str, Callable[[], object]] = {
        "nothing": lambda: None, "1 ms idle": lambda: time.sleep(0.001), "20 us spin": spin(20),
        "200 us spin": spin(200), "2 ms spin": spin(2000), "30 small kernels": small_kernels(30),
        "300 small kernels": small_kernels(300),
    }
    for name, call in kernels.items():
        for before_name, before in preceding.items():
            print(f"{name}, after {before_name}: {median_us(call, before)} us")
    for name, call in kernels.items():
        for gap_ms in (0, 0.5, 2, 10, 50):
            print(f"{name}, {gap_ms} ms idle between calls: {median_us(call, lambda: time.sleep(gap_ms / 1000))} us")
    call = kernels["vocabulary GEMV"]
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(50):
        call()
    end.record()
    end.synchronize()
    print(f"vocabulary GEMV, 50 calls back to back: {start.elapsed_time(end) * 1000 / 50:.1f} us each")
    for kind in ("uniform +-[0.5, 1.5]", "normal std 0.02", "normal", "zeros"):
        fill(experts, kind)
        fill(vocabulary, kind)
        for name, call in kernels.items():
            print(f"{name}, weight {kind}: {median_us(call, lambda: None)} us")


if __name__ == "__main__":
    main()
