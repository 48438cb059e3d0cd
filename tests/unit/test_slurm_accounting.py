"""corectl.fleet.slurm_accounting's pure logic: reading sacctmgr's and squeue's output (module_utils/sacctmgr.py), the
difference between what is there and what cluster.yml declares, the commands it becomes, what is
kept while it has jobs; and a second run after applying the first finds nothing to do."""

from __future__ import annotations

import importlib.util
import io
import json
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "collections"))  # the module's own module_utils, as Ansible ships them with it
from ansible_collections.corectl.fleet.plugins.module_utils import sacctmgr as acct

MODULE = ROOT / "collections/ansible_collections/corectl/fleet/plugins/modules/slurm_accounting.py"
spec = importlib.util.spec_from_file_location("corectl_slurm_accounting", MODULE)
assert spec is not None and spec.loader is not None
sa = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = sa  # dataclasses look their module up
spec.loader.exec_module(sa)

CLUSTER = "lab"
# a fresh accounting database: sacctmgr add cluster made root (qos normal) and user root
FRESH = {
    "qos": "normal|0||cluster||||normal qos definition\n",
    "assoc": "root||||1|||normal|\nroot|root|||1||||\n",
    "user": "root|root|Administrator\n",
    "account": "root|default root account\n",
}

QOS = [
    {"name": "high", "priority": 100, "preempt": ["low"], "max_tres_per_user": {"gres/gpu": 8}},
    {"name": "low", "description": "Scavenger jobs", "max_wall": "2-00:00:00"},
]
ACCOUNTS = [
    {"name": "research", "parent": "root", "fairshare": 10, "qos": ["normal", "high", "low"]},
    {"name": "vision", "parent": "research", "fairshare": 5, "grp_tres": {"gres/gpu": 4}},
    {"name": "hpcadmin", "parent": "root", "fairshare": 1, "description": "hpcadmin"},
]
USERS = [
    {"name": "alice", "default_account": "research", "accounts": ["research"], "admin": False, "state": "present"},
    {"name": "carol", "default_account": "hpcadmin", "accounts": ["hpcadmin", "vision"], "admin": True},
    {"name": "mallory", "default_account": "research", "accounts": ["research"], "state": "absent"},
]


def fresh() -> acct.State:
    return acct.parse_state(FRESH["qos"], FRESH["assoc"], FRESH["user"], FRESH["account"])


def wanted(qos: list | None = None, accounts: list | None = None, users: list | None = None) -> acct.State:
    return acct.wanted_state(QOS if qos is None else qos, ACCOUNTS if accounts is None else accounts,
                           USERS if users is None else users)  # fmt: skip


def texts(changes: list) -> list[str]:
    return [c.text for c in changes]


# ---------------------------------------------------------------- a stand-in for sacctmgr


def _options(words: list[str]) -> dict[str, str]:
    return dict(w.split("=", 1) for w in words)


def _set_tres(limits: dict, value: str) -> None:
    for item in value.split(","):
        name, count = item.split("=")
        if count == "-1":
            limits.pop(name, None)
        else:
            limits[name] = int(count)


def _apply_common(record: object, options: dict[str, str]) -> None:
    for key, value in options.items():
        if key == "description":
            record.description = value.lower()
        elif key == "priority":
            record.priority = int(value)
        elif key == "preemptmode":
            record.preempt_mode = "cluster" if value in ("off", "cluster") else value
        elif key == "preempt":
            record.preempt = frozenset(filter(None, value.split(",")))
        elif key in ("grptres", "maxtrespu"):
            _set_tres(record.grp_tres if key == "grptres" else record.max_tres_per_user, value)
        elif key == "maxwall":
            record.max_wall = None if value == "-1" else acct.parse_wall(value)
        elif key == "qos":
            record.qos = frozenset(filter(None, value.split(",")))
        elif key == "defaultqos":
            record.default_qos = "" if value == "-1" else value
        elif key == "fairshare":
            record.fairshare = int(value)
        elif key == "parent":
            record.parent = value
        elif key in ("organization", "cluster"):
            pass
        else:
            raise AssertionError(f"option the stand-in does not know: {key}")


