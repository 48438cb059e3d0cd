"""Node jobs followed from several processes (issue 49 item 1, docs/scale.md): the nodes split into groups, one
forked process per group follows its group's jobs and sends the run's own process only what the run's tally and live
display read of each event (corectl.ansible.events.slim), in batches. One progress display and one run record.

Why: one corectl process read every node job's stream under one Python lock, so a fleet's node-local run was bound
by one core of the control host. A group's process reads its jobs' streams, writes their events files and stops
their jobs on Ctrl-C; the run's process tallies and shows the events as a run from here would.

A process is forked (not spawned): it starts at once, with the run as the parent holds it. Ctrl-C, SIGTERM and
SIGHUP are the run's process's to handle (corectl.ansible.lifecycle.Cancel): a group's process ignores them and stops
its jobs when the run's process says "stop", or when it goes away.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

from corectl.ansible.events import EventSink

Item = TypeVar("Item")
Result = TypeVar("Result")
# a group's work in its own process: its items, where its events go (sent back in batches); a result per item
Work = Callable[[list[Item], EventSink], list[Result]]

# how long a group's first waiting event waits for others before they are sent back together, one send (the live
# display redraws every 0.25 s anyway: corectl.progress.REDRAW_S); a process with nothing to send does not wake
FLUSH_S = 0.25
STOP = "stop"


def split(items: Sequence[Item], count: int) -> list[list[Item]]:
    """``items`` dealt round-robin into at most ``count`` groups, none empty."""
    groups: list[list[Item]] = [[] for _ in range(max(1, min(count, len(items))))]
    for index, item in enumerate(items):
        groups[index % len(groups)].append(item)
    return [group for group in groups if group]


def run_groups(
    groups: list[list[Item]],
    work: Work[Item, Result],
    deliver: Callable[[list[dict[str, Any]]], None],
    canceled: Callable[[], bool],
    stop: Callable[[], None],
) -> list[list[Result] | str]:
    """``work`` on each group in a process of its own. Every batch of events a group sends goes to ``deliver`` (in
    this process); once ``canceled()``, each group's process is told to stop (``stop`` runs there). Per group, in
    order: its results, or why its process gave none."""
    context = multiprocessing.get_context("fork")
    for stream in (sys.stdout, sys.stderr):  # a child's copy of what is not written yet would be written twice
        stream.flush()
    children = []
    for number, group in enumerate(groups):
        ours, theirs = context.Pipe()
        process = context.Process(target=_child, args=(work, group, theirs, stop), name=f"corectl-nodes-{number}")
        process.start()
        theirs.close()
        children.append((process, ours))
    results: list[list[Result] | str | None] = [None] * len(children)
    open_ = {conn: index for index, (_process, conn) in enumerate(children)}
    told = False
    while open_:
        for conn in wait(list(open_), timeout=0.2):
            assert isinstance(conn, Connection)
            try:
                kind, body = conn.recv()
            except (EOFError, OSError):  # the process ended without its results (killed)
                del open_[conn]
                continue
            if kind == "events":
                deliver(body)
            else:
                results[open_.pop(conn)] = body
        if canceled() and not told:
            told = True
            for _process, conn in children:
                with contextlib.suppress(OSError):
                    conn.send(STOP)
    ended: list[list[Result] | str] = []
    for (process, conn), result in zip(children, results, strict=True):
        process.join()
        conn.close()
        ended.append(result if result is not None else f"its process ended without a result (exit {process.exitcode})")
    return ended


def _child(work: Work[Item, Result], group: list[Item], conn: Connection, stop: Callable[[], None]) -> None:
    """A group's process: ``work`` with its events sent back in batches (at most one per FLUSH_S), its results (or why
    none) last."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    batch: list[dict[str, Any]] = []
    arrived, done = threading.Condition(), threading.Event()

    def send(message: tuple[str, Any]) -> None:  # (the flusher's thread, then, once it has ended, this one)
        with contextlib.suppress(OSError):
            conn.send(message)

    def flush() -> None:
        with arrived:
            events = batch[:]
            batch.clear()
        if events:
            send(("events", events))

    def add(event: dict[str, Any]) -> None:
        with arrived:
            batch.append(event)
            if len(batch) == 1:
                arrived.notify()

    def flusher() -> None:  # asleep until an event waits; then FLUSH_S for the others, and one send
        while True:
            with arrived:
                while not batch and not done.is_set():
                    arrived.wait()
            if done.wait(FLUSH_S):
                return
            flush()

    def listen() -> None:  # "stop", or the run's process gone: stop this group's jobs
        with contextlib.suppress(EOFError, OSError):
            while conn.recv() != STOP:
                pass
        if not done.is_set():
            stop()

    threading.Thread(target=listen, daemon=True).start()
    sender = threading.Thread(target=flusher, daemon=True)
    sender.start()
    try:
        results: list[Result] | str = work(group, add)
    except Exception as exc:  # (the work's own per-item errors are its results; this is anything else)
        results = f"{type(exc).__name__}: {exc}"
    with arrived:
        done.set()
        arrived.notify()
    sender.join()
    flush()
    send(("done", results))
