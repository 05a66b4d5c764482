"""Collective benchmarks: all_reduce, all_gather, reduce_scatter, all_to_all over message sizes.

Selected with ``pytest bench -m comm`` (or ``-m hccl``) and deselected otherwise.  Run them as
one process per device: ``torchrun --nproc-per-node 8 -m pytest bench -m comm`` (many nodes
through torchrun's rendezvous), or let the plugin launch torchrun on this node with
``pytest bench -m comm --comm-nproc 8``.  HCCL on an NPU, NCCL on CUDA, gloo on the CPU.

The cases (op x group size x dtype x message size) come from the ``perf_plugin.comm`` plugin's
options; every rank checks its result, all ranks agree on the outcome, and rank 0 writes the
``hcom_{op}_.csv`` rows.
"""

import pytest

pytestmark = [pytest.mark.comm, pytest.mark.hccl]


def test_collective(comm_case, comm_bench):
    comm_bench(comm_case)
