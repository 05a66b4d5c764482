"""Ingest: profiler output -> per-kernel database CSVs.

Modules, in the order data flows through them:

* ``discover``: what ``--profiling-path`` holds (kernel_details / op_summary / PyTorch traces);
* ``columns``, ``names``: the profiler tables' columns, kernel-type normalisation, communication;
* ``profile_table``: one Ascend table -> a frame of kernel samples (pandas C parser);
* ``trace_events``, ``trace_attribution``, ``trace_args``, ``aten_mapping``, ``torch_trace``: PyTorch profiler
  traces (file or live object) -> the same frame;
* ``aggregate``: samples -> one row per kernel type and signature cells, with the statistics;
* ``merge``: rows -> ``{KernelType}.csv`` files, merged with what the database holds;
* ``records``: per-row op_summary records of a ``PROF_*`` directory, for the msprof collector;
* ``pipeline``, ``command``: ``perfdb ingest`` and the in-process ``ingest_profiler``.
"""
