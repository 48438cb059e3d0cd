"""Following a job's stream from `ansible-runner worker` (a runner host's or a node's), in place of ansible-runner's
`process` side (issue 49): each line decoded once, each event handed on as it comes and its line appended as
received to the job's one events file (EVENTS, JSON lines: corectl.commands.runs.load_events reads it), instead
of one file per event written through a codecs writer. The worker's artifacts (its zipfile message at the end)
are unpacked as `process` would.

The stream's lines (ansible-runner's streaming protocol): {"status": ...} as the job's status changes, events
(a mapping with "event", "counter" and "uuid"), {"event": "keepalive"}, {"zipfile": N} followed by N bytes of
the artifacts' zip, and {"eof": true} last.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

EVENTS = "events.jsonl"  # a job's events, one JSON line each, in the order the worker sent them


@dataclass
class Followed:
    """How the stream ended: the job's last status ("error" when the stream broke off before its end) and why."""

    status: str
    explanation: str = ""


def follow(stream: IO[bytes], job_dir: Path, on_event: Callable[[dict[str, Any]], Any]) -> Followed:
    """Read ``stream`` to its eof: events to ``on_event`` and to ``job_dir``/EVENTS, artifacts to
    ``job_dir``/artifacts; the job's status as the worker last said it."""
    job_dir.mkdir(parents=True, exist_ok=True)
    status = "unstarted"
    fd = os.open(job_dir / EVENTS, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # events may hold host facts
    # unbuffered: one write per event, so a reader (corectl runs --show, a test) sees every event handed on so far
    with os.fdopen(fd, "wb", buffering=0) as events:
        while True:
            line = stream.readline()
            if not line:
                return Followed("error", "the worker's stream ended before its eof")
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                return Followed("error", f"a line of the worker's stream is not JSON: {line[:200]!r}")
            if not isinstance(data, dict):
                return Followed("error", f"a line of the worker's stream is not a mapping: {line[:200]!r}")
            if "status" in data:
                status = str(data["status"])
            elif "zipfile" in data:
                _unpack(stream, int(data["zipfile"]), job_dir / "artifacts")
            elif "eof" in data:
                return Followed(status)
            elif data.get("event") == "keepalive":
                continue
            elif data.get("counter") and data.get("uuid"):
                events.write(line if line.endswith(b"\n") else line + b"\n")
                on_event(data)


def _unpack(stream: IO[bytes], length: int, directory: Path) -> None:
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
