"""The failure history's times: UTC to the second, ISO 8601 (``2026-11-22T09:12:44Z``), so that text
order is time order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


def stamp(at: datetime) -> str:
    """``2026-11-22T09:12:44Z``: UTC to the second (a naive time is taken as UTC)."""
    utc = at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%SZ")


def window(days: int, now: datetime) -> tuple[str, str]:
    """(since, until): the last ``days`` days up to ``now``, both ends included."""
    return stamp(now - timedelta(days=days)), stamp(now)


def epoch_stamp(seconds: int) -> str:
    return stamp(datetime.fromtimestamp(seconds, UTC))


def parse_stamp(at: str) -> datetime:
    return datetime.strptime(at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
