#!/usr/bin/python3
"""Stand-in for nv-hostengine, the DCGM host engine (installed as /usr/bin/nv-hostengine).

  nv-hostengine -n [--service-account USER] [-b ADDR|ALL] [-p PORT] [--pid FILE]   foreground
  nv-hostengine [...]                                                               daemonizes
  nv-hostengine -t | --term                                                         stops a running one

Protocol on TCP (default 127.0.0.1:5555): one JSON request per line, one JSON answer per line.
  {"op": "ping"}  -> {"ok": true}
  {"op": "state"} -> {"ok": true, "state": <GPU description>}
  {"op": "version"} -> {"ok": true, "version": "4.2.3"}
  {"op": "health_set", "systems": "a"} -> {"ok": true}     the health watches (held in memory: a restart loses them)
  {"op": "health_watches"} -> {"ok": true, "systems": "a"}  ("" when none is set)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socketserver
import sys
import threading
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parent / "gpusim"), str(_HERE.parent / "lib" / "gpu-sim"), "/usr/lib/gpu-sim"]
import gpusim  # noqa: E402

NAME = "hostengine"
WATCHES = {"systems": ""}


def answer(request: object) -> dict:
    if not isinstance(request, dict):
        return {"ok": False, "error": "request must be a JSON object"}
    op = request.get("op")
    if op == "ping":
        return {"ok": True}
    if op == "version":
        return {"ok": True, "version": gpusim.installed_dcgm()}
    if op == "health_set":
        WATCHES["systems"] = str(request.get("systems", ""))
        return {"ok": True}
    if op == "health_watches":
        return {"ok": True, "systems": WATCHES["systems"]}
    if op == "state":
        state = gpusim.load_or_none()
        code, message = gpusim.driver_check(state)
        if code:
            return {"ok": False, "error": message.splitlines()[0]}
        return {"ok": True, "state": state}
    return {"ok": False, "error": f"unknown op {op!r}"}


class Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        for raw in self.rfile:
            line = raw.strip()
            if not line:
                continue
            try:
                reply = answer(json.loads(line))
            except ValueError:
                reply = {"ok": False, "error": "invalid JSON"}
            try:
                self.wfile.write(json.dumps(reply).encode() + b"\n")
                self.wfile.flush()
            except OSError:
                return


class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


def terminate() -> int:
    path = gpusim.pid_file(NAME)
    try:
        pid = int(path.read_text().strip())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        print("Unable to terminate host engine: no running host engine found", file=sys.stderr)
        return 1
    print("Host engine successfully terminated.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nv-hostengine")
    parser.add_argument("-n", "--no-daemon", action="store_true")
    parser.add_argument("-t", "--term", action="store_true")
    parser.add_argument("-b", "--bind-interface", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int)
    parser.add_argument("--service-account")
    parser.add_argument("--pid")
    parser.add_argument("-f", "--log-filename")
    parser.add_argument("--log-level")
    args, _unknown = parser.parse_known_args(argv)
    if args.term:
        return terminate()

    state = gpusim.load_or_none()
    code, message = gpusim.driver_check(state)
    if code:
        print(f"Err: Failed to start DCGM Server: {message.splitlines()[0]}", file=sys.stderr)
        return 1
    assert state is not None
    port = args.port or int(state.get("hostengine", {}).get("port", gpusim.HOSTENGINE_PORT))
    address = "0.0.0.0" if args.bind_interface.upper() == "ALL" else args.bind_interface
    try:
        server = Server((address, port), Handler)
    except OSError as exc:
        print(f"Err: Failed to start DCGM Server: cannot listen on {address}:{port}: {exc}", file=sys.stderr)
        return 1
    if not args.no_daemon and os.fork():
        os._exit(0)
    if not args.no_daemon:
        os.setsid()
    gpusim.catch_termination()
    gpusim.write_pid(NAME)
    if args.pid:
        Path(args.pid).write_text(f"{os.getpid()}\n")
    threading.Thread(target=server.serve_forever, name="dcgm-server", daemon=True).start()
    print(f"Started host engine version {gpusim.installed_dcgm()} using port number: {port}", flush=True)
    gpusim.notify_ready()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        gpusim.remove_pid(NAME)
        if args.pid:
            with contextlib.suppress(OSError):
                Path(args.pid).unlink()

    return gpusim.run_until_terminated(stop)


if __name__ == "__main__":
    sys.exit(main())
