"""What reading one job's worker stream costs the control host (issue 49 item 1): ansible-runner's `process` side
(what corectl used: each event written to its own file through a codecs writer) against corectl's own reader
(corectl.ansible.remote.stream.follow: one json.loads per line, one events file per job), on the same stream, in
the same process, alternating, best of --rounds each (these machines are noisy: the ratio is the figure).

    .venv/bin/python bench/stream_reader.py RUN_DIR [--rounds 5]

RUN_DIR: a run's folder with a job_events/ folder (any provision's; `corectl runs` lists them). Its events, in
order, are framed as a worker would send them (status lines, the events, the artifacts' zip, eof).
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from corectl.ansible.remote.jobpack import zip_message
from corectl.ansible.remote.stream import follow


def worker_stream(run_dir: Path) -> tuple[bytes, int]:
    """The run's events as one worker's stream, and how many events it holds."""
    paths = [p for p in (run_dir / "job_events").glob("*.json") if not p.name.endswith("-partial.json")]
    events = sorted((json.loads(p.read_text()) for p in paths), key=lambda e: int(e.get("counter") or 0))
    if not events:
        raise SystemExit(f"{run_dir}: no events in its job_events/")
    lines = [json.dumps({"status": "starting", "runner_ident": "bench"}), json.dumps({"status": "running"})]
    lines += [json.dumps(e) for e in events]
    lines.append(json.dumps({"status": "successful", "runner_ident": "bench"}))
    with tempfile.TemporaryDirectory() as made:
        (Path(made) / "rc").write_text("0")
        artifacts = zip_message(Path(made))
    return "\n".join(lines).encode() + b"\n" + artifacts + json.dumps({"eof": True}).encode() + b"\n", len(events)


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def processed(stream: bytes, out: Path, on_event: Callable[[dict[str, Any]], Any]) -> str:
    import ansible_runner

    result = ansible_runner.run(
        streamer="process",
        _input=io.BytesIO(stream),
        private_data_dir=str(out),
        event_handler=lambda event: on_event(event) or True,
        quiet=True,
    )
    return str(result.status)


def followed(stream: bytes, out: Path, on_event: Callable[[dict[str, Any]], Any]) -> str:
    return follow(io.BytesIO(stream), out, on_event).status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    stream, count = worker_stream(args.run_dir)
    readers = {"ansible-runner process": processed, "corectl follow": followed}
    best = dict.fromkeys(readers, float("inf"))
    for _ in range(args.rounds):
        for name, read in readers.items():
            seen: list[dict[str, Any]] = []
            with tempfile.TemporaryDirectory() as out:
                start = cpu()
                status = read(stream, Path(out), seen.append)
                best[name] = min(best[name], cpu() - start)
            assert status == "successful" and len(seen) == count, (name, status, len(seen))
    base = best["ansible-runner process"]
    print(f"one job's stream: {count} events, {len(stream) / 1e6:.1f} MB; CPU seconds, best of {args.rounds}")
    for name, seconds in best.items():
        print(f"  {name:24} {seconds:6.3f} s  {seconds / count * 1e3:6.3f} ms per event  x {base / seconds:4.1f}")


if __name__ == "__main__":
    main()
