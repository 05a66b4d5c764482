"""Durations for shapes: ``lookup`` (and ``perfdb lookup``) answers from a database's rows, exactly
or by interpolation against the device's roofline, and says which rows and which method gave the
answer; ``lookup_collective`` answers collectives by message size; ``lookup_by_policy`` answers as
``op_mapping.yaml``'s interpolation policy does."""

from perf_plugin.lookup.answer import Answer, CollectiveQuery, Query
from perf_plugin.lookup.api import lookup
from perf_plugin.lookup.collectives import lookup_collective
from perf_plugin.lookup.policy import lookup_by_policy

__all__ = ["Answer", "CollectiveQuery", "Query", "lookup", "lookup_by_policy", "lookup_collective"]
