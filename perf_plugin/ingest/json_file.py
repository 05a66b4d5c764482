"""Reading a JSON profile file (plain or gzip-compressed) with one clear error for bad input.

PyTorch traces (``*.pt.trace.json``, often ``.gz``) and Ascend ``trace_view.json`` files both
come through here, so an unreadable, non-UTF-8 or malformed file reads the same everywhere:
a ``DatabaseError`` naming the file and, for bad JSON, the line and column.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from perf_plugin.database.errors import DatabaseError


def load_json_file(path: Path, what: str = "JSON") -> Any:
    """The parsed document; ``what`` names the expected content in the error (``a JSON trace``)."""
    try:
        if path.name.lower().endswith(".gz"):
            with gzip.open(path, "rb") as handle:
                raw = handle.read()
        else:
            raw = path.read_bytes()
        return json.loads(raw.decode("utf-8-sig"))
    except (OSError, EOFError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise DatabaseError(f"cannot read file: {reason}", path=path) from None
    except UnicodeDecodeError as exc:
        raise DatabaseError(f"not UTF-8 text (byte {exc.start})", path=path) from None
    except json.JSONDecodeError as exc:
        raise DatabaseError(f"not {what}: {exc.msg} at line {exc.lineno}, column {exc.colno}", path=path) from None
