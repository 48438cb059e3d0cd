"""Failures seen as events (a hardware-class Xid, a GPU fallen off the bus, an InfiniBand error counter that
jumped or a link that went down), kept on the node in
<state_dir>/sticky.json until corectl heal (after its remedy) or an operator (corectl resume)
clears them: neither the kernel log window passing nor a reboot ends them.

A clear records its time: kernel log lines from before it are not read again (the Xid that was
healed is still in the log window), so the checks that follow a remedy validate the node as it
is now.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from .core import CheckFailed

STICKY_FILE = "sticky.json"


def sticky_path(config: dict[str, Any]) -> Path:
    return Path(config["state_dir"]) / STICKY_FILE


def read_sticky(config: dict[str, Any]) -> dict[str, Any]:
    """{"records": [...], "cleared_at": epoch seconds or None, "cleared_by": str}; a missing file is empty."""
    path = sticky_path(config)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"records": [], "cleared_at": None, "cleared_by": ""}
    except (OSError, ValueError) as exc:
        # a record that cannot be read must not let the node back in
        raise CheckFailed(f"cannot read the kept failures in {path}: {exc}") from None
    records = data.get("records") if isinstance(data, dict) else None
    if not isinstance(records, list) or not all(isinstance(r, dict) and "key" in r for r in records):
        raise CheckFailed(f"cannot read the kept failures in {path}: not corectl's format")
    return {"records": records, "cleared_at": data.get("cleared_at"), "cleared_by": data.get("cleared_by", "")}


def write_sticky(config: dict[str, Any], data: dict[str, Any]) -> None:
    write_json(sticky_path(config), data)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace the file in one step (a crash leaves the old one or the new one, never half)."""
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".sticky-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=2, sort_keys=True)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def keep(config: dict[str, Any], check: str, seen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add the failures ``check`` just saw to the kept ones (one record per key, first time kept)
    and return ``check``'s kept records, oldest first."""
    data = read_sticky(config)
    records = data["records"]
    known = {r["key"] for r in records}
    new = []
    for record in seen:
        if record["key"] not in known:
            known.add(record["key"])
            new.append({**record, "since": int(time.time())})
    if new:
        data["records"] = records + new
        write_sticky(config, data)
    return [r for r in data["records"] if r.get("check") == check]


def clear_sticky(config: dict[str, Any], by: str) -> list[dict[str, Any]]:
    """End every kept failure; return what was cleared. Records the time, so older log lines
    are not read again."""
    try:
        records = read_sticky(config)["records"]
    except CheckFailed as exc:  # an unreadable file is replaced: say so
        records = [{"check": "sticky", "key": "unreadable", "message": str(exc), "since": int(time.time())}]
    write_sticky(config, {"records": [], "cleared_at": time.time(), "cleared_by": by})
    return records


# Kernel log times are whole seconds: a window since a clear reaches this far back before it, so that
# nothing logged after the clear is missed (what came just before it is read again, and kept again: the
# safe side; a remedy takes far longer than this).
CLEAR_MARGIN_S = 2


def seconds_since_clear(config: dict[str, Any], window: int) -> int:
    """The kernel log window to read: ``window``, or less when the kept failures were cleared
    more recently than that (whole seconds since the clear, plus CLEAR_MARGIN_S)."""
    cleared_at = read_sticky(config)["cleared_at"]
    if not isinstance(cleared_at, (int, float)):
        return window
    return min(window, math.ceil(time.time() - cleared_at) + CLEAR_MARGIN_S)


def when(epoch: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def read_json_state(config: dict[str, Any], name: str) -> dict[str, Any]:
    """A check's own state between runs (<state_dir>/<name>), {} when there is none or it is unreadable."""
    try:
        data = json.loads((Path(config["state_dir"]) / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json_state(config: dict[str, Any], name: str, data: dict[str, Any]) -> None:
    write_json(Path(config["state_dir"]) / name, data)
