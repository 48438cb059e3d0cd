"""One run's life, however its jobs reach the hosts: the one place a run gets its id and folder, is canceled, has
its events classified and its hosts' counts merged, and ends in one result and one record.

`run(request, transport, sink)` is every run's start and end. A transport supplies only how the run's jobs reach
the hosts (corectl.ansible.runner.here: ansible-runner on this host; corectl.ansible.remote.fanout: shards streamed
to runner hosts; corectl.ansible.remote.nodelocal: each node's own job streamed to it), feeding the events it gets
to the `Live` run it is handed (tagged with the part they came from), and says how its parts ended (`Ended`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from corectl import lock
from corectl.ansible.events import (
    MESSAGE_LIMIT,
    SHARD_KEY,
    CpuClock,
    EventSink,
    HostStats,
    RunRequest,
    RunResult,
    ShardOutcome,
    Tally,
)
from corectl.ansible.records import prune_runs, record


def new_ident() -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{os.getpid()}"


class Cancel:
    """Ctrl-C, SIGTERM and SIGHUP (a dropped SSH session) all ask the run to stop cleanly.

    The run then ends like any other: ansible-playbook (or every part's job) is stopped, the run is recorded as
    canceled, the site lock is released and the run's private directories are removed.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        # a plain flag, not an Event: the signal handler sets it in the main thread, which may be inside an Event's
        # own lock at that moment (a handler taking that lock again would never return)
        self._requested = False
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Cancel:
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *_: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            _detach_terminal()
        self.signum = self.signum or signum
        self.request()

    def request(self) -> None:
        """Cancel the run (as a signal does): from any thread, or a node-local follower's process."""
        self._requested = True

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or signal.SIGINT)

    def __call__(self) -> bool:
        return self._requested


def _detach_terminal() -> None:
    """The terminal is gone: further output goes to /dev/null instead of failing the run's clean-up."""
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)


@dataclass
class Live:
    """A run in progress, as its transport sees it: its request, id and folder (.runs/<id>; a read-only command's
    run has a temporary one), its cancel, and where its events go (``live(event)``, or ``live.tagged(part)`` for a
    part's events): classified once into the run's Tally, then handed to the caller's sink (the live display)."""

    request: RunRequest
    ident: str
    run_dir: Path
    cancel: Cancel
    tally: Tally = field(default_factory=Tally)
    sink: EventSink | None = None
    guard: threading.Lock = field(default_factory=threading.Lock)  # parts run in threads
    counts: bool = True  # False: events go to the sink only (a group's process: the run's process tallies them)

    def __call__(self, event: dict[str, Any]) -> None:
        if not self.counts:
            if self.sink is not None:
                self.sink(event)
            return
        with self.guard:
            self.tally(event)
            if self.sink is not None:
                self.sink(event)

    def tagged(self, part: str) -> EventSink:
        """Where a part's events go: tagged with the part's name, then as any event of the run."""

        def on_event(event: dict[str, Any]) -> None:
            event[SHARD_KEY] = part
            self(event)

        return on_event


@dataclass
class Ended:
    """How a transport's work ended: the run's status and exit code, and its parts (none for a run here)."""

    status: str
    rc: int
    parts: list[ShardOutcome] = field(default_factory=list)

    @classmethod
    def of_parts(cls, parts: list[ShardOutcome]) -> Ended:
        """A run of parts succeeds when each did. A part's status "unfit" (a node-local job that ran from the control
        host instead) is no failure."""
        fine = all(part.status in ("successful", "unfit") for part in parts)
        return cls("successful", 0, parts) if fine else cls("failed", 2, parts)


Transport = Callable[[Live], Ended]


def run(request: RunRequest, transport: Transport, sink: EventSink | None = None) -> RunResult:
    """Run ``request`` through ``transport``: its id and folder (named by the site lock), the cancel its parts
    obey, its events classified once, its hosts' counts merged; one result and, unless the command only reads,
    one record (older runs pruned)."""
    started, started_at, clock = time.monotonic(), datetime.now(UTC).isoformat(timespec="seconds"), CpuClock()
    site, ident = request.site, new_ident()
    with ExitStack() as stack:
        if request.record:
            site.runs_dir.mkdir(parents=True, exist_ok=True)
            run_dir = site.runs_dir / ident
            lock.note_run(run_dir)  # the site lock names the run its holder is in
        else:  # a read-only command's run keeps its artifacts for the run's length only
            run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="corectl-read-"))) / ident
        run_dir.mkdir(mode=0o700)
        live = Live(request, ident, run_dir, stack.enter_context(Cancel()), sink=sink)
        ended = transport(live)
        if live.cancel():
            ended = Ended("canceled", live.cancel.exit_code, ended.parts)
    tally = live.tally
    hosts = host_counts(tally, [p for p in ended.parts if p.status != "unfit"])
    result = RunResult(
        ended.status, ended.rc, hosts, run_dir, time.monotonic() - started, tally.messages, tally.tasks, ended.parts
    )
    result.cpu = clock.spent()
    result.recorded = tally.recorded
    if request.record:
        record(request, result, started_at)
        prune_runs(site)
    return result


def host_counts(tally: Tally, parts: list[ShardOutcome]) -> dict[str, HostStats]:
    """Ansible's totals where a playbook ended, else what the events showed; the hosts of a part that broke off
    (and did not fail on their own) count as unreachable, with the reason."""
    hosts = {**tally.hosts, **tally.finals}
    for part in parts:
        if part.status in ("successful", "failed", "canceled"):
            continue
        for host in part.hosts:
            stats = hosts.setdefault(host, HostStats())
            if not (stats.failed or stats.unreachable):
                stats.unreachable += 1
                tally.messages.setdefault(host, f"runner {part.runner}: {part.error}"[:MESSAGE_LIMIT])
    return hosts
