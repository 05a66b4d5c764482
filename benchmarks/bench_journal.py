"""What the run journal costs the controller per case: results kept with and without it.

The controller keeps every result it receives (``ControllerState.add_results``); with the journal
it first appends the batch to ``<database>/.perf-journal/<run>.jsonl`` in one write and fsyncs it.
This times both on the same results (30 samples and one kernel each, as a small case has), in
batches of the sizes given (results reach the controller one profiler batch at a time: 32 cases
by default, ``--perf-profile-batch-size``), and prints microseconds per case side by side.  The
journal goes to a temporary directory on the file system of ``--dir`` (fsync's cost is the
disk's).

Prerequisites: this project installed (``pip install -e .``).

    python benchmarks/bench_journal.py --cases 4096 --batch-sizes 32,1 --rounds 3

Expected output: one line per batch size, ``batch 32: without journal 0.5 us/case, with journal
25.8 us/case`` (figures of a 2-core x86 machine with an ext4 disk; they follow the disk).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from perf_plugin.results import CaseRef, CaseResult, KernelTime
from perf_plugin.run.journal import JournalHeader, RunJournal
from perf_plugin.run.state import ControllerState


def make_results(count: int) -> list[CaseResult]:
    return [
        CaseResult(
            CaseRef(f"Add-{i}x8-FLOAT-to-{i}x8-FLOAT", "Add", "Add.csv", i + 2, f"sig{i}"),
            "passed",
            backend="cuda",
            samples_us=tuple(1.0 + 0.001 * j for j in range(30)),
            kernels=(KernelTime("void at::native::vectorized_elementwise_kernel<4, add>", 1.01, 1.0),),
        )
        for i in range(count)
    ]


def time_per_case(results: list[CaseResult], batch: int, journal_dir: Path | None) -> float:
    control = ControllerState()
    if journal_dir is not None:
        header = JournalHeader(str(journal_dir), "all", "20261125_000000", "2026-11-25T00:00:00+00:00", ["pytest"], "cuda")
        control.journal = RunJournal(journal_dir, f"bench-{time.monotonic_ns()}", header)
    start = time.perf_counter()
    for i in range(0, len(results), batch):
        control.add_results(results[i : i + batch])
    elapsed = time.perf_counter() - start
    if control.journal is not None:
        assert control.journal.error is None, control.journal.error
        control.journal.mark_done()
    return elapsed / len(results) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=4096)
    parser.add_argument("--batch-sizes", default="32,1", help="comma-separated (default 32,1)")
    parser.add_argument("--rounds", type=int, default=3, help="medians over this many rounds")
    parser.add_argument("--dir", type=Path, default=None, help="where the journal is written (default: the temp dir)")
    args = parser.parse_args()
    results = make_results(args.cases)
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            plain = statistics.median(time_per_case(results, batch, None) for _ in range(args.rounds))
            journaled = statistics.median(time_per_case(results, batch, Path(scratch)) for _ in range(args.rounds))
            print(f"batch {batch}: without journal {plain:.1f} us/case, with journal {journaled:.1f} us/case "
                  f"({args.cases} cases, medians of {args.rounds} rounds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
