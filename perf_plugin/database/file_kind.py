"""What a file in a database's place really holds: a CSV, or something standing in for one.

Public Ascend databases keep their CSVs in Git LFS: a clone without ``git lfs pull`` holds, for
each CSV, a pointer of three ``key value`` lines (``version https://git-lfs.github.com/spec/v1``,
``oid sha256:...``, ``size N``).  Read as a CSV such a pointer is a one-column header with two
rows, and the reader's complaint (missing columns) hides the cause.  Files are classified here
from their first bytes, before any CSV parsing, so that a Git LFS pointer, an empty file or a
binary file is refused with the file's name and what to do about it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from enum import Enum
from pathlib import Path

from perf_plugin.database.errors import DatabaseError

# The version lines of the Git LFS pointer spec (the second is the pre-release spelling,
# which git-lfs still reads).
LFS_VERSION_LINES: tuple[bytes, ...] = (
    b"version https://git-lfs.github.com/spec/",
    b"version https://hawser.github.com/spec/",
)
# git-lfs treats no blob of this size or larger as a pointer.
LFS_POINTER_MAX_BYTES = 1024
# Bytes searched for a NUL, as git does to tell binary from text.
SNIFF_BYTES = 8000
UTF8_BOM = b"\xef\xbb\xbf"
UTF16_BOMS: tuple[bytes, ...] = (b"\xff\xfe", b"\xfe\xff")

DATABASE_ORIGIN = "the database's repository"
_LFS_SIZE = re.compile(rb"^size (\d+)$", re.MULTILINE)


class FileKind(Enum):
    TEXT = "text"  # possibly a CSV: the reader decides
    EMPTY = "empty"
    LFS_POINTER = "Git LFS pointer"
    UTF16 = "UTF-16 text"
    BINARY = "binary"


class UnusableFile(DatabaseError):
    """A file that holds no CSV at all: reading on would only report its symptoms."""


class LfsPointerFile(UnusableFile):
    """A Git LFS pointer in place of the file it points to."""


class EmptyFile(UnusableFile):
    """A file of no bytes, or of whitespace only."""


class NotCsvFile(UnusableFile):
    """Binary, not UTF-8, or text whose first line names no column of the expected table."""


def classify(head: bytes, size: int) -> FileKind:
    """The kind of a file from its first bytes ``head`` (all of it, or at least SNIFF_BYTES) and its size."""
    if size == 0 or (size == len(head) and not head.removeprefix(UTF8_BOM).strip()):
        return FileKind.EMPTY
    if head.startswith(LFS_VERSION_LINES) and size < LFS_POINTER_MAX_BYTES:
        return FileKind.LFS_POINTER
    if head.startswith(UTF16_BOMS):
        return FileKind.UTF16
    if b"\0" in head[:SNIFF_BYTES]:
        return FileKind.BINARY
    return FileKind.TEXT


def _lfs_object_size(pointer: bytes) -> str:
    match = _LFS_SIZE.search(pointer)
    return f" (its content, {int(match.group(1))} bytes, was never downloaded)" if match else ""


def refuse_unusable(head: bytes, size: int, path: Path, *, origin: str = DATABASE_ORIGIN) -> None:
    """Raise an UnusableFile naming ``path`` and the fix unless the bytes may be a CSV.

    ``origin`` names where ``git lfs pull`` is to be run (the repository the file came from).
    """
    kind = classify(head, size)
    if kind is FileKind.LFS_POINTER:
        raise LfsPointerFile(
            f"is a Git LFS pointer, not the CSV: run `git lfs pull` in {origin}{_lfs_object_size(head)}",
            path=path,
        )
    if kind is FileKind.EMPTY:
        what = "0 bytes" if size == 0 else "whitespace only"
        raise EmptyFile(f"is empty ({what}): delete it or regenerate it", path=path)
    if kind is FileKind.UTF16:
        raise NotCsvFile("is UTF-16 text, not a UTF-8 CSV: save it as UTF-8 or regenerate it", path=path)
    if kind is FileKind.BINARY:
        offset = head.index(b"\0")
        raise NotCsvFile(
            f"is a binary file (NUL byte at offset {offset}), not a CSV: "
            "replace it with the CSV or remove it",
            path=path,
        )


def decode_csv_bytes(data: bytes, path: Path, *, origin: str = DATABASE_ORIGIN) -> str:
    """A whole file's text, or an UnusableFile saying why the bytes are no CSV."""
    refuse_unusable(data, len(data), path, origin=origin)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotCsvFile(
            f"is not UTF-8 text (byte {exc.start}), not a CSV this project reads: save it as UTF-8 or regenerate it",
            path=path,
        ) from None


def refuse_unusable_file(path: Path, *, origin: str = DATABASE_ORIGIN) -> None:
    """``refuse_unusable`` on a file's first bytes, for readers that stream a large file."""
    try:
        with path.open("rb") as handle:
            head = handle.read(SNIFF_BYTES)
        size = path.stat().st_size
    except OSError as exc:
        raise DatabaseError(f"cannot read file: {exc.strerror}", path=path) from None
    refuse_unusable(head, size, path, origin=origin)


def require_known_column(header: Sequence[str], known: Iterable[str], path: Path, what: str) -> None:
    """Raise NotCsvFile when ``header`` names none of the ``known`` columns of a ``what``.

    A header that misses some columns is the reader's to report (it knows which it needs); one
    that names none of them is not such a table at all (an HTML page saved as ``.csv``, say).
    """
    known = tuple(known)
    if any(name.strip() in known for name in header):
        return
    first = ",".join(header)
    shown = first if len(first) <= 60 else first[:57] + "..."
    raise NotCsvFile(
        f"is not a {what}: its first line {shown!r} names none of its columns ({', '.join(known[:3])}, ...); "
        "replace it with the CSV or remove it",
        path=path,
    )


def one_error(errors: Sequence[UnusableFile]) -> UnusableFile:
    """One error for several unusable files: the first one's, with how many more and their names."""
    first = errors[0]
    if len(errors) == 1:
        return first
    names = [error.path.name if error.path is not None else "?" for error in errors[1:]]
    listed = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    more = f"; {len(names)} more file(s) here hold no CSV either ({listed})"
    return type(first)(first.reason + more, path=first.path)
