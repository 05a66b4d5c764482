"""Harness durations next to independent measurements of the same kernels (CUDA).

For about a dozen kernels from ~2 us to ~5 ms:

1. the harness: a database with one real-format row per kernel is replayed by ``pytest bench``
   (subprocess), and ``Average Duration(us)`` is read back from the CSVs;
2. reference A, a CUPTI trace of a bare script: the same torch call on tensors of the same
   shapes, written here independently of the replays, timed with ``torch.profiler`` (Kineto
   reading CUPTI activity records) and summed per iteration over the kernels it launched.  The
   session is started before 5 untimed warm-up calls, as the harness's session is already
   running when a case warms up; the ``@start`` column is the same loop in a session started
   right before the first timed call, for comparison;
3. reference B, Nsight Compute's ``gpu__time_duration.sum`` of the same bare call (only for
   kernels of 20 us and more: below that ncu's figure includes its own replay overhead).

Reproduces docs/measured.md, "Measured" (H100), the table "Harness vs a CUPTI trace of a bare script"
(12 kernels, 50 repeats, warm cache, medians of alternating rounds; the columns verify-first,
idle 3 s run 1 and run 2, and ``@start``), the run with neither option (7 of 12 within 2 %), and
the Nsight Compute figures of the first note.

Verification missing: needs an NVIDIA GPU (and ``ncu`` for reference B); not run on this
version: README's table comes from an H100 80GB HBM3 (torch 2.11, CUDA 13, driver 580), partly
with an earlier version of the project (README says which columns).

Prerequisites: an NVIDIA GPU with about 3 GiB free, torch built for CUDA, Nsight Compute's
``ncu`` on the path (or ``--no-ncu``), this project installed (``pip install -e .``), run from a
checkout of the repository (the harness side runs ``bench/test_kernels.py``).

    python reproduce/wip/compare_reference_cuda.py --repeats 50 --rounds 2                          # with ncu
    python reproduce/wip/compare_reference_cuda.py --repeats 50 --rounds 2 --verify-first --no-ncu  # column verify-first
    python reproduce/wip/compare_reference_cuda.py --repeats 50 --rounds 2 --idle-ms 3000 --no-ncu  # columns idle 3 s

Other options: ``[--with-markers] [--busy-ms 200] [--cache-mode warm] [--out DIR]``.

Expected output (several minutes): a header line, then one table line per kernel: harness us and
its spread over rounds, CUPTI us and its spread, their ratio (target: within 2 %), ncu us and
ratio (kernels of 20 us and more), CUPTI ``@start`` us and ratio; then
``DIR/compare_reference_cuda.json`` (by default in a new temporary directory) with every
kernel's figures under ``stats.kernels``.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perf_plugin.report.environment import collect_env_spec
from perf_plugin.report.run_json import LLM_CONCURRENCY, finite_values, report_json

ROOT = Path(__file__).resolve().parents[2]
NAME = "compare_reference_cuda"
HEADER = "OP State,Accelerator Core,Input Shapes,Input Data Types,Input Formats,Output Shapes,Output Data Types,Output Formats"


@dataclass(frozen=True)
class Kernel:
    name: str
    kernel_type: str
    row: str  # identity cells after OP State and Accelerator Core
    bare: str  # python statements defining `args` (tuple) and `fn` for the bare measurement


KERNELS: tuple[Kernel, ...] = (
    Kernel("add-1k-f32", "Add", '"""1024;1024""",FLOAT;FLOAT,ND;ND,"""1024""",FLOAT,ND',
           "x=rnd((1024,),f32); y=rnd((1024,),f32); fn=lambda: x.add(y)"),
    Kernel("cast-bf16-f32-4M", "Cast", '"""1,4096,1024""",DT_BF16,ND,"""1,4096,1024""",FLOAT,ND',
           "x=rnd((1,4096,1024),bf16); fn=lambda: x.to(f32)"),
    Kernel("add-4k-mixed", "Add", '"""4096,1024;4096,1024""",FLOAT;DT_BF16,ND;ND,"""4096,1024""",FLOAT,ND',
           "x=rnd((4096,1024),f32); y=rnd((4096,1024),bf16); fn=lambda: x.add(y)"),
    Kernel("mm-128x1024x1024", "MatMulV2", '"""128,1024;1024,1024""",DT_BF16;DT_BF16,ND;ND,"""128,1024""",DT_BF16,ND',
           "a=rnd((128,1024),bf16); b=rnd((1024,1024),bf16); fn=lambda: a.mm(b)"),
    Kernel("softmax-4096x4096", "SoftmaxV2", '"""4096,4096""",FLOAT,ND,"""4096,4096""",FLOAT,ND',
           "x=rnd((4096,4096),f32); fn=lambda: x.softmax(-1)"),
    Kernel("mm-4096x1024x3072", "MatMulV3", '"""4096,1024;1024,3072""",DT_BF16;DT_BF16,ND;ND,"""4096,3072""",DT_BF16,ND',
           "a=rnd((4096,1024),bf16); b=rnd((1024,3072),bf16); fn=lambda: a.mm(b)"),
    Kernel("copy-4096x9216-f32", "TensorMove", '"""4096,9216""",FLOAT,ND,"""4096,9216""",FLOAT,ND',
           "x=rnd((4096,9216),f32); o=torch.empty_like(x); fn=lambda: o.copy_(x)"),
    Kernel("mm-4096x4096x4096", "MatMulV3", '"""4096,4096;4096,4096""",DT_BF16;DT_BF16,ND;ND,"""4096,4096""",DT_BF16,ND',
           "a=rnd((4096,4096),bf16); b=rnd((4096,4096),bf16); fn=lambda: a.mm(b)"),
    Kernel("mm-nt-8192x8192x8192", "MatMulV3", '"""8192,8192;8192,8192""",DT_BF16;DT_BF16,ND;ND,"""8192,8192""",DT_BF16,ND',
           "a=rnd((8192,8192),bf16); b=rnd((8192,8192),bf16); fn=lambda: a.mm(b)"),
    Kernel("mm-f32-4096x4096x4096", "MatMulV2", '"""4096,4096;4096,4096""",FLOAT;FLOAT,ND;ND,"""4096,4096""",FLOAT,ND',
           "a=rnd((4096,4096),f32); b=rnd((4096,4096),f32); fn=lambda: a.mm(b)"),
    Kernel("mm-16384x8192x16384", "MatMulV3", '"""16384,8192;8192,16384""",DT_BF16;DT_BF16,ND;ND,"""16384,16384""",DT_BF16,ND',
           "a=rnd((16384,8192),bf16); b=rnd((8192,16384),bf16); fn=lambda: a.mm(b)"),
    Kernel("cat-3x4096x1x8", "ConcatD",
           '"""4096,1,8,256;4096,1,8,128;4096,1,8,128""",DT_BF16;DT_BF16;DT_BF16,ND;ND;ND,"""4096,1,8,512""",DT_BF16,ND',
           "p=rnd((4096,1,8,256),bf16); q=rnd((4096,1,8,128),bf16); r=rnd((4096,1,8,128),bf16); fn=lambda: torch.cat((p,q,r),3)"),
)

BARE_PRELUDE = """
import sys, torch
torch.backends.cuda.matmul.allow_tf32 = False
f32, bf16 = torch.float32, torch.bfloat16
def rnd(shape, dtype):
    # the harness's input distribution (magnitudes in [0.5, 1.5], random signs), drawn here
    # independently: a big GEMM's power draw, hence its clock, depends on the data
    sign = torch.randint(0, 2, shape, device="cuda") * 2 - 1
    return ((torch.rand(shape, device="cuda") + 0.5) * sign).to(dtype)
