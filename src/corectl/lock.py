"""One changing command per site: an exclusive lock on inventories/<site>/.lock.

The lock is a kernel lock (flock) on the file, held for the life of the command, so a process
that dies, however it dies, releases it. The file also names its holder (command, user, host,
pid, start, the run it is in); a clean release empties it. A holder record found with the lock
free was left by a process that died: the next command takes the lock over with a warning.

A second changing command stops at once with one line naming the holder and exit code
SITE_BUSY (75, EX_TEMPFAIL: try again later), or waits up to ``--wait`` seconds.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import getpass
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from corectl.errors import CorectlError
from corectl.site import Site

SITE_BUSY = 75
POLL_SECONDS = 0.5


@dataclass(frozen=True)
class Holder:
    command: str
    user: str
    host: str
    pid: int
    started: str
    run: str = ""

    def describe(self) -> str:
        run = f", run {self.run}" if self.run else ""
        return f"`corectl {self.command}` by {self.user}@{self.host} (pid {self.pid}, since {self.started}{run})"


def lock_file(site: Site) -> Path:
    return site.directory / ".lock"


def _read_holder(fd: int) -> Holder | None:
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while chunk := os.read(fd, 65536):
        data += chunk
    try:
        return Holder(**json.loads(data))
    except (ValueError, TypeError):
        return None


def _write_holder(fd: int, holder: Holder | None) -> None:
    os.ftruncate(fd, 0)
    if holder is not None:
        os.pwrite(fd, (json.dumps(asdict(holder)) + "\n").encode(), 0)
    os.fsync(fd)


class SiteLock:
    """The held lock of one site; ``note_run`` records the run directory the holder is in."""

    def __init__(self, fd: int, holder: Holder) -> None:
        self._fd = fd
        self.holder = holder

    def note_run(self, run_dir: Path) -> None:
        self.holder = Holder(**{**asdict(self.holder), "run": str(run_dir)})
        _write_holder(self._fd, self.holder)

    def release(self) -> None:
        if self._fd < 0:
            return
        _write_holder(self._fd, None)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = -1


# The lock this process holds, if any (the runner records each run's directory in it).
_HELD: list[SiteLock] = []


def note_run(run_dir: Path) -> None:
    for held in _HELD:
        held.note_run(run_dir)


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
            return False
        raise
    return True


def acquire(site: Site, command: str, *, wait: float = 0.0, warn: Callable[[str], None] = print) -> SiteLock:
    """Take the site's lock for ``command``; raise CorectlError(exit SITE_BUSY) while another holds it."""
    path = lock_file(site)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + max(wait, 0.0)
    while not _try_flock(fd):
        if time.monotonic() >= deadline:
            holder = _read_holder(fd)
            os.close(fd)
            who = holder.describe() if holder else "another corectl process"
            waited = f" (waited {wait:.0f}s)" if wait > 0 else ""
            raise CorectlError(
                f"site {site.name} is busy{waited}: {who} holds {path}; try again when it ends, or give --wait SECONDS",
                exit_code=SITE_BUSY,
            )
        time.sleep(POLL_SECONDS)
    stale = _read_holder(fd)
    if stale is not None:
        warn(f"warning: taking over the lock of site {site.name} left by {stale.describe()}, which no longer holds it")
    holder = Holder(
        command=command,
        user=getpass.getuser(),
        host=socket.gethostname(),
        pid=os.getpid(),
        started=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    _write_holder(fd, holder)
    return SiteLock(fd, holder)


@contextlib.contextmanager
def site_lock(
    site: Site, command: str, *, wait: float = 0.0, warn: Callable[[str], None] = print
) -> Iterator[SiteLock]:
    """Hold the site's lock for the body; released on every way out (errors and Ctrl-C included)."""
    held = acquire(site, command, wait=wait, warn=warn)
    _HELD.append(held)
    try:
        yield held
    finally:
        _HELD.remove(held)
        held.release()
