"""Validation of idle nodes (issue 33): the controller's corectl-validate (role slurm) choosing the nodes of a
round and reading Slurm's answers, and `corectl validate-nodes` refusing a site without health.validation. The
lab's end-to-end tests run the rounds as real Slurm jobs."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from typer.testing import CliRunner

from conftest import ROOT, load_script

# `scontrol show node --oneliner` lines as Slurm 22.05 prints them (shortened to the fields read; two spaces
# before some keys, a Reason with spaces and its [user@time] tail)
NODE = (
    "NodeName={name} Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.00 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:h100:8(S:0) NodeAddr={name} NodeHostName={name} "
    "Version=22.05.8 OS=Linux 6.1.0-27-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.115-1 (2024-11-01)  "
    "RealMemory=1024 AllocMem=0 FreeMem=N/A Sockets=1 Boards=1 State={state} ThreadsPerCore=1 TmpDisk=0 "
    "Weight=1 Owner=N/A MCS_label=N/A Partitions=batch  BootTime=2026-11-26T08:20:01 "
    "SlurmdStartTime=2026-11-26T08:21:13 LastBusyTime={busy} CfgTRES=cpu=2,mem=1G,billing=2,gres/gpu=8 "
    "AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 "
    "ExtSensorsTemp=n/s{reason}"
)
CONFIG = {"qos": "validation", "idle_min": 30, "max_nodes": 2, "dcgm_level": 2, "time_limit_min": 30,
          "checker": "/usr/local/sbin/corectl-health-check"}  # fmt: skip


def validate_module() -> ModuleType:
    return load_script("corectl_validate", ROOT / "roles" / "slurm" / "files" / "corectl-validate")


def node_line(name: str, state: str = "IDLE", busy: str = "2026-11-26T06:00:00", reason: str = "") -> str:
    tail = f" Reason={reason} [root@2026-11-26T09:02:11]" if reason else ""
    return NODE.format(name=name, state=state, busy=busy, reason=tail)


def test_a_node_line_is_read_with_its_reason_and_gpus():
    cv = validate_module()
    line = node_line("dgx07", "IDLE+DRAIN", reason="corectl validation: nccl: bus bandwidth 117.6 GB/s at 8 GiB")
    node = cv.fields(line)
    assert (node["NodeName"], node["State"], node["Partitions"]) == ("dgx07", "IDLE+DRAIN", "batch")
    assert node["Reason"] == "corectl validation: nccl: bus bandwidth 117.6 GB/s at 8 GiB [root@2026-11-26T09:02:11]"
    assert node["OS"] == "Linux 6.1.0-27-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.115-1 (2024-11-01)"
    assert [cv.gpu_count(g) for g in ("gpu:h100:8(S:0-1)", "gpu:8", "(null)", "shard:4,gpu:a100:4")] == [8, 8, 0, 4]
    assert cv.result("dgx07", "12", "FAILED", node) == {
        "node": "dgx07",
        "job": "12",
        "result": "fail",
        "message": "corectl validation: nccl: bus bandwidth 117.6 GB/s at 8 GiB",
    }


def test_a_round_takes_idle_gpu_nodes_idle_long_enough_and_at_most_max_nodes(monkeypatch: pytest.MonkeyPatch):
    cv = validate_module()
    lines = [
        node_line("dgx01"),
        node_line("dgx02", busy="2099-01-01T00:00:00"),  # busy until just now: not idle long enough
        node_line("dgx03", state="ALLOCATED"),
        node_line("dgx04", state="IDLE+DRAIN", reason="corectl-health: xid: Xid 79 on GPU 3"),
        node_line("dgx05"),
        node_line("dgx06"),
        node_line("dgx07"),
        node_line("head01").replace("Gres=gpu:h100:8(S:0)", "Gres=(null)"),
    ]
    every = {n["NodeName"]: n for n in map(cv.fields, lines)}
    monkeypatch.setattr(cv, "queued", lambda: [{"job": "40", "state": "RUNNING", "node": "dgx05"}])
    chosen, skipped = cv.choose(CONFIG, every, None)
    assert chosen == ["dgx01"]  # max_nodes 2, and dgx05's validation job counts
    assert skipped == {
        "dgx02": "idle for less than 30 min",
        "dgx03": "not idle (ALLOCATED)",
        "dgx04": "not idle (IDLE+DRAIN)",
        "dgx05": "a validation job is already queued or running there",
        "dgx06": "max_nodes 2 reached",
        "dgx07": "max_nodes 2 reached",
        "head01": "no GPUs",
    }
    # named by hand: idle however briefly, max_nodes not applied
    chosen, skipped = cv.choose(CONFIG, every, ["dgx02", "dgx06", "dgx07", "dgx99"])
    assert (chosen, skipped) == (["dgx02", "dgx06", "dgx07"], {"dgx99": "not a Slurm node"})


def test_a_job_is_submitted_in_the_validation_qos_to_its_node(monkeypatch: pytest.MonkeyPatch):
    cv = validate_module()
    ran: list[tuple[str, ...]] = []
    monkeypatch.setattr(cv, "run", lambda *argv: ran.append(argv) or "41;labtest\n")
    assert cv.submit(CONFIG, "dgx01", cv.fields(node_line("dgx01"))) == "41"
    [argv] = ran
    assert argv[:3] == ("sbatch", "--parsable", "--no-requeue")  # a validation job is never restarted elsewhere
    assert {"--qos=validation", "--nodelist=dgx01", "--exclusive", "--gres=gpu:8", "--time=30"} <= set(argv)
    assert "--partition=batch" in argv and "--job-name=corectl-validation" in argv
    wrapped = argv[argv.index("--wrap") + 1]
    assert wrapped == (
        "/usr/local/sbin/corectl-health-check --only dcgm-diag,nccl --level 2 --drain-as 'corectl validation'"
    )
    # a job preempted by a user's job: no failure, the node untouched
    assert cv.result("dgx01", "41", "PREEMPTED", cv.fields(node_line("dgx01")))["result"] == "preempted"


def test_validate_nodes_needs_health_validation(prod_copy: Path):
    from corectl.cli import app

    text = (prod_copy / "cluster.yml").read_text()
    (prod_copy / "cluster.yml").write_text(text.replace("  validation: {", "  # validation: {"))
    result = CliRunner().invoke(app, ["validate-nodes", "--inventory", str(prod_copy)])
    assert result.exit_code == 2, result.output
    assert "cluster.yml: health.validation is not set" in result.output
    assert "Traceback" not in result.output


BATCH = {"batch"}


def pair_round(cv: ModuleType, nodes: list[str], slow: set[str]) -> tuple[list[list[tuple[str, str]]], dict]:
    """The pairwise round against nodes of which ``slow`` are slow (a pair passes when neither is): the pairs of
    each round, and each node's verdict."""
    tested: dict[tuple[str, str], bool | None] = {}
    notes = {}
    rounds = []
    partitions = {n: BATCH for n in nodes}
    for _ in range(cv.PAIR_ROUNDS):
        pairs = cv.next_pairs(nodes, tested, partitions)
        if not pairs:
            break
        rounds.append(pairs)
        for pair in pairs:
            tested[pair] = not (set(pair) & slow)
            notes[pair] = "nccl-pair: fast" if tested[pair] else "nccl-pair: slow"
    return rounds, {n: (v["result"], v["message"]) for n, v in cv.pair_verdicts(nodes, tested, notes).items()}


