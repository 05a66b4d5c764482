"""Durations for shapes: ``lookup`` (and ``perfdb lookup``) answers from a database's rows, exactly
or by interpolation, and says which rows and which method gave the answer."""

from perf_plugin.lookup.answer import Answer, Query
from perf_plugin.lookup.api import lookup

__all__ = ["Answer", "Query", "lookup"]
