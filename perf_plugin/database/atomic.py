"""Atomic file replacement: write a temporary file beside the target, fsync, rename over it.

A crash or exception in the middle of writing leaves the original file intact; readers never
see a half-written file because ``os.replace`` is atomic within one directory.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def atomic_write_chunks(path: str | Path, chunks: Iterable[bytes]) -> None:
    """Write ``chunks`` one after another, then replace ``path`` atomically: a large file is
    never held in memory whole, and a chunk that fails to come leaves ``path`` as it was."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # keep an existing file's permissions; a new file gets the usual 0o666 & ~umask (mkstemp's
    # private 0o600 would lock other users of a shared database out)
    mode = target.stat().st_mode & 0o777 if target.exists() else 0o666 & ~_umask()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    atomic_write_chunks(path, (data,))


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> None:
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_text_chunks(path: str | Path, chunks: Iterable[str], encoding: str = "utf-8") -> None:
    atomic_write_chunks(path, (chunk.encode(encoding) for chunk in chunks))
