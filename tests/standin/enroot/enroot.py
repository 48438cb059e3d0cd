#!/usr/bin/python3
"""Stand-in for enroot (installed as /usr/bin/enroot): only `enroot version` works."""

from __future__ import annotations

import sys

VERSION = "3.5.0"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print("Usage: enroot COMMAND [ARG...]\n\nCommand:\n   version    Show the enroot version (stand-in)")
        return 0 if args else 1
    if args[0] in ("version", "--version", "-v"):
        print(VERSION)
        return 0
    print(f"enroot stand-in: {args[0]} is not implemented", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
