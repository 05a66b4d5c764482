"""``python -m perf_plugin.ingest``: the same as ``perfdb ingest``."""

from __future__ import annotations

import sys

from perf_plugin.cli import main

if __name__ == "__main__":
    sys.exit(main(["ingest", *sys.argv[1:]]))
