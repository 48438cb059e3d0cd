"""One Slurm release per cluster (issue 28): the corectl.fleet.slurm_version_problems filter that
playbooks/slurm-versions.yml runs before anything changes, on apt-cache policy answers as Debian 12
and 13 give them (22.05.8 and 24.11.5)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from conftest import ROOT
from corectl.commands.upgrade import SlurmPlan

sys.path.insert(0, str(ROOT / "collections"))  # the filter's import of the systemd filter, as Ansible ships them
PLUGIN = ROOT / "collections/ansible_collections/corectl/fleet/plugins/filter/slurm_versions.py"
spec = importlib.util.spec_from_file_location("corectl_slurm_versions", PLUGIN)
assert spec is not None and spec.loader is not None
sv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sv)

BOOKWORM = "22.05.8-4+deb12u3"
TRIXIE = "24.11.5-2"


def policy(**packages: tuple[str, str]) -> str:
    """apt-cache policy's answer for each package: (installed, candidate), "(none)" for none."""
    return "".join(
        f"{name.replace('_', '-')}:\n  Installed: {installed}\n  Candidate: {candidate}\n"
        "  Version table:\n     *** 1 500\n        500 http://deb.debian.org/debian main amd64 Packages\n"
        for name, (installed, candidate) in packages.items()
    )


HEAD = policy(slurmctld=(BOOKWORM, BOOKWORM), slurmdbd=(BOOKWORM, BOOKWORM), slurmd=("(none)", BOOKWORM))


def read(host: str, daemons: list[str], answer: str) -> dict:
    return {"host": host, "daemons": daemons, "policy": answer}


def test_debians_versions_read_as_slurms():
    assert sv.policy_version(BOOKWORM) == "22.05.8"
    assert sv.policy_version("1:24.11.5-2~bpo12+1") == "24.11.5"
    assert sv.policy_version("(none)") == ""
    assert sv.policy_versions(HEAD)["slurmd"] == ("", "22.05.8")
    assert sv.policy_versions(HEAD.replace("\n", "\r\n")) == sv.policy_versions(HEAD)  # raw over a tty


def test_a_cluster_of_one_release_passes_also_a_new_node_of_it():
    reads = [
        read("head01", ["slurmctld", "slurmdbd"], HEAD),
        read("dgx01", ["slurmd"], policy(slurmd=(BOOKWORM, BOOKWORM))),
        read("dgx02", ["slurmd"], policy(slurmd=("(none)", BOOKWORM))),
    ]
    assert sv.slurm_version_problems(reads, "head01", HEAD) == []


def test_a_new_debian_13_node_beside_a_debian_12_head_is_refused_naming_both_versions():
    reads = [read("dgx03", ["slurmd"], policy(slurmd=("(none)", TRIXIE)))]
    assert sv.slurm_version_problems(reads, "head01", HEAD) == [
        "dgx03 would install slurmd 24.11.5, but head01 runs slurmctld 22.05.8: one Slurm release per cluster "
        "(SchedMD: upgrade slurmdbd, then slurmctld, then slurmd, at most 2 releases apart)"
    ]


def test_a_new_node_of_an_older_release_is_refused_too():
    head = policy(slurmctld=(TRIXIE, TRIXIE))
    reads = [read("dgx03", ["slurmd"], policy(slurmd=("(none)", BOOKWORM)))]
    (problem,) = sv.slurm_version_problems(reads, "head01", head)
    assert problem.startswith("dgx03 would install slurmd 22.05.8, but head01 runs slurmctld 24.11.5")
    assert "at most 3 releases apart" in problem  # from 24.11 on


@pytest.mark.parametrize(
    ("daemon", "version", "words"),
    [
        ("slurmd", "24.05.4-1", "dgx01 runs slurmd 24.05.4, newer than slurmctld 23.11.10 on head01"),
        ("slurm-client", "24.05.4-1", "login01 runs slurm-client 24.05.4, newer than slurmctld 23.11.10 on head01"),
        ("slurmdbd", "23.02.7-1", "head02 runs slurmdbd 23.02.7, older than slurmctld 23.11.10 on head01"),
        ("slurmd", "21.08.5-2", "dgx01 runs slurmd 21.08.5, too far behind slurmctld 23.11.10 on head01"),
        ("slurmctld", "23.02.7-1", "head02 runs slurmctld 23.02.7, but head01 runs slurmctld 23.11.10"),
    ],
)
def test_schedmds_order_and_the_releases_a_daemon_may_be_apart(daemon: str, version: str, words: str):
    head = policy(slurmctld=("23.11.10-1", "23.11.10-1"))
    host = {"slurmd": "dgx01", "slurm-client": "login01"}.get(daemon, "head02")
    (problem,) = sv.slurm_version_problems(
        [read(host, [daemon], policy(**{daemon: (version, version)}))], "head01", head
    )
    assert problem.startswith(words), problem