def sacctmgr(state: acct.State, argv: list[str]) -> None:
    """What sacctmgr --immediate does to the database, as far as the module's commands go."""
    assert argv[:2] == ["sacctmgr", "--immediate"], argv
    verb, kind, rest = argv[2], argv[3], argv[4:]
    if verb == "add":
        name, options = rest[0], _options(rest[1:])
        if kind == "qos":
            assert name not in state.qos
            state.qos[name] = record = acct.Qos(name=name, description=name)
            _apply_common(record, options)
        elif kind == "account":
            assert options["cluster"] == CLUSTER and name not in state.accounts
            assert options.get("parent", "root") == "root" or options["parent"] in state.accounts, "parent first"
            state.accounts[name] = record = acct.Account(name=name)
            _apply_common(record, options)
        else:
            account = options.pop("account")
            assert account in state.accounts, f"user {name} added to missing account {account}"
            user = state.users.get(name)
            if user is None:
                user = state.users[name] = acct.User(name=name, default_account=options["defaultaccount"])
                user.admin_level = options.get("adminlevel", "None")
            assoc = user.assocs[account] = acct.Assoc()
            if "grptres" in options:
                _set_tres(assoc.grp_tres, options["grptres"])
        return
    assert rest[0] == "where", argv
    split = rest.index("set") if "set" in rest else len(rest)
    where, options = _options(rest[1:split]), _options(rest[split + 1 :])
    name = where["name"]
    if verb == "modify" and kind == "qos":
        missing = set(filter(None, options.get("preempt", "").split(","))) - set(state.qos)
        assert not missing, f"sacctmgr: error: You gave a bad qos '{','.join(sorted(missing))}'"
        _apply_common(state.qos[name], options)
    elif verb == "modify" and kind == "account":
        _apply_common(state.accounts[name], options)
    elif verb == "modify":
        user = state.users[name]
        if "defaultaccount" in options:
            assert options["defaultaccount"] in user.assocs, "default account before its association"
            user.default_account = options.pop("defaultaccount")
        if "adminlevel" in options:
            user.admin_level = options.pop("adminlevel")
        if options:
            _set_tres(user.assocs[where["account"]].grp_tres, options.pop("grptres"))
        assert not options
    elif kind == "qos":
        del state.qos[name]
    elif kind == "account":
        assert not any(a.parent == name for a in state.accounts.values()), "children first"
        assert not any(name in u.assocs for u in state.users.values()), "users first"
        del state.accounts[name]
    elif "account" in where:
        user = state.users[name]
        assert user.default_account != where["account"], "a user's default association goes last"
        del user.assocs[where["account"]]
    else:
        state.users[name].assocs.clear()


def converge(current: acct.State, want: acct.State, jobs: acct.Jobs | None = None) -> tuple[list, list]:
    changes, kept = sa.plan(CLUSTER, current, want, acct.Jobs() if jobs is None else jobs)
    for change in changes:
        sacctmgr(current, change.argv)
    return changes, kept


# ---------------------------------------------------------------- reading


def test_tres_strings_as_sacctmgr_prints_them():
    assert acct.parse_tres("cpu=4,mem=1G,gres/gpu=8") == {"cpu": 4, "mem": 1024, "gres/gpu": 8}
    assert acct.parse_tres("mem=500M,node=2,billing=100") == {"mem": 500, "node": 2, "billing": 100}
    assert acct.parse_tres("mem=1.5T") == {"mem": 1572864}
    assert acct.parse_tres("") == {}
    with pytest.raises(acct.Refused):
        acct.parse_tres("gres/gpu")


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("2-00:00:00", 2880),
        ("08:00:00", 480),
        ("7-0", 10080),
        ("1-12", 2160),
        ("1-00:30", 1470),
        ("30", 30),
        ("1:30", 2),  # minutes:seconds, rounded up as Slurm does
        ("", None),
        ("UNLIMITED", None),
        ("-1", None),
        (None, None),
    ],
)
def test_times_as_minutes(text, minutes):
    assert acct.parse_wall(text) == minutes


