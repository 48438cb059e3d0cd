"""corectl-backup's command line: take, list, verify, restore."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from . import __doc__ as PROGRAM_DOC
from .restore import restore_command
from .store import describe, load, store_of
from .take import take, write_metrics

CONFIG = "/etc/corectl/backup.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="corectl-backup", description=(PROGRAM_DOC or "").split("\n\n")[0])
    parser.add_argument("--config", default=CONFIG)
    sub = parser.add_subparsers(dest="action", required=True)
    taking = sub.add_parser("take", help="a backup now")
    taking.add_argument("--add", action="append", default=[], help="a file to keep in the backup as well")
    taking.add_argument("--json", action="store_true")
    listing = sub.add_parser("list", help="every backup, verified")
    listing.add_argument("--json", action="store_true")
    verifying = sub.add_parser("verify", help="one backup, verified")
    verifying.add_argument("name")
    restoring = sub.add_parser("restore", help="the database and saved state of one backup back in place")
    restoring.add_argument("name", help="a backup's name, or latest (the newest complete one)")
    restoring.add_argument("--check", action="store_true", help="only whether it would (changes nothing)")
    restoring.add_argument("--force", action="store_true", help="even over jobs newer than the backup")
    args = parser.parse_args(argv)
    try:
        config = load(args.config)
    except (OSError, ValueError) as exc:
        print(f"corectl-backup: {exc}", file=sys.stderr)
        return 2
    store = store_of(config)
    try:
        if args.action == "verify":
            said = describe(store, args.name)["verified"] if args.name in store.names() else "no such backup"
            print(f"{args.name}: {said}")
            return 0 if said == "ok" else 1
        if args.action == "restore":
            kept = store.names()
            name = kept[-1] if args.name == "latest" and kept else args.name  # latest: the newest complete one
            if name not in kept:
                print(f"corectl-backup: no backup {name} in {store.where('')}", file=sys.stderr)
                return 3
            with store.local_copy(name) as backup:
                return restore_command(config, backup, args.check, args.force)
        rows = [take(config, args.add)] if args.action == "take" else [describe(store, n) for n in store.names()]
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"corectl-backup: {exc}", file=sys.stderr)
        if args.action == "take":
            write_metrics(config, ok=False, taken=None)
        return 1
    if args.action == "take":
        write_metrics(config, ok=True, taken=rows[0])
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            print(f"{row['name']}  {row['size']:>12d} B  {row['verified']}")
    return 0
