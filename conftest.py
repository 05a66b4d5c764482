"""Repository-root pytest configuration.

The perf plugin itself is registered through the ``pytest11`` entry point (``pip install -e .``),
so nothing is imported here.  The scripts (benchmarks, reproduction scripts, examples) and the
database are not tests: keep ``pytest .`` from importing them.
"""

collect_ignore = ["database", "benchmarks", "reproduce", "examples"]
