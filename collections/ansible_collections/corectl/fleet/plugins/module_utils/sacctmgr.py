# corectl: the Slurm accounting database as corectl.fleet.slurm_accounting reads it (sacctmgr's and squeue's
# output) and as cluster.yml declares it (wanted_state): the two States its plan compares.
from __future__ import annotations

import re
from dataclasses import dataclass, field

SACCTMGR = "sacctmgr"
QOS_FORMAT = "Name,Priority,Preempt,PreemptMode,GrpTRES,MaxTRESPerUser,MaxWall,Description"
ASSOC_FORMAT = "Account,User,Partition,ParentName,Fairshare,GrpTRES,MaxWall,QOS,DefaultQOS"
USER_FORMAT = "User,DefaultAccount,AdminLevel"
ACCOUNT_FORMAT = "Account,Description"
SQUEUE = ["squeue", "--noheader", "--all", "--format=%a|%u|%q"]
KEEP_QOS = "normal"
KEEP_ACCOUNT = "root"
KEEP_USER = "root"
MEM_UNITS = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2, "P": 1024**3}
_TRES_ITEM = re.compile(r"^(?P<name>[^=]+)=(?P<count>\d+(?:\.\d+)?)(?P<unit>[KMGTP]?)$")
_WALL = re.compile(r"^(?:(?P<days>\d+)-)?(?P<rest>\d+(?::\d+){0,2})$")


class Refused(Exception):
    """Output that cannot be read, or a declaration that cannot be applied."""


# ---------------------------------------------------------------- reading sacctmgr's output


def rows(text: str, fields: int) -> list[list[str]]:
    """``--parsable2`` lines as lists of ``fields`` values; the last field (a description) may
    itself hold a '|'."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = line.split("|", fields - 1)
        if len(values) != fields:
            raise Refused(f"cannot read sacctmgr line {line!r} ({fields} fields expected)")
        out.append(values)
    return out


def parse_tres(text: str) -> dict[str, int]:
    """``cpu=4,mem=1G,gres/gpu=8`` -> {cpu: 4, mem: 1024, gres/gpu: 8} (mem in MiB)."""
    limits: dict[str, int] = {}
    for item in filter(None, text.split(",")):
        match = _TRES_ITEM.match(item.strip())
        if match is None:
            raise Refused(f"cannot read TRES {item!r}")
        name, count = match["name"], float(match["count"])
        if match["unit"]:
            count *= MEM_UNITS[match["unit"]]
        limits[name] = round(count)
    return limits


def parse_wall(text: str | None) -> int | None:
    """A Slurm time (minutes, m:s, h:m:s, d-h, d-h:m, d-h:m:s) as minutes, as Slurm rounds it
    (seconds up); None for no limit."""
    if text is None or text.strip().upper() in ("", "-1", "INFINITE", "UNLIMITED"):
        return None
    match = _WALL.match(text.strip())
    if match is None:
        raise Refused(f"cannot read time {text!r}")
    parts = [int(p) for p in match["rest"].split(":")]
    if match["days"] is not None:
        hours, minutes, seconds = [*parts, 0, 0][:3]
        total = int(match["days"]) * 86400 + hours * 3600 + minutes * 60 + seconds
    elif len(parts) == 1:
        total = parts[0] * 60
    elif len(parts) == 2:
        total = parts[0] * 60 + parts[1]
    else:
        total = parts[0] * 3600 + parts[1] * 60 + parts[2]
    return (total + 59) // 60


def _names(text: str) -> frozenset[str]:
    return frozenset(name.strip() for name in text.split(",") if name.strip())


def _share(text: str) -> int | str:
    return int(text) if text.strip().isdigit() else text.strip().lower()


@dataclass
class Qos:
    name: str
    description: str = ""
    priority: int = 0
    preempt: frozenset = frozenset()
    preempt_mode: str = "cluster"
    grp_tres: dict = field(default_factory=dict)
    max_tres_per_user: dict = field(default_factory=dict)
    max_wall: int | None = None


@dataclass
class Account:
    name: str
    parent: str = "root"
    fairshare: int | str = 1
    description: str = ""
    qos: frozenset = frozenset()
    default_qos: str = ""
    grp_tres: dict = field(default_factory=dict)
    max_wall: int | None = None


@dataclass
class Assoc:
    """A user's association with one account: the limits corectl sets on it."""

    grp_tres: dict = field(default_factory=dict)


@dataclass
class User:
    name: str
    default_account: str = ""
    admin_level: str = "None"
    assocs: dict = field(default_factory=dict)  # account -> Assoc


