"""Operator performance lab: a pytest plugin that replays kernel-latency database rows.

The package holds the pytest plugin (``perf_plugin.plugin``), the database layer
(``perf_plugin.database``), kernel replays, profiling collectors, ingest, shape grids,
collective benchmarks and reports.  ``perfdb`` is the console script for the offline steps.
"""

__version__ = "0.1.0"
