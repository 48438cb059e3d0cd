"""The secret scan over everything a lab kept (each test's own output is scanned right after it: e2e/fixtures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.lab import CONSOLE, secret_needles, secrets_in

pytestmark = pytest.mark.lab


@pytest.mark.every_lab
def test_no_secret_at_rest_in_runs_facts_or_console(lab: Path):
    """Every secret source, in everything the runs on this lab left behind (each test's own output is also
    checked right after it: no_secret_left_by_the_test)."""
    needles = secret_needles(lab)
    assert needles["bmc password"] == (lab / ".lab" / "bmc.password").read_bytes().strip()
    kept = [p for d in (lab / ".runs", lab / ".facts") for p in d.rglob("*") if p.is_file()]
    assert len(kept) > 100  # the first provision's records at least
    assert any(p.name == "command" for p in kept)  # ansible-runner's record of each run's environment
    assert CONSOLE  # at least lab up's and the first provision's output
    assert secrets_in(lab, 0.0, CONSOLE) == []