@dataclass
class State:
    qos: dict = field(default_factory=dict)  # name -> Qos
    accounts: dict = field(default_factory=dict)  # name -> Account (not root)
    users: dict = field(default_factory=dict)  # name -> User (and its associations on the cluster)


@dataclass
class Jobs:
    """Running and pending jobs: what they use."""

    accounts: set = field(default_factory=set)
    assocs: set = field(default_factory=set)  # (account, user)
    users: set = field(default_factory=set)
    qos: set = field(default_factory=set)


def parse_jobs(text: str) -> Jobs:
    """squeue's ``%a|%u|%q`` lines."""
    jobs = Jobs()
    for raw_account, raw_user, raw_qos in rows(text, 3):
        account, user = raw_account.strip().lower(), raw_user.strip()
        jobs.accounts.add(account)
        jobs.assocs.add((account, user))
        jobs.users.add(user)
        jobs.qos.add(raw_qos.strip().lower())
    return jobs


def parse_state(qos_text: str, assoc_text: str, user_text: str, account_text: str) -> State:
    """The current state from the four sacctmgr listings (formats above); associations with a
    partition are not corectl's and are left out."""
    state = State()
    for name, prio, preempt, mode, grp, maxpu, wall, description in rows(qos_text, 8):
        state.qos[name] = Qos(
            name=name,
            description=description,
            priority=int(prio or 0),
            preempt=_names(preempt),
            preempt_mode=(mode or "cluster").lower(),
            grp_tres=parse_tres(grp),
            max_tres_per_user=parse_tres(maxpu),
            max_wall=parse_wall(wall),
        )
    descriptions = {name: description for name, description in rows(account_text, 2)}
    for name, default_account, level in rows(user_text, 3):
        state.users[name] = User(name=name, default_account=default_account, admin_level=level or "None")
    for account, user, partition, parent, share, grp, wall, qos, defqos in rows(assoc_text, 9):
        if partition:
            continue
        if not user:
            if account == KEEP_ACCOUNT:
                continue
            state.accounts[account] = Account(
                name=account,
                parent=parent or "root",
                fairshare=_share(share or "1"),
                description=descriptions.get(account, ""),
                qos=_names(qos),
                default_qos=defqos,
                grp_tres=parse_tres(grp),
                max_wall=parse_wall(wall),
            )
        else:
            entry = state.users.setdefault(user, User(name=user))
            entry.assocs[account] = Assoc(grp_tres=parse_tres(grp))
    return state


# ---------------------------------------------------------------- what is declared


def _description(text: str | None, name: str) -> str:
    """As sacctmgr keeps it: lowercased, quotes as backquotes."""
    return (text or name).lower().replace('"', "`").replace("'", "`")


def wanted_state(qos: list, accounts: list, users: list) -> State:
    state = State()
    for q in qos:
        state.qos[q["name"]] = Qos(
            name=q["name"],
            description=_description(q.get("description"), q["name"]),
            priority=int(q.get("priority") or 0),
            preempt=frozenset(q.get("preempt") or ()),
            preempt_mode=(q.get("preempt_mode") or "cluster").lower(),
            grp_tres=dict(q.get("grp_tres") or {}),
            max_tres_per_user=dict(q.get("max_tres_per_user") or {}),
            max_wall=parse_wall(q.get("max_wall")),
        )
    per_user: dict[str, dict] = {}  # account -> its users' GrpTRES (inherited, nearest wins)
    for a in accounts:
        parent = a.get("parent") or "root"
        state.accounts[a["name"]] = Account(
            name=a["name"],
            parent=parent,
            fairshare=int(a.get("fairshare") or 1),
            description=_description(a.get("description"), a["name"]),
            qos=frozenset(a.get("qos") or ()),
            default_qos=a.get("default_qos") or "",
            grp_tres=dict(a.get("grp_tres") or {}),
            max_wall=parse_wall(a.get("max_wall")),
        )
        per_user[a["name"]] = {**per_user.get(parent, {}), **(a.get("max_tres_per_user") or {})}
    for u in users:
        if u.get("state", "present") != "present":
            continue
        names = list(dict.fromkeys(u.get("accounts") or ()))
        default = u.get("default_account") or (names[0] if names else "")
        state.users[u["name"]] = User(
            name=u["name"],
            default_account=default,
            admin_level="Administrator" if u.get("admin") else "None",
            assocs={name: Assoc(grp_tres=dict(per_user.get(name, {}))) for name in names},
        )
    return state
