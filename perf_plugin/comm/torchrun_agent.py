"""``python -m perf_plugin.comm.torchrun_agent ARGS``: torchrun's own launcher (``torch.distributed.run``)
with ARGS, in a process that ends when the pytest that started it ends (``--comm-nproc``).

torchrun stops its ranks when it is stopped by a signal it can handle; one that dies with its
parent (``perf_plugin.run.parent_death``) also stops them when that pytest is killed outright.
"""

from __future__ import annotations

import runpy
import sys

from perf_plugin.run.parent_death import die_with_parent

if __name__ == "__main__":
    die_with_parent()
    sys.argv[0] = "torchrun"
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
