"""corectl status: the quiet nodes as one host list, the others one per row (no Slurm, no nodes)."""

from __future__ import annotations

import io

from rich.console import Console

from corectl.commands.status import is_quiet, status_table
from corectl.hostlist import expand
from corectl.node_state import NodeState
from corectl.slurm import SlurmStatus, parse_status

LONG_NAME = "corectl-labtest-e2e-dgx01"
STAMP = "2025-01-10 09:12:44Z"
EXCEPTIONS = {  # node -> its state and reason (sinfo's "none": "")
    "dgx0007": NodeState("drain", "corectl-health: xid: Xid 79 on GPU 3"),
    "dgx0250": NodeState("down*", "Not responding"),
    "dgx0251": NodeState("alloc"),
    "dgx0252": NodeState("mix"),
    "dgx0400": NodeState("idle", "reserved for burn-in"),
    "dgx0512": NodeState("idle"),  # idle, but its last health check failed
    LONG_NAME: NodeState("drain"),
}


def lines_of(renderable: object, width: int = 80) -> list[str]:
    console = Console(record=True, width=width, color_system=None, file=io.StringIO())
    console.print(renderable)
    return console.export_text().splitlines()


def thousand_nodes() -> tuple[SlurmStatus, dict[str, str]]:
    """dgx0001..dgx0999 and a long-named node: 993 idle and healthy, 7 that need a look."""
    states = {f"dgx{i:04d}": NodeState("idle") for i in range(1, 1000)}
    states.update(EXCEPTIONS)
    jobs = {"4242": ["dgx0251"], "4243": ["dgx0252"], "4244": ["dgx0252"]}
    health = {node: f"ok {STAMP}" for node in ("dgx0001", "dgx0500", "dgx0999")}
    health["dgx0512"] = f"FAIL gpu-count {STAMP}"
    return SlurmStatus(states=states, jobs=jobs), health


def test_a_thousand_nodes_at_80_columns():
    status, health = thousand_nodes()
    assert len(status.states) == 1000
    lines = lines_of(status_table(status, health))
    assert all(len(line) <= 80 for line in lines), lines
    assert len(lines) < 20, lines  # not one row per node
    assert lines[0] == "1,000 nodes: 995 idle, 2 drain, 1 alloc, 1 down*, 1 mix; health failed on 1"
    quiet = "dgx[0001-0006,0008-0249,0253-0399,0401-0511,0513-0999]"
    assert lines[1] == f"idle and healthy (993): {quiet}"
    assert set(expand(quiet)) == set(status.states) - set(EXCEPTIONS)
    assert lines[2].split() == ["node", "state", "reason", "jobs", "health"]
    rows = table_rows(lines[4:])
    assert list(rows) == sorted(EXCEPTIONS)  # each exception once, its name whole
    for node, (state, _) in EXCEPTIONS.items():
        assert rows[node][1] == state
    assert rows["dgx0252"][2:4] == ["4243,", "4244"]
    assert rows["dgx0512"][2:4] == ["FAIL", "gpu-count"]
    assert {"reserved", "for", "burn-in"} <= set(rows["dgx0400"])
    assert {"Xid", "79", "GPU", "3"} <= set(rows["dgx0007"])


def table_rows(lines: list[str]) -> dict[str, list[str]]:
    """node -> the words of its row, line by line (the continuation lines of wrapped cells included)."""
    rows: dict[str, list[str]] = {}
    node = ""
    for line in lines:
        if not line[0].isspace():
            node = line.split()[0]
            rows[node] = []
        rows[node].extend(line.split())
    return rows


def test_quiet_means_idle_without_reason_job_or_failed_check():
    status = parse_status(
        {
            "nodes": [
                "n1|idle|none",
                "n2|idle*|none",
                "n3|idle|maintenance",
                "n4|idle|none",
                "n5|idle|none",
                "n6|idle|none",
            ],
            "jobs": [["9", "n4"]],
        }
    )
    health = {"n1": f"ok {STAMP}", "n5": f"FAIL ecc {STAMP}"}
    quiet = [node for node in sorted(status.states) if is_quiet(status, node, health, status.busy_nodes())]
    assert quiet == ["n1", "n6"]  # n6: never checked


def test_all_quiet_is_two_lines_and_no_table():
    status = SlurmStatus(states={f"dgx{i:02d}": NodeState("idle") for i in range(1, 13)})
    assert lines_of(status_table(status)) == ["12 nodes: 12 idle", "idle and healthy (12): dgx[01-12]"]


def test_no_quiet_node_has_no_host_list_line():
    status = SlurmStatus(states={"dgx01": NodeState("drain", "bad gpu")})
    lines = lines_of(status_table(status, {}))
    assert lines[0] == "1 node: 1 drain"
    assert not any("idle and healthy" in line for line in lines)
    assert any(line.split()[:3] == ["dgx01", "drain", "bad"] for line in lines)


def test_no_node():
    assert lines_of(status_table(SlurmStatus(), None)) == ["status: Slurm reported no compute nodes"]