def test_a_running_node_one_or_two_releases_behind_is_an_upgrade_under_way_and_passes():
    head = policy(slurmctld=("23.11.10-1", "23.11.10-1"))
    reads = [
        read("dgx01", ["slurmd"], policy(slurmd=("23.02.7-1", "23.02.7-1"))),
        read("dgx02", ["slurmd"], policy(slurmd=("22.05.8-4", "23.02.7-1"))),  # 22.05 -> 23.11: 2 apart
        read("head02", ["slurmdbd"], policy(slurmdbd=("24.05.4-1", "24.05.4-1"))),  # the database first
    ]
    assert sv.slurm_version_problems(reads, "head01", head) == []


def test_the_skip_rule_counts_releases_not_years():
    assert sv.releases_apart("22.05.8", "23.11.1") == 2  # 22.05, 23.02, 23.11
    assert sv.releases_apart("23.11.1", "24.11.5") == 2
    assert sv.releases_apart("24.11.5", "26.05.1") == 3  # after the table: every six months
    assert sv.may_skip("24.05.1") == 2 and sv.may_skip("24.11.0") == 3


def test_nothing_installed_nor_offered_is_said():
    nothing = policy(slurmctld=("(none)", "(none)"))
    assert sv.slurm_version_problems([], "head01", nothing) == [
        "head01: no slurmctld installed and none offered by its repositories"
    ]
    (problem,) = sv.slurm_version_problems([read("dgx01", ["slurmd"], "")], "head01", HEAD)
    assert problem.startswith("dgx01: no slurmd installed and none offered by its repositories")


# corectl upgrade slurm (issue 48): the plan the playbook follows, and what stops it before anything changes
POINT = "22.05.9-1corectl1"  # tests/standin's point release


def offered(installed: str, candidate: str, *daemons: str) -> str:
    return policy(**{daemon: (installed, candidate) for daemon in daemons})


def test_a_point_release_upgrades_every_daemon_that_is_older():
    reads = [
        read("head01", ["slurmctld", "slurmdbd"], offered(BOOKWORM, POINT, "slurmctld", "slurmdbd")),
        read("dgx01", ["slurmd"], offered(BOOKWORM, POINT, "slurmd")),
        read("dgx02", ["slurmd"], offered(POINT, POINT, "slurmd")),  # done by an interrupted run
    ]
    assert sv.slurm_upgrade_plan(reads, "head01") == {
        "target": POINT,
        "version": "22.05.9",
        "problems": [],
        "hosts": {
            "head01": {"slurmctld": [BOOKWORM, POINT], "slurmdbd": [BOOKWORM, POINT]},
            "dgx01": {"slurmd": [BOOKWORM, POINT]},
        },
    }
    done = [read(r["host"], r["daemons"], r["policy"].replace(f"Installed: {BOOKWORM}", f"Installed: {POINT}"))
            for r in reads]  # fmt: skip
    assert sv.slurm_upgrade_plan(done, "head01") == {"target": POINT, "version": "22.05.9", "problems": [], "hosts": {}}


def test_a_debian_security_fix_of_the_same_release_is_an_upgrade():
    fixed = "22.05.8-4+deb12u4"
    reads = [read("head01", ["slurmctld"], offered(BOOKWORM, fixed, "slurmctld"))]
    assert sv.slurm_upgrade_plan(reads, "head01")["hosts"] == {"head01": {"slurmctld": [BOOKWORM, fixed]}}