def test_the_pairwise_round_finds_the_slow_node_of_three():
    cv = validate_module()
    rounds, verdicts = pair_round(cv, ["dgx01", "dgx02", "dgx03"], {"dgx03"})
    assert rounds == [[("dgx01", "dgx02")], [("dgx03", "dgx01")]]  # then dgx03 with a node known good
    assert verdicts == {
        "dgx01": ("pass", "nccl-pair: fast (with dgx02)"),
        "dgx02": ("pass", "nccl-pair: fast (with dgx01)"),
        "dgx03": ("fail", "nccl-pair: slow (with dgx01)"),
    }


def test_the_pairwise_round_splits_bad_pairs_with_good_nodes():
    cv = validate_module()
    nodes = [f"dgx{i:02d}" for i in range(1, 7)]
    rounds, verdicts = pair_round(cv, nodes, {"dgx02", "dgx06"})
    assert rounds[0] == [("dgx01", "dgx02"), ("dgx03", "dgx04"), ("dgx05", "dgx06")]
    # then each node of a failed pair with a node known good, one pair per node and round
    assert rounds[1:] == [[("dgx01", "dgx03"), ("dgx02", "dgx04")], [("dgx05", "dgx01"), ("dgx06", "dgx03")]]
    assert {n: v[0] for n, v in verdicts.items()} == {
        "dgx01": "pass", "dgx02": "fail", "dgx03": "pass", "dgx04": "pass", "dgx05": "pass", "dgx06": "fail",
    }  # fmt: skip
    # two nodes that fail only with each other: neither is known bad, neither is drained
    rounds, verdicts = pair_round(cv, ["dgx01", "dgx02"], {"dgx02"})
    assert rounds == [[("dgx01", "dgx02")]]
    assert verdicts == {
        "dgx01": ("suspect", "failed only with dgx02: cannot tell which"),
        "dgx02": ("suspect", "failed only with dgx01: cannot tell which"),
    }


def test_pairs_share_a_partition_and_a_node_in_no_pair_is_untested():
    cv = validate_module()
    partitions = {"dgx01": {"batch"}, "dgx02": {"batch"}, "dgx03": {"debug"}}
    assert cv.next_pairs(["dgx01", "dgx02", "dgx03"], {}, partitions) == [("dgx01", "dgx02")]
    tested = {("dgx01", "dgx02"): True}
    assert cv.next_pairs(["dgx01", "dgx02", "dgx03"], tested, partitions) == []
    assert cv.pair_verdicts(["dgx03"], tested, {})["dgx03"]["result"] == "untested"
