"""bootstrap: first contact with fresh nodes (the per-node loop and its SSH work are corectl.bootstrap's,
which add-node uses too)."""

from __future__ import annotations

from corectl.bootstrap import Login
from corectl.bootstrap import bootstrap_nodes as bootstrap

__all__ = ["Login", "bootstrap"]
