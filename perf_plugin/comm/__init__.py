"""Collective benchmarks (all_reduce, all_gather, reduce_scatter, all_to_all) and their validation.

``pytest_plugin`` holds the pytest hooks, options and fixtures; ``bench/test_collectives.py`` is
the thin test.  The plain modules do the work: ``settings`` (options), ``plan`` (cases),
``topology`` (tiers), ``collectives`` (ops, dtypes, bus factors), ``ccl`` (HCCL / NCCL / gloo),
``launch`` (torchrun), ``execute`` (buffers and checks), ``timing``, ``runner`` (one rank's
session), ``record`` and ``writer`` (CSV rows), ``validate`` and ``command``
(``perfdb validate-comm``).  See README.md beside this file.
"""