def test_state_from_sacctmgr_listings():
    state = acct.parse_state(
        "normal|0||cluster||||normal qos definition\nhigh|100|low,scavenger|requeue||gres/gpu=8|1-00:00:00|Has|pipe\n",
        "root||||1|||normal|\nroot|root|||1||||\nresearch|||root|10|gres/gpu=16||high,normal|normal\n"
        "vision|||research|5|cpu=64,gres/gpu=4|08:00:00||\nresearch|alice|||1|gres/gpu=2|||\n"
        "research|bob|gpu||1||||\n",
        "root|root|Administrator\nalice|research|None\ncarol||Operator\n",
        "research|research\nroot|default root account\nvision|vision\n",
    )
    assert state.qos["high"] == acct.Qos(
        name="high",
        description="Has|pipe",
        priority=100,
        preempt=frozenset({"low", "scavenger"}),
        preempt_mode="requeue",
        max_tres_per_user={"gres/gpu": 8},
        max_wall=1440,
    )
    assert "root" not in state.accounts
    assert state.accounts["research"] == acct.Account(
        name="research",
        parent="root",
        fairshare=10,
        description="research",
        qos=frozenset({"high", "normal"}),
        default_qos="normal",
        grp_tres={"gres/gpu": 16},
    )
    assert state.accounts["vision"].grp_tres == {"cpu": 64, "gres/gpu": 4}
    assert state.accounts["vision"].max_wall == 480
    assert state.users["alice"].assocs == {"research": acct.Assoc(grp_tres={"gres/gpu": 2})}
    assert "bob" not in state.users  # a partition's association is not corectl's
    assert state.users["carol"].admin_level == "Operator" and state.users["carol"].assocs == {}


def test_unreadable_listing_is_refused():
    with pytest.raises(acct.Refused, match="9 fields expected"):
        acct.parse_state("", "root|||1\n", "", "")


def test_jobs_from_squeue():
    jobs = acct.parse_jobs("research|alice|normal\nVision|carol|high\n\n")
    assert jobs.accounts == {"research", "vision"}
    assert jobs.assocs == {("research", "alice"), ("vision", "carol")}
    assert jobs.qos == {"normal", "high"}


# ---------------------------------------------------------------- the difference and its commands


def test_fresh_database_gets_the_declared_tree_in_order():
    changes, kept = sa.plan(CLUSTER, fresh(), wanted(), acct.Jobs())
    assert kept == []
    assert texts(changes) == [
        "qos high: add",
        "qos low: add",
        "qos high: preempt none -> low",
        "account research: add (parent root)",
        "account vision: add (parent research)",
        "account hpcadmin: add (parent root)",
        "user alice: add to account research",
        "user carol: add to account hpcadmin",
        "user carol: add to account vision",
    ]
    argv = {c.text: c.argv for c in changes}
    assert argv["qos high: add"] == [
        "sacctmgr", "--immediate", "add", "qos", "high", "description=high", "priority=100", "maxtrespu=gres/gpu=8",
    ]  # fmt: skip
    assert argv["qos high: preempt none -> low"][-3:] == ["name=high", "set", "preempt=low"]
    assert argv["qos low: add"][-2:] == ["description=scavenger jobs", "maxwall=2-00:00:00"]
    assert argv["account vision: add (parent research)"] == [
        "sacctmgr", "--immediate", "add", "account", "vision", "cluster=lab", "description=vision",
        "organization=lab", "parent=research", "fairshare=5", "grptres=gres/gpu=4",
    ]  # fmt: skip
    assert "qos=high,low,normal" in argv["account research: add (parent root)"]
    assert argv["user carol: add to account hpcadmin"] == [
        "sacctmgr", "--immediate", "add", "user", "carol", "account=hpcadmin", "cluster=lab",
        "defaultaccount=hpcadmin", "adminlevel=Administrator",
    ]  # fmt: skip


