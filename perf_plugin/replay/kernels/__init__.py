"""The built-in kernel replays: one module per kernel type or small family.

Every module here is imported by the kernel catalog (``perf_plugin.replay.registry``), and every
``OpReplay`` class it defines with ``kernel_types`` is a replay: adding a kernel type is adding a
module.  ``docs/adding-a-replay.md`` walks through one.
"""
