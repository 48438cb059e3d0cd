"""Following a job's stream from `ansible-runner worker` (a runner host's or a node's), in place of ansible-runner's
`process` side (issue 49): each line decoded once, each event handed on as it comes and its line appended as
received to the job's one events file (EVENTS, JSON lines: corectl.commands.runs.load_events reads it), instead
of one file per event written through a codecs writer. The worker's artifacts (its zipfile message at the end)
are unpacked as `process` would.

The stream's lines (ansible-runner's streaming protocol): {"status": ...} as the job's status changes, events
(a mapping with "event", "counter" and "uuid"), {"event": "keepalive"}, {"zipfile": N} followed by N bytes of
the artifacts' zip, and {"eof": true} last.

The stream is read in what has arrived, at most every PAUSE_S while it trickles (a node's job sends an event every
few milliseconds: reading each as it comes woke the reading thread once per event, 75-86 ms of CPU for a node's 550
events against 6 ms read at once; issue 49); a stream that comes faster than half a pipe per pause is read without
pausing, so a worker is never held back by its reader.
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

EVENTS = "events.jsonl"  # a job's events, one JSON line each, in the order the worker sent them
PAUSE_S = 0.1  # how long what arrives gathers before it is read, while the stream trickles
CHUNK = 1 << 20  # the most one read takes
FLOWING = 1 << 15  # a read this large (half a Linux pipe): the stream is flowing, read again at once


class Stream(Protocol):
    """What follow reads: a worker's stdout (a buffered pipe) or, in tests, an io.BytesIO."""

    def read(self, size: int = -1, /) -> bytes: ...

    def read1(self, size: int = -1, /) -> bytes: ...


@dataclass
class Followed:
    """How the stream ended: the job's last status ("error" when the stream broke off before its end) and why."""

    status: str
    explanation: str = ""


def follow(
    stream: Stream, job_dir: Path, on_event: Callable[[dict[str, Any]], Any], pause_s: float = PAUSE_S
) -> Followed:
    """Read ``stream`` to its eof: events to ``on_event`` and to ``job_dir``/EVENTS, artifacts to
    ``job_dir``/artifacts; the job's status as the worker last said it. ``pause_s``: see PAUSE_S (0: each read
    as soon as something has arrived)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    status = "unstarted"
    reader = _Batches(stream, pause_s)
    fd = os.open(job_dir / EVENTS, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # events may hold host facts
    # unbuffered: each batch's events written before they are handed on, so a reader (corectl runs --show, a test)
    # sees every event handed on so far
    with os.fdopen(fd, "wb", buffering=0) as events:
        while True:
            lines = reader.lines()
            if not lines:
                return Followed("error", "the worker's stream ended before its eof")
            kept: list[dict[str, Any]] = []
            written: list[bytes] = []
            ended: Followed | None = None
            for at, line in enumerate(lines):
                try:
                    data = json.loads(line)
                except json.JSONDecodeError:
                    ended = Followed("error", f"a line of the worker's stream is not JSON: {line[:200]!r}")
                    break
                if not isinstance(data, dict):
                    ended = Followed("error", f"a line of the worker's stream is not a mapping: {line[:200]!r}")
                    break
                if "status" in data:
                    status = str(data["status"])
                elif "zipfile" in data:  # its bytes follow the line: the lines after it were not lines
                    reader.give_back(lines[at + 1 :])
                    _unpack(reader, int(data["zipfile"]), job_dir / "artifacts")
                    break
                elif "eof" in data:
                    ended = Followed(status)
                    break
                elif data.get("event") != "keepalive" and data.get("counter") and data.get("uuid"):
                    kept.append(data)
                    written.append(line if line.endswith(b"\n") else line + b"\n")
            events.write(b"".join(written))
            for data in kept:
                on_event(data)
            if ended is not None:
                return ended


class _Batches(io.RawIOBase):
    """A stream's complete lines, read in what has arrived (see PAUSE_S); read as a file, the raw bytes after the
    lines handed out (what ansible-runner's unstream_dir reads the artifacts' zip from)."""

    def __init__(self, stream: Stream, pause_s: float) -> None:
        super().__init__()
        self._stream = stream
        self._pause_s = pause_s
        self._pending = bytearray()  # read, not yet handed out (a bytearray: a long line grows in place)
        self._scanned = 0  # how much of it holds no newline
        self._flowing = True  # (the first read waits for nothing)
        self._eof = False

    def lines(self) -> list[bytes]:
        """The complete lines that have arrived (at least one; a last line cut short at the stream's end as it
        is), [] at the end."""
        while True:
            cut = self._pending.rfind(b"\n", self._scanned) + 1
            if cut:
                lines = bytes(self._pending[:cut]).splitlines(keepends=True)
                del self._pending[:cut]
                self._scanned = 0
                return lines
            self._scanned = len(self._pending)
            if self._eof:
                last = bytes(self._pending)
                self._pending.clear()
                return [last] if last else []
            if not self._flowing and self._pause_s:
                time.sleep(self._pause_s)
            chunk = self._stream.read1(CHUNK)
            self._flowing = len(chunk) >= FLOWING
            self._eof = not chunk
            self._pending += chunk

    def give_back(self, lines: list[bytes]) -> None:
        """Lines handed out but not lines (the bytes after a zipfile line): read again first."""
        self._pending[:0] = b"".join(lines)
        self._scanned = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        """As many bytes as ``buffer`` holds (fewer only at the stream's end): the pending ones first."""
        size = len(buffer)
        taken = bytes(self._pending[:size])
        del self._pending[:size]
        self._scanned = 0
        if len(taken) < size:
            taken += self._stream.read(size - len(taken))
        buffer[: len(taken)] = taken
        return len(taken)


def _unpack(stream: io.RawIOBase, length: int, directory: Path) -> None:
    from ansible_runner.utils.streaming import unstream_dir  # (the runner's own zip layout)

    directory.mkdir(parents=True, exist_ok=True)
    unstream_dir(stream, length, str(directory))


def read_events(path: Path) -> list[dict[str, Any]]:
    """A job's EVENTS file; a last line cut short (the job's reader killed mid-write) is left out."""
    events = []
    with path.open("rb") as lines:
        for line in lines:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict):
                events.append(event)
    return events
