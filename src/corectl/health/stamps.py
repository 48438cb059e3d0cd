"""Windows of time over the failure history, in the site's store's time format (corectl.store.stamp)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from corectl.store import stamp


def window(days: int, now: datetime) -> tuple[str, str]:
    """(since, until): the last ``days`` days up to ``now``, both ends included."""
    return stamp(now - timedelta(days=days)), stamp(now)


def epoch_stamp(seconds: int) -> str:
    return stamp(datetime.fromtimestamp(seconds, UTC))
