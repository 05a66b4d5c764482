"""Repository-root pytest configuration.

The perf plugin itself is registered through the ``pytest11`` entry point (``pip install -e .``),
so nothing is imported here.  Benchmark scripts and the database are data, not tests: keep
``pytest .`` from importing them.
"""

collect_ignore = ["database", "tests/perf"]