"""

BARE_CUPTI = BARE_PRELUDE + """
import json
from torch.profiler import profile, ProfilerActivity
from torch.autograd import DeviceType
import time, types
iters, with_markers = int(sys.argv[1]), sys.argv[2] == "markers"
setups = json.load(open(sys.argv[3]))
busy_ms = float(sys.argv[4])
idle_ms = float(sys.argv[5])
verify_first = sys.argv[6] == "verify"

def verify_on_host(name, fn, namespace):
    # The check a user runs before timing a kernel: the same call on float64 host copies of
    # its inputs (the lambda's code run against host globals), relative error of the norm.
    # Like the harness's verification it leaves the GPU idle for as long as the host takes.
    host = dict(namespace)
    for key, value in namespace.items():
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu()
            host[key] = value.double() if value.is_floating_point() else value
    out = fn().detach().cpu().double()
    ref = types.FunctionType(fn.__code__, host)().double()
    error = float((out - ref).norm() / ref.norm())
    if not error < 2e-2:
        raise SystemExit(f"{name}: relative error {error:.3e} against float64 on the host")

WARMUP = 5

def device_events(prof):
    return sorted((e for e in prof.profiler.kineto_results.events()
                   if e.device_type() == DeviceType.CUDA and "spin_kernel" not in e.name()),
                  key=lambda e: e.correlation_id())

