"""``python -m perf_plugin.grid ...`` is ``perfdb grid ...``."""

from __future__ import annotations

import sys

from perf_plugin.cli import main

if __name__ == "__main__":
    sys.exit(main(["grid", *sys.argv[1:]]))
