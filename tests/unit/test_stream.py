"""corectl.ansible.remote.stream: a worker's stream followed to its eof, events handed on and kept as one file."""

from __future__ import annotations

import io
import json
import stat
from pathlib import Path
from typing import Any

import pytest

from corectl.ansible.remote import stream as stream_module
from corectl.ansible.remote.jobpack import zip_message
from corectl.ansible.remote.stream import EVENTS, FLOWING, follow, read_events


def line(data: dict[str, Any]) -> bytes:
    return json.dumps(data).encode() + b"\n"


def event(counter: int, kind: str = "runner_on_ok") -> dict[str, Any]:
    return {"event": kind, "counter": counter, "uuid": f"u{counter}", "event_data": {"host": "dgx01"}}


def artifacts(tmp_path: Path) -> bytes:
    """The worker's artifacts message: its zipfile line and the zip (ansible-runner's own layout)."""
    made = tmp_path / "worker-artifacts"
    made.mkdir()
    (made / "rc").write_text("0")
    return zip_message(made)


def test_events_are_handed_on_and_kept_in_order_the_status_and_artifacts_as_the_worker_sent_them(tmp_path: Path):
    stream = b"".join(
        [
            line({"status": "starting", "runner_ident": "1"}),
            line(event(1, "playbook_on_start")),
            line({"event": "keepalive"}),
            line(event(2)),
            line({"status": "running"}),
            line(event(3, "playbook_on_stats")),
            line({"status": "successful", "runner_ident": "1"}),
            artifacts(tmp_path),
            line({"eof": True}),
        ]
    )
    seen: list[dict[str, Any]] = []
    job = tmp_path / "job"
    followed = follow(io.BytesIO(stream), job, seen.append)
    assert (followed.status, followed.explanation) == ("successful", "")
    assert [e["counter"] for e in seen] == [1, 2, 3]  # not the keepalive, not the status lines
    assert read_events(job / EVENTS) == seen
    assert stat.S_IMODE((job / EVENTS).stat().st_mode) == 0o600  # events hold the hosts' facts
    assert (job / "artifacts" / "rc").read_text() == "0"


def test_a_stream_cut_before_its_eof_is_an_error_and_keeps_the_events_that_came(tmp_path: Path):
    stream = line({"status": "running"}) + line(event(1)) + line(event(2))[:-9]  # the worker's host went away
    seen: list[dict[str, Any]] = []
    followed = follow(io.BytesIO(stream), tmp_path / "job", seen.append)
    assert followed.status == "error" and "not JSON" in followed.explanation
    assert [e["counter"] for e in seen] == [1]
    empty = follow(io.BytesIO(b""), tmp_path / "other", seen.append)
    assert (empty.status, empty.explanation) == ("error", "the worker's stream ended before its eof")


def test_a_last_line_cut_short_in_the_events_file_is_left_out(tmp_path: Path):
    kept = tmp_path / EVENTS
    kept.write_bytes(line(event(1)) + line(event(2))[:-5])
    assert [e["counter"] for e in read_events(kept)] == [1]


class Trickle:
    """A worker's stdout as follow sees it: each read1 returns the next of ``chunks`` (then b"": the end), read()
    takes from the chunks as a pipe would; ``calls`` records the reads and the pauses between them."""

    def __init__(self, chunks: list[bytes], calls: list[str]) -> None:
        self.chunks, self.calls = list(chunks), calls

    def read1(self, size: int = -1, /) -> bytes:
        self.calls.append("read1")
        return self.chunks.pop(0) if self.chunks else b""

    def read(self, size: int = -1, /) -> bytes:
        self.calls.append("read")
        data = b""
        while self.chunks and (size < 0 or len(data) < size):
            data += self.chunks.pop(0)
        if size >= 0 and len(data) > size:
            self.chunks.insert(0, data[size:])
            data = data[:size]
        return data


def test_a_trickling_stream_is_read_in_batches_a_pause_apart_and_a_flowing_one_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    calls: list[str] = []
    monkeypatch.setattr(stream_module.time, "sleep", lambda seconds: calls.append(f"pause {seconds}"))
    zipped = artifacts(tmp_path)
    header, body = zipped.split(b"\n", 1)
    big = line({"event": "keepalive", "pad": "x" * FLOWING})  # a read this large: the stream is flowing
    events = [line(event(n)) for n in range(1, 5)]
    chunks = [
        line({"status": "running"}) + events[0][:10],  # a line cut between two reads
        events[0][10:] + events[1],
        big,
        events[2] + events[3] + line({"status": "successful"}) + header + b"\n" + body[:7],  # the zip cut too
        body[7:],
        line({"eof": True}),
    ]
    seen: list[dict[str, Any]] = []
    followed = follow(Trickle(chunks, calls), tmp_path / "job", seen.append, pause_s=0.25)
    assert followed.status == "successful"
    assert [e["counter"] for e in seen] == [1, 2, 3, 4]
    assert (tmp_path / "job" / "artifacts" / "rc").read_text() == "0"
    # no pause before the first read nor after the large one; the zip's rest taken from the stream as it is
    assert calls == ["read1", "pause 0.25", "read1", "pause 0.25", "read1", "read1", "read", "pause 0.25", "read1"]


def test_with_no_pause_each_read_is_taken_as_it_comes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    calls: list[str] = []
    monkeypatch.setattr(stream_module.time, "sleep", lambda seconds: calls.append(f"pause {seconds}"))
    chunks = [line(event(1)), line(event(2)), line({"status": "failed"}) + line({"eof": True})]
    seen: list[dict[str, Any]] = []
    followed = follow(Trickle(chunks, calls), tmp_path / "job", seen.append, pause_s=0)
    assert (followed.status, [e["counter"] for e in seen]) == ("failed", [1, 2])
    assert calls == ["read1"] * 3


def test_a_line_longer_than_many_reads_is_read_whole_without_pauses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    calls: list[str] = []
    monkeypatch.setattr(stream_module.time, "sleep", lambda seconds: calls.append(f"pause {seconds}"))
    big = {**event(1), "event_data": {"host": "dgx01", "stdout": "y" * (5 * FLOWING)}}  # a task's long output
    data = line(big)
    parts = [data[at : at + FLOWING] for at in range(0, len(data), FLOWING)]
    chunks = [*parts, line(event(2)), line({"status": "successful"}) + line({"eof": True})]
    seen: list[dict[str, Any]] = []
    followed = follow(Trickle(chunks, calls), tmp_path / "job", seen.append)
    assert followed.status == "successful"
    assert seen[0] == big and [e["counter"] for e in seen] == [1, 2]
    assert read_events(tmp_path / "job" / EVENTS) == seen
    # the long line's full-sized reads came one after the other; its last part (shorter) was followed by a pause
    assert calls[: len(parts)] == ["read1"] * len(parts) and calls[len(parts)] == f"pause {stream_module.PAUSE_S}"
