"""Print the raw Kineto events of a small CUDA run: names, device, correlation ids, times.

A diagnostic for the in-process collector's attribution (which links device kernels to the
labelled CPU ranges through correlation ids); run it on a new torch or driver version.
"""

from __future__ import annotations

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    a = torch.randn(256, 256, device="cuda")
    b = torch.randn(256, 256, device="cuda")
    a.mm(b)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with torch._C._profiler._RecordFunctionFast("perfcase::1::0"):
            torch.cuda._sleep(1)  # the collector's repeat marker
            a.mm(b)
            a.add(b)
            a.clone()
        torch.cuda.synchronize()
    for event in prof.profiler.kineto_results.events():
        print(
            f"{event.name()[:50]:50} dev={event.device_type() != DeviceType.CPU!s:5} start={event.start_ns()} "
            f"dur={event.duration_ns()} corr={event.correlation_id()} linked={event.linked_correlation_id()} "
            f"ann={event.is_user_annotation()} thread={event.start_thread_id()}"
        )


if __name__ == "__main__":
    main()
