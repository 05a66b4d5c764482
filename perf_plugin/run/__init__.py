"""The machinery of a `pytest bench` run: the cases collected from the database, the replay
runner and its executor, the run state the controller and the workers keep, and what the
controller does at the end (write-back, coverage, reports, the msprof launch on an NPU).
"""
