"""Shape-grid expansion: rows for the shapes real models run, within a device-memory budget.

``config.yaml`` routes each kernel type to a generator (``generators``) and shape patterns whose
expressions the safe evaluator (``evaluator``) computes from model configurations (``models``,
``projections``); ``templates`` gives the rows the structure of a profiled row, ``memory`` the
budget filter, ``runner`` writes them, ``command`` is ``perfdb grid``.
"""
