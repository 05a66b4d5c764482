"""The PyTorch profiler's operator model: what a traced operator recorded, and the row it becomes.

Kept below both ingest (which reads traces) and the kernel replays (which declare the operators
their kernel types stand for), so that neither imports the other for it.
"""