def test_second_run_after_the_first_changes_nothing():
    current = fresh()
    first, _ = converge(current, wanted())
    assert first
    again, kept = sa.plan(CLUSTER, current, wanted(), acct.Jobs())
    assert (again, kept) == ([], [])


def test_per_user_limits_are_each_users_grptres_inherited_by_sub_accounts():
    accounts = [
        {"name": "research", "max_tres_per_user": {"gres/gpu": 8, "cpu": 64}},
        {"name": "vision", "parent": "research", "max_tres_per_user": {"gres/gpu": 2}},
    ]
    users = [{"name": "alice", "default_account": "research", "accounts": ["research", "vision"]}]
    want = wanted(qos=[], accounts=accounts, users=users)
    assert want.users["alice"].assocs == {
        "research": acct.Assoc(grp_tres={"gres/gpu": 8, "cpu": 64}),
        "vision": acct.Assoc(grp_tres={"gres/gpu": 2, "cpu": 64}),
    }
    current = fresh()
    converge(current, want)
    assert current.users["alice"].assocs["vision"].grp_tres == {"gres/gpu": 2, "cpu": 64}
    # the per-user limit raised, one limit dropped
    accounts[1]["max_tres_per_user"] = {"gres/gpu": 4}
    accounts[0]["max_tres_per_user"] = {"gres/gpu": 8}
    changes, _ = converge(current, wanted(qos=[], accounts=accounts, users=users))
    assert texts(changes) == [
        "user alice: account research grp_tres cpu=64,gres/gpu=8 -> gres/gpu=8",
        "user alice: account vision grp_tres cpu=64,gres/gpu=2 -> gres/gpu=4",
    ]
    assert changes[0].argv[-1] == "grptres=cpu=-1"
    assert changes[1].argv[-1] == "grptres=cpu=-1,gres/gpu=4"


def test_changed_values_and_limits_removed_from_cluster_yml_are_reset():
    current = fresh()
    converge(current, wanted())
    qos = [{**QOS[0], "priority": 50, "preempt": [], "preempt_mode": "cancel", "max_tres_per_user": {}}, QOS[1]]
    accounts = [
        {**ACCOUNTS[0], "qos": [], "default_qos": None},
        {**ACCOUNTS[1], "fairshare": 8, "grp_tres": {"gres/gpu": 8}, "max_wall": "12:00:00"},
        ACCOUNTS[2],
    ]
    changes, _ = converge(current, wanted(qos=qos, accounts=accounts))
    assert texts(changes) == [
        "qos high: priority 100 -> 50; preempt_mode cluster -> cancel; preempt low -> none; "
        "max_tres_per_user gres/gpu=8 -> none",
        "account research: qos high,low,normal -> none",
        "account vision: fairshare 5 -> 8; grp_tres gres/gpu=4 -> gres/gpu=8; max_wall none -> 12:00:00",
    ]
    assert changes[0].argv[-4:] == ["priority=50", "preemptmode=cancel", "preempt=", "maxtrespu=gres/gpu=-1"]
    assert changes[1].argv[-1] == "qos="
    assert changes[2].argv[-3:] == ["fairshare=8", "grptres=gres/gpu=8", "maxwall=12:00:00"]
    # and back: the wall limit and the cap cleared
    accounts[1] = {**ACCOUNTS[1], "grp_tres": {}}
    changes, _ = converge(current, wanted(qos=qos, accounts=accounts))
    assert [c.argv[-3:] for c in changes if c.text.startswith("account vision")] == [
        ["fairshare=5", "grptres=gres/gpu=-1", "maxwall=-1"]
    ]


def test_default_qos_set_and_cleared():
    current = fresh()
    converge(current, wanted())
    accounts = [{**ACCOUNTS[0], "default_qos": "low"}, *ACCOUNTS[1:]]
    changes, _ = converge(current, wanted(accounts=accounts))
    assert [(c.text, c.argv[-1]) for c in changes] == [("account research: default_qos none -> low", "defaultqos=low")]
    changes, _ = converge(current, wanted())
    assert [c.argv[-1] for c in changes] == ["defaultqos=-1"]


