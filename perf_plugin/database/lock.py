"""A lock file that serialises sessions writing to one database directory.

``filelock`` (a dependency of torch, well kept, cross-platform) does the OS-level locking; this
module only gives it a name in the directory and a clear message when another session holds it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import filelock

from perf_plugin.database.errors import DatabaseError

LOCK_FILE_NAME = ".perfdb.lock"


DEFAULT_LOCK_TIMEOUT_S = 60.0


@contextmanager
def database_lock(directory: str | Path, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> Iterator[Path]:
    """Hold the database lock of ``directory`` for the duration of the block."""
    lock_path = Path(directory) / LOCK_FILE_NAME
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(str(lock_path))
    try:
        lock.acquire(timeout=timeout_s)
    except filelock.Timeout:
        raise DatabaseError(
            f"another session is writing to this database (lock held for more than {timeout_s:g} s);"
            " wait for it to finish or remove the stale lock file",
            path=lock_path,
        ) from None
    try:
        yield lock_path
    finally:
        lock.release()
