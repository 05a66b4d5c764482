"""Kernel replays: every row of the selected database directory is one case of this test.

The cases come from the perf plugin (``kernel_case`` is parametrized from the CSVs); the test
builds the row's inputs, verifies the op against a reference, and runs the timed repeats.
"""


def test_kernel_replay(kernel_case, perf_runner):
    perf_runner.replay(kernel_case)
