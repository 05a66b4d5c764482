"""Operator performance lab: a pytest plugin that replays kernel-latency database rows.

The package holds the pytest plugin (``perf_plugin.plugin``), the database layer
(``perf_plugin.database``), kernel replays, profiling collectors, ingest, shape grids,
collective benchmarks and reports.  ``perfdb`` is the console script for the offline steps.

PYTEST_DONT_REWRITE: pytest marks the package that owns a ``pytest11`` entry point for assertion
rewriting, but finds an editable install's package only when the working directory is on
``sys.path``; the package would then be rewritten in some runs and not others, and a pytest run
inside another (pytester) warns that it cannot be.  The package's asserts are invariants, not
test assertions, so it opts out of rewriting in every run.
"""

__version__ = "0.1.0"