def test_a_user_moved_to_another_default_account():
    current = fresh()
    converge(current, wanted())
    users = [{**USERS[0], "default_account": "vision", "accounts": ["vision"]}, *USERS[1:]]
    changes, _ = converge(current, wanted(users=users))
    assert texts(changes) == [
        "user alice: add to account vision",
        "user alice: default account research -> vision",
        "user alice: remove from account research",
    ]
    assert changes[2].argv == [
        "sacctmgr", "--immediate", "delete", "user", "where", "name=alice", "account=research", "cluster=lab",
    ]  # fmt: skip


def test_admin_level_follows_cluster_yml():
    current = fresh()
    converge(current, wanted())
    users = [USERS[0], {**USERS[1], "admin": False}]
    changes, _ = converge(current, wanted(users=users))
    assert [(c.text, c.argv[-1]) for c in changes] == [
        ("user carol: admin level Administrator -> None", "adminlevel=None")
    ]


def test_what_is_no_longer_declared_goes_children_first_and_root_and_normal_stay():
    current = fresh()
    converge(current, wanted())
    carol = {**USERS[1], "accounts": ["hpcadmin"]}
    changes, kept = converge(current, wanted(qos=[], accounts=[ACCOUNTS[2]], users=[carol]))
    assert kept == []
    assert texts(changes) == [
        "user alice: remove (accounts research)",
        "user carol: remove from account vision",
        "account vision: remove",
        "account research: remove",
        "qos high: remove",
        "qos low: remove",
    ]
    assert changes[0].argv == ["sacctmgr", "--immediate", "delete", "user", "where", "name=alice", "cluster=lab"]
    assert changes[2].argv == ["sacctmgr", "--immediate", "delete", "account", "where", "name=vision", "cluster=lab"]
    assert changes[4].argv == ["sacctmgr", "--immediate", "delete", "qos", "where", "name=high"]
    assert set(current.accounts) == {"hpcadmin"} and set(current.qos) == {"normal"}
    assert set(current.users) == {"root", "alice", "carol"} and current.users["alice"].assocs == {}
    # everything gone from cluster.yml: root and normal are never removed
    changes, _ = converge(current, wanted(qos=[], accounts=[], users=[]))
    assert texts(changes) == ["user carol: remove (accounts hpcadmin)", "account hpcadmin: remove"]


def test_items_with_jobs_are_kept_and_reported():
    current = fresh()
    converge(current, wanted())
    jobs = acct.parse_jobs("vision|carol|high\nresearch|alice|normal\n")
    later = wanted(qos=[QOS[1]], accounts=[ACCOUNTS[2]], users=[{**USERS[1], "accounts": ["hpcadmin"]}])
    changes, kept = converge(current, later, jobs)
    assert changes == []
    assert kept == [
        "user alice: kept in account(s) research, it has running or pending jobs",
        "user carol: kept in account vision, it has running or pending jobs",
        "account vision: kept, it has running or pending jobs",
        "account research: kept, it has running or pending jobs",
        "qos high: kept, it has running or pending jobs",
    ]
    assert not [c for c in changes if "remove" in c.text]
    # the jobs ended: the next run removes them
    changes, kept = converge(current, later)
    assert kept == []
    assert texts(changes) == [
        "user alice: remove (accounts research)",
        "user carol: remove from account vision",
        "account vision: remove",
        "account research: remove",
        "qos high: remove",
    ]


def test_a_kept_user_keeps_its_parent_accounts():
    current = fresh()
    converge(current, wanted())
    jobs = acct.parse_jobs("vision|carol|normal\n")
    users = [{**USERS[1], "accounts": ["hpcadmin"]}]
    changes, kept = sa.plan(CLUSTER, current, wanted(accounts=[ACCOUNTS[2]], users=users), jobs)
    assert kept == [
        "user carol: kept in account vision, it has running or pending jobs",
        "account vision: kept, it has running or pending jobs",
        "account research: kept, it has kept users or sub-accounts",
    ]
    assert texts(changes) == ["user alice: remove (accounts research)"]


