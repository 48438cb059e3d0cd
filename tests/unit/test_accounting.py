"""cluster.yml's fair share, QOS, accounts and users' accounts: each broken variant is refused
with file:line and its own message; the render hands the role the account tree (parents first),
the QOS, the priority weights and each partition's billing weights."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corectl.cli import app
from corectl.site.loader import load_cluster
from corectl.site.render import slurm_vars

runner = CliRunner()
ERROR_LINE = re.compile(r"^(?P<file>\S+cluster\.yml):(?P<line>\d+): (?P<path>\S+): (?P<message>.+)$")

# inserted into inventories/prod/cluster.yml's slurm section, after the partitions
ACCOUNTING = """\
  priority:
    fairshare: 10000
    qos: 5000
  qos:
    - name: high
      description: jobs that preempt
      priority: 100
      preempt: [low]
      max_tres_per_user: {gres/gpu: 16}
    - name: low
      max_wall: 2-00:00:00
  accounts:
    - name: research
      fairshare: 10
      qos: [normal, high, low]
      default_qos: normal
    - name: vision
      parent: research
      fairshare: 5
      grp_tres: {gres/gpu: 32}
      max_tres_per_user: {gres/gpu: 8}
    - name: nlp
      parent: research
      fairshare: 5
"""
ANCHOR = '      max_time: "08:00:00"\n      max_nodes: 1\n'
USER_ANCHOR = "    groups: [research]\n    admin: true\n"


def _site(prod_copy: Path, user_accounts: str = "    slurm_accounts: [hpcadmin, vision]\n") -> Path:
    path = prod_copy / "cluster.yml"
    text = path.read_text()
    assert text.count(ANCHOR) == 1 and text.count(USER_ANCHOR) == 1
    text = text.replace(ANCHOR, ANCHOR + ACCOUNTING).replace(USER_ANCHOR, USER_ANCHOR + user_accounts)
    path.write_text(text)
    return prod_copy


# (text in the accounting site to replace, replacement, field path, words of the message)
VARIANTS = [
    (
        "      default_qos: normal\n",
        "      default_qos: urgent\n",
        "slurm.accounts[0].default_qos",
        "unknown QOS 'urgent'",
    ),
    (
        "      qos: [normal, high, low]\n",
        "      qos: [normal, high, lowest]\n",
        "slurm.accounts[0].qos[2]",
        "unknown QOS",
    ),
    (
        "      qos: [normal, high, low]\n      default_qos: normal\n",
        "      qos: [high, low]\n      default_qos: normal\n",
        "slurm.accounts[0].default_qos",
        "'normal' is not in its qos list (high, low)",
        "      default_qos: normal",
    ),
    (
        "    - name: nlp\n      parent: research\n",
        "    - name: nlp\n      parent: reserch\n",
        "slurm.accounts[2].parent",
        "unknown account 'reserch'",
    ),
    (
        "    - name: research\n      fairshare: 10\n",
        "    - name: research\n      parent: nlp\n      fairshare: 10\n",
        "slurm.accounts[0].parent",
        "accounts form a cycle (research -> nlp -> research)",
    ),
    ("    - name: nlp\n", "    - name: vision\n", "slurm.accounts[2].name", "duplicate account name 'vision'"),
    ("    - name: low\n", "    - name: high\n", "slurm.qos[1].name", "duplicate QOS name 'high'"),
    ("      fairshare: 10\n", "      fairshare: -3\n", "slurm.accounts[0].fairshare", "a negative share is refused"),
    ("      fairshare: 10\n", "      fairshare: 0\n", "slurm.accounts[0].fairshare", "a share of 0 is refused"),
    (
        "      grp_tres: {gres/gpu: 32}\n",
        "      grp_tres: {gres/gpu: 128}\n",
        "slurm.accounts[1].grp_tres.gres/gpu",
        "128 GPUs is more than the cluster has (96 on compute nodes)",
    ),
    (
        "      max_tres_per_user: {gres/gpu: 16}\n",
        "      max_tres_per_user: {gres/gpu: 97}\n",
        "slurm.qos[0].max_tres_per_user.gres/gpu",
        "97 GPUs is more than the cluster has",
    ),
    (
        "      grp_tres: {gres/gpu: 32}\n",
        "      grp_tres: {gres/gpu: 32, gres/tpu: 2}\n",
        "slurm.accounts[1].grp_tres.gres/tpu",
        "unknown TRES 'gres/tpu' (known: billing, cpu, gres/gpu, mem, node)",
    ),
    (
        "      preempt: [low]\n",
        "      preempt: [high]\n",
        "slurm.qos[0].preempt[0]",
        "QOS 'high' cannot preempt itself",
    ),
    ("      preempt: [low]\n", "      preempt: [lo]\n", "slurm.qos[0].preempt[0]", "unknown QOS 'lo'"),
    (
        "    slurm_accounts: [hpcadmin, vision]\n",
        "    slurm_accounts: [hpcadmin, visoin]\n",
        "users[2].slurm_accounts[1]",
        "unknown account 'visoin'",
    ),
    (
        "      preempt: [low]\n",
        "      preempt: [low]\n      preempt_mode: off\n",
        "slurm.qos[0].preempt_mode",
        "requeue",
    ),
    ("      max_wall: 2-00:00:00\n", "      max_wall: two days\n", "slurm.qos[1].max_wall", "pattern"),
    ("    - name: research\n", "    - name: root\n", "slurm.accounts[0].name", "'root' is Slurm's own account"),
    ("  accounting: true\n", "  accounting: false\n", "slurm.qos", "need accounting"),
]


def _replace(site: Path, old: str, new: str) -> int:
    path = site / "cluster.yml"
    text = path.read_text()
    assert text.count(old) == 1, f"fixture text not found once: {old!r}"
    index = text.index(old)
    path.write_text(text[:index] + new + text[index + len(old) :])
    differ = next(i for i, (a, b) in enumerate(zip(old + "\0", new + "\0", strict=False)) if a != b)
    return text[: index + differ].count("\n") + 1


def test_declared_accounting_is_valid(prod_copy: Path):
    result = runner.invoke(app, ["validate", "--inventory", str(_site(prod_copy))])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("variant", VARIANTS, ids=[v[2] + ":" + v[3][:24] for v in VARIANTS])
def test_broken_accounting_fails_with_file_line(prod_copy: Path, variant: tuple[str, ...]):
    old, new, path, words = variant[:4]
    site = _site(prod_copy)
    line = _replace(site, old, new)
    if len(variant) > 4:  # the error is on another line than the first one changed
        text = (site / "cluster.yml").read_text()
        line = text[: text.index(variant[4])].count("\n") + 1
    result = runner.invoke(app, ["validate", "--inventory", str(site)])
    assert result.exit_code == 2, result.output
    parsed = [ERROR_LINE.match(text) for text in result.stderr.splitlines()]
    assert all(parsed), result.stderr
    ours = [m for m in parsed if m and m["path"] == path]
    assert ours, f"no error for {path}: {result.stderr}"
    assert any(words in m["message"] for m in ours), result.stderr
    if path != "slurm.qos":  # the section, not the replaced line
        assert int(ours[0]["line"]) == line, result.stderr
    assert "Traceback" not in result.output


def test_without_declarations_the_associations_are_todays(root: Path):
    """No slurm.accounts/qos: each group is an account under root with one share, each user is in
    its group and then its other groups, the group the default (as corectl always made them)."""
    data = slurm_vars(load_cluster(root / "inventories" / "prod"))
    assert [(a["name"], a["parent"], a["fairshare"], a["qos"], a["grp_tres"]) for a in data["accounts"]] == [
        ("research", "root", 1, [], {}),
        ("hpcadmin", "root", 1, [], {}),
    ]
    assert [(u["name"], u["default_account"], u["accounts"]) for u in data["users"]] == [
        ("alice", "research", ["research"]),
        ("bob", "research", ["research"]),
        ("carol", "hpcadmin", ["hpcadmin", "research"]),
    ]
    # no QOS declared: only health.validation's, and normal preempting it
    assert [(q["name"], q["preempt"], q["preempt_mode"]) for q in data["qos"]] == [
        ("normal", ["validation"], None),
        ("validation", [], "cancel"),
    ]
    assert data["priority"] == {
        "fairshare": 10000,
        "age": 1000,
        "job_size": 0,
        "partition": 0,
        "qos": 5000,
        "decay_half_life": "7-0",
        "max_age": "7-0",
    }


def test_accounts_render_parents_first_with_implicit_group_accounts(prod_copy: Path):
    path = _site(prod_copy) / "cluster.yml"
    # declared children before their parent still render parent first
    text = path.read_text().replace(
        "    - name: research\n      fairshare: 10\n", "    - name: tmp\n      fairshare: 1\n"
    )
    text = text.replace(
        "      fairshare: 5\n    - name: nlp\n",
        "      fairshare: 5\n    - name: research\n      fairshare: 10\n"
        "      qos: [normal, high, low]\n    - name: nlp\n",
    )
    text = text.replace("      qos: [normal, high, low]\n      default_qos: normal\n", "", 1)
    path.write_text(text)
    data = slurm_vars(load_cluster(prod_copy))
    order = [(a["name"], a["parent"]) for a in data["accounts"]]
    assert order == [
        ("tmp", "root"),
        ("research", "root"),
        ("vision", "research"),
        ("nlp", "research"),
        ("hpcadmin", "root"),
    ]
    vision = next(a for a in data["accounts"] if a["name"] == "vision")
    assert vision["grp_tres"] == {"gres/gpu": 32} and vision["max_tres_per_user"] == {"gres/gpu": 8}
    assert vision["description"] == "vision"  # sacctmgr's default, as before
    carol = next(u for u in data["users"] if u["name"] == "carol")
    assert (carol["default_account"], carol["accounts"]) == ("hpcadmin", ["hpcadmin", "vision"])
    # the declared QOS, with normal and the validation QOS every QOS preempts (health.validation)
    assert [q["name"] for q in data["qos"]] == ["normal", "high", "low", "validation"]
    assert data["qos"][1]["preempt"] == ["low", "validation"]


def test_billing_weights_default_from_the_gpu_profile_and_declared(prod_copy: Path):
    data = slurm_vars(load_cluster(prod_copy))
    # DGX H100: 224 CPUs, 8 GPUs, 2,000,000 MiB (1953.125 GiB)
    assert [p["billing_weights"] for p in data["partitions"]] == ["CPU=1,Mem=0.1147G,GRES/gpu=28"] * 2
    _replace(prod_copy, ANCHOR, ANCHOR + "      billing_weights: {cpu: 0.5, gres/gpu: 10}\n")
    _replace(prod_copy, "      max_time: 2-00:00:00\n", "      max_time: 2-00:00:00\n      billing_weights: {}\n")
    data = slurm_vars(load_cluster(prod_copy))
    assert [p["billing_weights"] for p in data["partitions"]] == ["", "CPU=0.5,GRES/gpu=10"]


def test_unknown_billing_tres_is_refused(prod_copy: Path):
    _replace(prod_copy, ANCHOR, ANCHOR + "      billing_weights: {billing: 1}\n")
    result = runner.invoke(app, ["validate", "--inventory", str(prod_copy)])
    assert result.exit_code == 2
    assert "slurm.partitions[1].billing_weights.billing: unknown TRES" in result.stderr


def test_every_qos_preempts_the_validation_qos_and_without_validation_nothing_is_added(root: Path):
    """health.validation adds its QOS (no priority, cancelled when preempted) and puts it in the preempt list of
    every other QOS, normal included (declared or not); without it the QOS are exactly those declared."""
    from corectl.site.model_services import Validation
    from corectl.site.model_slurm import Qos
    from corectl.site.render import qos_list

    config = load_cluster(root / "inventories" / "prod").config
    declared = [Qos(name="high", priority=100, preempt=["low"]), Qos(name="low")]
    with_validation = config.model_copy(
        update={
            "slurm": config.slurm.model_copy(update={"qos": declared}),
            "health": config.health.model_copy(update={"validation": Validation(qos="idle-check")}),
        }
    )
    assert [(q["name"], q["preempt"], q["preempt_mode"]) for q in qos_list(with_validation)] == [
        ("normal", ["idle-check"], None),
        ("high", ["low", "idle-check"], None),
        ("low", ["idle-check"], None),
        ("idle-check", [], "cancel"),
    ]
    without = with_validation.model_copy(update={"health": config.health.model_copy(update={"validation": None})})
    assert [q["name"] for q in qos_list(without)] == ["high", "low"]
