"""Writing files corectl owns (cluster.yml, hosts.yml, known_hosts, secrets): atomically, durably.

A write goes to a temporary file in the same directory, is flushed and fsync'ed, renamed over
the target, and the directory is fsync'ed, so a crash, a kill or a power loss at any point
leaves either the old file or the new one, never a mix or an empty file. A file that exists
keeps its mode; a new one gets ``mode``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` in one step (old or new content, whatever happens)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        mode = path.stat().st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_directory(path.parent)


def write_if_changed(path: Path, text: str, mode: int = 0o644) -> bool:
    """Write ``text`` to ``path`` unless it already holds it; return True when it changed."""
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    atomic_write(path, text.encode("utf-8"), mode)
    return True