def timed(fn, marker):
    # Mean device time per call: the session is started before the warm-up calls, as the
    # harness's is (a case's calls never open a session), and the warm-up calls' kernels, the
    # first len/(WARMUP + iters) * WARMUP in launch order, are left out.
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(WARMUP): fn()
        for _ in range(iters):
            if marker is not None: marker(1)
            fn()
        torch.cuda.synchronize()
    events = device_events(prof)
    per_call = len(events) // (WARMUP + iters)
    return sum(e.duration_ns() for e in events[WARMUP * per_call:]) / 1000.0 / iters

def timed_at_start(fn):
    # the same calls in a session started right before the first timed call (no warm-up in it)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters): fn()
        torch.cuda.synchronize()
    return sum(e.duration_ns() for e in device_events(prof)) / 1000.0 / iters

for name, setup in setups.items():
    namespace = {"torch": torch, "rnd": rnd, "f32": f32, "bf16": bf16}
    exec(setup, namespace)
    fn = namespace["fn"]
    for _ in range(5): fn()
    torch.cuda.synchronize()
    # Optionally keep the GPU busy with the kernel itself for busy_ms first, outside any
    # session: its clock, not locked here, ramps up under load and a short kernel's duration
    # follows it (on an H100 the SM clock idles at a few hundred MHz).
    deadline = time.perf_counter() + busy_ms / 1000.0
    while time.perf_counter() < deadline:
        for _ in range(20): fn()
        torch.cuda.synchronize()
    if verify_first:
        verify_on_host(name, fn, namespace)
    # Optionally leave the GPU idle for idle_ms first, as the harness's case leaves it while the
    # CPU computes the float64 reference (seconds for a large GEMM): a kernel timed right after
    # the previous kernel's loop inherits its power and thermal state.
    time.sleep(idle_ms / 1000.0)
    plain = timed(fn, None)
    at_start = timed_at_start(fn)
    marked = timed(fn, torch.cuda._sleep) if with_markers else float("nan")
    print("RESULT", name, plain, marked, at_start, flush=True)
    del namespace, fn
    torch.cuda.empty_cache()
