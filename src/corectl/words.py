"""Counts in words, as every command prints them: ``1 node``, ``1,000 nodes``."""

from __future__ import annotations


def counted(count: int, word: str) -> str:
    """``count`` and ``word``, plural unless one (``1 host``, ``3 failing health runs``)."""
    return f"{count:,} {word}{'' if count == 1 else 's'}"
