"""corectl.node_state: sinfo's one format and scontrol's long state, read from real output of both Slurm
releases (tests/samples/slurm-*: captured from the labs' Debian Slurm, tests/samples/SOURCES.md)."""

from __future__ import annotations

import re

import pytest

from conftest import ROOT
from corectl.node_state import SINFO_ARGV, SINFO_FORMAT, NodeState, parse_sinfo, unavailable

SAMPLES = ROOT / "tests" / "samples"
RELEASES = ("22.05", "24.11")  # Debian 12's and Debian 13's Slurm


def sample(release: str) -> list[tuple[str, NodeState]]:
    """A capture's lines (sinfo at moments of the labs' tests: one node may be in it several times), each parsed."""
    lines = (SAMPLES / f"slurm-{release}.sinfo-N-format.txt").read_text().splitlines()
    parsed = [NodeState.parse(line) for line in lines]
    assert None not in parsed  # every line read
    return parsed  # type: ignore[return-value]


@pytest.mark.parametrize("release", RELEASES)
def test_real_sinfo_lines_of_both_releases_parse(release: str):
    states = [state for _, state in sample(release)]
    for node, state in sample(release):
        assert re.fullmatch(r"[a-z0-9-]+", node) and state.base.isalpha(), (node, state)
        assert state.reason != "none"  # sinfo's word for no reason is ""
        assert state.quiet == (state.state == "idle" and not state.reason)
        assert not state.drained or (state.bad and state.reason)  # a drain always has its reason
    assert any(s.quiet for s in states)
    # a node slurmctld has not heard from since it started: unknown, not responding
    assert NodeState("unk*") in states and not NodeState("unk*").quiet
    lines = (SAMPLES / f"slurm-{release}.sinfo-N-format.txt").read_text().splitlines()
    assert parse_sinfo(lines) == dict(sample(release))  # node -> its last line


def test_what_the_lab_drained_reads_as_drained_with_its_reason():
    """Debian 12's capture holds the lab's drains: the health hook's, heal's, burn-in's and an operator's."""
    drained = {state.reason.split(":")[0] for _, state in sample("22.05") if state.drained}
    assert {"corectl-health", "corectl burn-in", "corectl", "e2e dashboards"} <= drained
    assert {"alloc", "mix", "comp", "idle*"} <= {state.state for _, state in sample("22.05")}


@pytest.mark.parametrize("release", RELEASES)
def test_real_scontrol_states_of_both_releases(release: str):
    states = (SAMPLES / f"slurm-{release}.scontrol-State.txt").read_text().split()
    assert states and all(re.fullmatch(r"[A-Z_]+(\+[A-Z_]+)*", s) for s in states)
    for state in states:
        assert unavailable(state) == bool({"DRAIN", "DOWN", "NOT_RESPONDING", "FAIL"} & set(state.split("+"))), state


@pytest.mark.parametrize(
    ("line", "node", "state"),
    [
        ("dgx01|idle|none", "dgx01", NodeState("idle")),
        ("dgx02|drng|corectl-health: xid: 79|GPU 3", "dgx02", NodeState("drng", "corectl-health: xid: 79|GPU 3")),
        ("dgx03|down*|Not responding", "dgx03", NodeState("down*", "Not responding")),
        ("dgx04|idle~|none", "dgx04", NodeState("idle~")),
    ],
)  # fmt: skip
def test_the_shapes_of_a_line(line: str, node: str, state: NodeState):
    assert NodeState.parse(line) == (node, state)


def test_flags_drains_and_what_is_quiet():
    down = NodeState("down*", "Not responding")
    assert (down.base, down.flags, down.bad, down.drained, down.quiet) == ("down", "*", True, False, False)
    assert NodeState("drain*", "x").drained and NodeState("drng", "x").drained and NodeState("mix").bad is False
    assert not NodeState("idle*").quiet and not NodeState("idle", "reserved").quiet and NodeState("idle").quiet
    assert NodeState.parse("no bars here") is None and NodeState.parse("|idle|none") is None
    assert SINFO_ARGV[-1] == f"--format={SINFO_FORMAT}" and SINFO_FORMAT == "%N|%t|%E"
    assert unavailable("IDLE+POWERED_DOWN") and unavailable("MIXED+REBOOT_REQUESTED") and not unavailable("ALLOCATED")
