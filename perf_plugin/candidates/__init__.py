"""Judging candidate kernels against the reference replays, in KernelBench's manner.

A candidate file registers callables per kernel type (``@candidate("RmsNorm")``); ``pytest
bench --perf-candidate FILE`` replays every selected row, checks the candidate on fresh inputs,
times it with the same profiler on the reference's inputs, and reports speedup and fast_p
(``perf_plugin.candidates.scoring``), with a ``baseline_time.json`` and per-row trace files.
"""

from perf_plugin.candidates.registry import (
    CandidateFileError,
    candidate,
    load_candidates,
)

__all__ = ("CandidateFileError", "candidate", "load_candidates")