"""

BARE_NCU = BARE_PRELUDE + """
{setup}
for _ in range(3): fn()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for _ in range(int(sys.argv[1])): fn()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
"""


def harness_durations(repeats: int, scratch: Path, cache_mode: str = "warm", round_number: int = 0) -> dict[str, float]:
    db = scratch / f"db{round_number}"
    db.mkdir()
    by_type: dict[str, list[Kernel]] = {}
    for kernel in KERNELS:
        by_type.setdefault(kernel.kernel_type, []).append(kernel)
    for kernel_type, kernels in by_type.items():
        rows = [f"dynamic,AI_CORE,{k.row}" for k in kernels]
        (db / f"{kernel_type}.csv").write_text("\n".join([HEADER, *rows]) + "\n")
    subprocess.run(
        [sys.executable, "-m", "pytest", str(ROOT / "bench" / "test_kernels.py"), "--perf-database-path", str(db),
         "--perf-backend", "cuda", "--perf-repeat-count", str(repeats), "--perf-cache-mode", cache_mode, "-q", "-p", "no:cacheprovider"],
        check=False, cwd=ROOT, stdout=subprocess.DEVNULL,
    )
    result: dict[str, float] = {}
    for kernel_type, kernels in by_type.items():
        with (db / f"{kernel_type}.csv").open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        for kernel, row in zip(kernels, rows):
            value = row.get("Average Duration(us)", "")
            result[kernel.name] = float(value) if value else float("nan")
    return result


def harness_order() -> list[Kernel]:
    """The kernels in the order the harness replays them: by CSV file name, then row.

    The references run in the same order so that each kernel follows the same predecessors on
    both sides: in the bare loop, a kernel's duration moved by several per cent with what ran
    before it (for large GEMMs likely the clock, which follows the GPU's power and thermal history).
    """
    return sorted(KERNELS, key=lambda kernel: f"{kernel.kernel_type}.csv")  # stable: rows keep their order


def cupti_references(iters: int, scratch: Path, with_markers: bool, busy_ms: float = 0.0,
                     idle_ms: float = 0.0, verify_first: bool = False) -> dict[str, tuple[float, float, float]]:
    """Every kernel in one bare process, one profiler session each: (plain, with markers, session
    started at the first timed call) in us.

    The marker variant launches the harness's marker kernel before every call, as the harness
    does with --repeat-markers, to show whether markers change the kernels' durations.
    """
    setups = scratch / "setups.json"
    setups.write_text(json.dumps({k.name: k.bare.replace("; ", "\n") for k in harness_order()}))
    script = scratch / "cupti_all.py"
    script.write_text(BARE_CUPTI)
    out = subprocess.run([sys.executable, str(script), str(iters), "markers" if with_markers else "none", str(setups),
                          str(busy_ms), str(idle_ms), "verify" if verify_first else "none"],
                         capture_output=True, text=True, check=True).stdout
    result: dict[str, tuple[float, float, float]] = {}
    for line in out.splitlines():
        if line.startswith("RESULT"):
            _, name, plain, marked, at_start = line.split()
            result[name] = (float(plain), float(marked), float(at_start))
    return result


def ncu_reference(kernel: Kernel, scratch: Path, iters: int = 5) -> float:
    script = scratch / f"ncu_{kernel.name}.py"
    script.write_text(BARE_NCU.format(setup=kernel.bare.replace("; ", "\n")))
    completed = subprocess.run(
        ["ncu", "--profile-from-start", "off", "--metrics", "gpu__time_duration.sum", "--csv", "--clock-control", "none",
         "--cache-control", "none",
         sys.executable, str(script), str(iters)],
        capture_output=True, text=True, check=True,
    )
    text = completed.stdout[completed.stdout.find('"ID"'):]
    total_ns = 0.0
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "ns")
        total_ns += value * {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(unit, 1.0)
    return total_ns / 1000.0 / iters


def median_and_spread(values: list[float]) -> tuple[float, float]:
    middle = statistics.median(values)
    return middle, (max(values) - min(values)) / middle if middle else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3, help="alternating harness/reference rounds (default 3)")
    parser.add_argument("--no-ncu", action="store_true")
    parser.add_argument("--cache-mode", default="warm",
                        help="the harness's cache mode; warm (default) matches the references' back-to-back loops")
    parser.add_argument("--busy-ms", type=float, default=0.0,
                        help="the CUPTI reference first runs each kernel for this long, untimed (GPU clock ramp-up)")
    parser.add_argument("--idle-ms", type=float, default=0.0,
                        help="the CUPTI reference first leaves the GPU idle this long before each kernel "
                             "(as the harness does while it verifies a case on the CPU)")
    parser.add_argument("--verify-first", action="store_true",
                        help="the CUPTI reference first checks each kernel against float64 on the host, "
                             "as the harness does (the GPU idles for as long as that takes)")
    parser.add_argument("--with-markers", action="store_true",
                        help="also the bare loop with a marker kernel before every call (the harness's --repeat-markers)")
    parser.add_argument("--out", type=Path, help=f"directory of {NAME}.json (default: a new temporary directory)")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    started = time.perf_counter()
    table: dict[str, dict[str, Any]] = {}
    harness_runs: list[dict[str, float]] = []
    reference_runs: list[dict[str, tuple[float, float, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        # Harness and reference alternate, each in a fresh process per round: a large GEMM's
        # duration follows the GPU's clock, which follows its power and thermal history, so one
        # run of each differs by several per cent from the next on its own.  Medians are
        # compared and each side's spread (max - min over rounds, relative to the median) is
        # printed next to them: a ratio inside the spreads is noise.
        for round_number in range(args.rounds):
            harness_runs.append(harness_durations(args.repeats, scratch, args.cache_mode, round_number))
            reference_runs.append(cupti_references(args.repeats, scratch, args.with_markers, args.busy_ms, args.idle_ms,
                                                   args.verify_first))
        print(f"{args.rounds} round(s), {args.repeats} repeats, harness cache mode {args.cache_mode}, "
              f"reference busy {args.busy_ms:g} ms, idle {args.idle_ms:g} ms, "
              f"{'verified on the host' if args.verify_first else 'not verified'} first; "
              f"medians, spread = (max - min) / median")
        marker_head = f"{'CUPTI+mk us':>12}{'ratio':>8}" if args.with_markers else ""
        print(f"{'kernel':24}{'harness us':>12}{'spread':>8}{'CUPTI us':>12}{'spread':>8}{'ratio':>8}{'ncu us':>12}"
              f"{'ratio':>8}{'@start us':>11}{'ratio':>8}{marker_head}")
        for kernel in KERNELS:
            measured, measured_spread = median_and_spread([run[kernel.name] for run in harness_runs])
            cupti, cupti_spread = median_and_spread([run[kernel.name][0] for run in reference_runs])
            ncu_text = ratio_ncu = "-"
            if not args.no_ncu and cupti >= 20.0:
                try:
                    ncu = ncu_reference(kernel, scratch)
                    if ncu > 0:
                        ncu_text, ratio_ncu = f"{ncu:.2f}", f"{measured / ncu:.3f}"
                    else:  # a copy served by the copy engine (cudaMemcpy) is no kernel for ncu
                        ncu_text = "no kernel"
                except (subprocess.CalledProcessError, FileNotFoundError, StopIteration) as exc:
                    ncu_text = f"error:{type(exc).__name__}"
            at_start, _ = median_and_spread([run[kernel.name][2] for run in reference_runs])
            marker_text = f"{at_start:>11.2f}{measured / at_start:>8.3f}"
            if args.with_markers:
                marked, _ = median_and_spread([run[kernel.name][1] for run in reference_runs])
                marker_text += f"{marked:>12.2f}{measured / marked:>8.3f}"
            print(f"{kernel.name:24}{measured:>12.2f}{measured_spread:>7.1%} {cupti:>12.2f}{cupti_spread:>7.1%} "
                  f"{measured / cupti:>8.3f}{ncu_text:>12}{ratio_ncu:>8}{marker_text}", flush=True)
            table[kernel.name] = {
                "harness_us": measured, "harness_spread": measured_spread,
                "cupti_us": cupti, "cupti_spread": cupti_spread, "ratio_cupti": measured / cupti,
                "ncu": ncu_text, "ratio_ncu": ratio_ncu,
                "cupti_at_start_us": at_start, "ratio_at_start": measured / at_start,
            }

    out = args.out or Path(tempfile.mkdtemp(prefix=f"{NAME}_"))
    out.mkdir(parents=True, exist_ok=True)
    within = sum(1 for row in table.values() if abs(row["ratio_cupti"] - 1.0) <= 0.02)
    report = {
        "benchmark": f"perf_plugin.reproduce:{NAME}",
        "script": f"reproduce/wip/{NAME}.py",
        "workflow": "pytest bench vs bare torch.profiler loop (and ncu)",
        "pass_n": args.rounds,
        "ops_count": len(KERNELS),
        "elapsed_s": time.perf_counter() - started,
        "device_ids": [0],  # the harness's pytest run and the bare processes use the default GPU
        "max_concurrency": 1,
        "llm_concurrency": LLM_CONCURRENCY,
        "env_spec": collect_env_spec("cuda", cwd=ROOT),
        "task_log_dir": str(out),
        "stats": {
            "total_ops": len(KERNELS),
            "passed_ops": within,  # within 2 % of the CUPTI reference
            "failed_ops": len(KERNELS) - within,
            "pass_rate": round(within / len(KERNELS), 3),
            "settings": {"repeats": args.repeats, "rounds": args.rounds, "cache_mode": args.cache_mode,
                         "busy_ms": args.busy_ms, "idle_ms": args.idle_ms, "verify_first": args.verify_first},
            "kernels": table,
        },
    }
    path = out / f"{NAME}.json"
    path.write_text(report_json(finite_values(report), indent=2) + "\n", encoding="utf-8")
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
