"""What following a trickling worker stream costs the reader (issue 49 item 1): corectl.ansible.remote.stream.follow
reading each line as it comes (pause 0, the baseline) against reading what has arrived at most every PAUSE_S, on
the same stream sent by a child process a line at a time with --gap-ms between lines (as a node's job sends its
events), in the same process, alternating; the reader's own CPU (the writer is a child, not counted), best of
--rounds each (these machines are noisy: the ratio is the figure).

    .venv/bin/python bench/stream_trickle.py [--events 550] [--size 1200] [--gap-ms 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from corectl.ansible.remote.jobpack import zip_message
from corectl.ansible.remote.stream import PAUSE_S, follow

# the child: writes its stdin's lines to its stdout one at a time, flushed, --gap-ms apart (the rest at once)
WRITER = """
import sys, time
gap = float(sys.argv[1]) / 1000
data = sys.stdin.buffer.read()
cut = data.index(b'{"zipfile"')
for line in data[:cut].splitlines(keepends=True):
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
    time.sleep(gap)
sys.stdout.buffer.write(data[cut:])
sys.stdout.buffer.flush()
"""


def worker_stream(count: int, size: int) -> bytes:
    """A worker's stream of ``count`` events of about ``size`` bytes each, framed as the worker sends them."""
    pad = "x" * max(0, size - 120)
    lines = [json.dumps({"status": "running", "runner_ident": "bench"})]
    data = {"host": "dgx01", "pad": pad}
    lines += [
        json.dumps({"event": "runner_on_ok", "counter": n, "uuid": f"u{n}", "event_data": data})
        for n in range(1, count + 1)
    ]
    lines.append(json.dumps({"status": "successful", "runner_ident": "bench"}))
    with tempfile.TemporaryDirectory() as made:
        (Path(made) / "rc").write_text("0")
        artifacts = zip_message(Path(made))
    return "\n".join(lines).encode() + b"\n" + artifacts + json.dumps({"eof": True}).encode() + b"\n"


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def followed(stream: bytes, gap_ms: float, pause_s: float) -> tuple[float, int]:
    """The reader's CPU seconds for the whole stream, and how many events it handed on."""
    seen: list[dict[str, Any]] = []
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(gap_ms)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert writer.stdin is not None and writer.stdout is not None
    writer.stdin.write(stream)
    writer.stdin.close()
    with tempfile.TemporaryDirectory() as out:
        start = cpu()
        status = follow(writer.stdout, Path(out), seen.append, pause_s=pause_s).status
        spent = cpu() - start
    writer.stdout.close()
    writer.wait()
    assert status == "successful", status
    return spent, len(seen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=550)
    parser.add_argument("--size", type=int, default=1200)
    parser.add_argument("--gap-ms", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    stream = worker_stream(args.events, args.size)
    pauses = {"each line as it comes (pause 0)": 0.0, f"at most every {PAUSE_S} s": PAUSE_S}
    best = dict.fromkeys(pauses, float("inf"))
    for _ in range(args.rounds):
        for name, pause in pauses.items():
            spent, count = followed(stream, args.gap_ms, pause)
            assert count == args.events, (name, count)
            best[name] = min(best[name], spent)
    base = best["each line as it comes (pause 0)"]
    print(
        f"one job's stream: {args.events} events of ~{args.size} bytes, {args.gap_ms:g} ms apart; "
        f"the reader's CPU seconds, best of {args.rounds}"
    )
    for name, seconds in best.items():
        print(f"  {name:32} {seconds * 1e3:7.1f} ms  x {seconds / base:5.2f} of the baseline")


if __name__ == "__main__":
    main()