def test_a_jump_past_schedmds_rule_is_refused_with_the_rule_and_the_release_to_go_through():
    reads = [
        read("head01", ["slurmctld", "slurmdbd"], offered(BOOKWORM, TRIXIE, "slurmctld", "slurmdbd")),
        read("dgx01", ["slurmd"], offered(BOOKWORM, TRIXIE, "slurmd")),
    ]
    plan = sv.slurm_upgrade_plan(reads, "head01")
    assert plan["hosts"] == {} and len(plan["problems"]) == 3
    assert plan["problems"][0] == (
        "head01 runs slurmctld 22.05.8: 24.11.5 is 4 major releases ahead, and SchedMD allows at most 3 in one step "
        "(slurmdbd, then slurmctld, then slurmd; their saved state and database are converted once); "
        "upgrade to 24.05 first"
    )
    two = [read("head01", ["slurmctld"], offered("23.02.7-1", "23.11.10-1", "slurmctld"))]
    assert sv.slurm_upgrade_plan(two, "head01")["problems"] == []  # one release: allowed
    three = [read("head01", ["slurmctld"], offered("22.05.8-1", "23.11.10-1", "slurmctld"))]
    assert sv.slurm_upgrade_plan(three, "head01")["problems"] == []  # two releases before 24.11: allowed
    four = [read("head01", ["slurmctld"], offered("22.05.8-1", "24.05.4-1", "slurmctld"))]
    assert "at most 2 in one step" in sv.slurm_upgrade_plan(four, "head01")["problems"][0]


def test_a_node_offered_another_release_or_older_than_installed_stops_the_upgrade():
    reads = [
        read("head01", ["slurmctld"], offered(BOOKWORM, POINT, "slurmctld")),
        read("dgx01", ["slurmd"], offered(BOOKWORM, BOOKWORM, "slurmd")),  # its sources lack the new repository
        read("dgx02", ["slurmd"], offered("(none)", POINT, "slurmd")),
    ]
    assert sv.slurm_upgrade_plan(reads, "head01")["problems"] == [
        f"dgx01's repositories offer slurmd {BOOKWORM}, head01's slurmctld {POINT}: every Slurm host must be "
        "offered the same release",
        "dgx02: no slurmd installed (corectl provision installs it)",
    ]
    back = [read("head01", ["slurmctld"], "slurmctld:\n  Installed: 22.05.9-1\n  Candidate: 22.05.8-4\n")]
    assert sv.slurm_upgrade_plan(back, "head01")["problems"] == [
        "head01 runs slurmctld 22.05.9, newer than 22.05.8: an upgrade never goes back"
    ]
    assert sv.slurm_upgrade_plan([], "head01")["problems"] == ["head01: its repositories offer no slurmctld"]


def test_the_plan_says_in_one_line_what_goes_where_in_schedmds_order():
    hosts = {
        "dgx02": {"slurmd": [BOOKWORM, POINT]},
        "head01": {"slurmctld": [BOOKWORM, POINT], "slurmdbd": [BOOKWORM, POINT]},
        "dgx01": {"slurmd": [BOOKWORM, POINT]},
    }
    assert SlurmPlan(POINT, hosts).line() == (
        f"{BOOKWORM} -> {POINT}: slurmdbd on head01, slurmctld on head01, slurmd on dgx[01-02]"
    )


def test_a_daemon_installed_but_not_restarted_by_an_interrupted_run_is_still_to_upgrade():
    units = (
        "ExecMainStartTimestamp=@1796280073\nId=slurmctld.service\nActiveState=active\n\n"
        "ExecMainStartTimestamp=\nId=slurmd.service\nActiveState=inactive\n\n"
        "ExecMainStartTimestamp=@1796280539\nId=slurmdbd.service\nActiveState=active\n"
    )
    executables = "/usr/sbin/slurmdbd 1796280338\n/usr/sbin/slurmctld 1796280338\n"
    assert sv.stale_daemons(units, executables) == ["slurmctld"]  # slurmdbd restarted since; slurmd not running
    assert sv.active_daemons(units) == ["slurmctld", "slurmdbd"]
    reads = [read("head01", ["slurmctld", "slurmdbd"], offered(POINT, POINT, "slurmctld", "slurmdbd"))]
    reads[0]["stale"] = ["slurmctld"]
    plan = sv.slurm_upgrade_plan(reads, "head01")
    assert plan["hosts"] == {"head01": {"slurmctld": [POINT, POINT]}}
    assert SlurmPlan(POINT, plan["hosts"]).line() == f"restart -> {POINT}: slurmctld on head01"