def test_without_the_job_queue_nothing_is_removed():
    current = fresh()
    converge(current, wanted())
    changes, kept = sa.plan(CLUSTER, current, wanted(qos=[], accounts=[], users=[]), None)
    assert changes == []
    assert len(kept) == 7 and all(line.endswith("the job queue could not be read") for line in kept)


def test_absent_user_loses_its_associations():
    current = fresh()
    users = [{**USERS[0], "name": "mallory"}, *USERS]
    converge(current, wanted(users=users))
    assert current.users["mallory"].assocs
    changes, _ = converge(current, wanted())
    assert texts(changes) == ["user mallory: remove (accounts research)"]


def test_parent_changes_are_applied_after_new_parents_exist():
    current = fresh()
    converge(current, wanted())
    accounts = [*ACCOUNTS, {"name": "cv", "parent": "research"}]
    accounts[1] = {**ACCOUNTS[1], "parent": "cv"}
    accounts = [accounts[0], accounts[3], accounts[1], accounts[2]]
    changes, _ = converge(current, wanted(accounts=accounts))
    assert texts(changes) == ["account cv: add (parent research)", "account vision: parent research -> cv"]


# ---------------------------------------------------------------- the module as Ansible runs it


def _run_module(monkeypatch: pytest.MonkeyPatch, args: dict, outputs: dict) -> tuple[dict, list]:
    """Run main() with these module arguments; sacctmgr's listings are FRESH's unless ``outputs``
    names them, squeue prints ``outputs["squeue"]``, changes succeed."""
    from ansible.module_utils import basic
    from ansible.module_utils.testing import patch_module_args

    calls: list[list[str]] = []

    def run_command(self, argv, **kwargs):
        calls.append(list(argv))
        if argv[0] == "squeue":
            return outputs.get("squeue", (0, "", ""))
        if argv[1] == "--immediate":
            return (0, "", "")
        return (0, outputs.get(argv[4], FRESH[argv[4]]), "")

    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    stdout = io.StringIO()
    monkeypatch.setattr(sys, "stdout", stdout)
    with patch_module_args(args), pytest.raises(SystemExit):
        sa.main()
    return json.loads(stdout.getvalue()), calls


def test_module_check_mode_reports_and_applies_nothing(monkeypatch: pytest.MonkeyPatch):
    args = {"cluster": CLUSTER, "qos": QOS, "accounts": ACCOUNTS, "users": USERS[:2], "_ansible_check_mode": True}
    result, calls = _run_module(monkeypatch, args, {})
    assert result["changed"] is True
    assert result["changed_paths"][0] == "qos high: add" and len(result["changed_paths"]) == 9
    assert not [c for c in calls if "--immediate" in c]
    reads = [c for c in calls if c[0] == "sacctmgr"]
    assert reads[1] == [
        "sacctmgr", "--noheader", "--parsable2", "show", "assoc", "where", "cluster=lab", "WOPLimits",
        "format=Account,User,Partition,ParentName,Fairshare,GrpTRES,MaxWall,QOS,DefaultQOS",
    ]  # fmt: skip


def test_module_applies_and_warns_about_kept_items(monkeypatch: pytest.MonkeyPatch):
    args = {"cluster": CLUSTER, "qos": [], "accounts": [], "users": []}
    outputs = {
        "squeue": (0, "physics|dave|normal\n", ""),
        "assoc": FRESH["assoc"] + "physics|||root|1||||\nphysics|dave|||1||||\nold|||root|1||||\n",
    }
    result, calls = _run_module(monkeypatch, args, outputs)
    assert result["changed_paths"] == ["account old: remove"]
    assert [c for c in calls if "--immediate" in c] == [
        ["sacctmgr", "--immediate", "delete", "account", "where", "name=old", "cluster=lab"]
    ]
    assert result["kept"] == [
        "user dave: kept in account(s) physics, it has running or pending jobs",
        "account physics: kept, it has running or pending jobs",
    ]
    # each is also passed to module.warn (Ansible's warnings, which corectl prints with the host):
    # how a module result carries them depends on Ansible's process-wide state, so the e2e test
    # checks the printed line instead
