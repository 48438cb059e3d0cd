#!/usr/bin/python
# corectl: Slurm's accounting database (QOS, accounts, users' associations) as cluster.yml declares it.
from __future__ import annotations

DOCUMENTATION = r"""
module: slurm_accounting
short_description: "Converge Slurm's QOS, accounts and users' associations with sacctmgr"
description:
  - >-
    Reads the QOS, this cluster's associations (their own values, C(WOPLimits)), the accounts and
    users with C(sacctmgr --parsable2), and the jobs not yet finished with C(squeue); compares them
    with what is declared and applies the difference with C(sacctmgr --immediate). What is declared
    is added or changed; what is no longer declared (QOS, accounts, users' associations, limits) is
    removed or reset.
  - >-
    Never touched are the C(normal) QOS unless declared (then changed, never removed), the C(root)
    account and the C(root) user. A QOS, account or user association that still has running or
    pending jobs is not removed; it is named in RV(kept) (and as a warning) and removed by a later
    run once its jobs have ended. Without the job queue (slurmctld not running yet) nothing is removed.
  - Check mode reports the changes (RV(changed_paths)) and applies none.
options:
  cluster:
    description: Slurm ClusterName (the associations' cluster).
    type: str
    required: true
  qos:
    description: QOS (name, description, priority, preempt, preempt_mode, grp_tres, max_tres_per_user, max_wall).
    type: list
    elements: dict
    default: []
  accounts:
    description: >-
      Accounts, each parent before its children (name, parent, fairshare, description, qos, default_qos,
      grp_tres, max_tres_per_user (set as each user's GrpTRES in the account and its sub-accounts), max_wall).
    type: list
    elements: dict
    default: []
  users:
    description: Users (name, default_account, accounts, admin, state; absent removes all its associations).
    type: list
    elements: dict
    default: []
author: corectl
"""

EXAMPLES = r"""
- name: Converge QOS, accounts and users
  corectl.fleet.slurm_accounting:
    cluster: "{{ slurm_cluster_name }}"
    qos: "{{ slurm_qos }}"
    accounts: "{{ slurm_accounts }}"
    users: "{{ slurm_users }}"
"""

RETURN = r"""
changed_paths:
  description: "One line per change, in the order applied, such as C(account physics: fairshare 1 -> 10)."
  type: list
  elements: str
  returned: always
commands:
  description: The sacctmgr command lines of those changes.
  type: list
  elements: list
  returned: always
kept:
  description: What is no longer declared but was kept (it has jobs), one line each.
  type: list
  elements: str
  returned: always
"""

from dataclasses import dataclass

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.corectl.fleet.plugins.module_utils.sacctmgr import (
    ACCOUNT_FORMAT,
    ASSOC_FORMAT,
    KEEP_QOS,
    KEEP_USER,
    QOS_FORMAT,
    SACCTMGR,
    SQUEUE,
    USER_FORMAT,
    Account,
    Jobs,
    Qos,
    Refused,
    State,
    parse_jobs,
    parse_state,
    wanted_state,
)

# ---------------------------------------------------------------- the difference


@dataclass
class Change:
    text: str  # "account physics: fairshare 1 -> 10"
    argv: list


def _tres_text(limits: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(limits.items())) or "none"


def _tres_set(current: dict, wanted: dict) -> str:
    """sacctmgr's value: the changed limits, and -1 for each limit no longer declared."""
    items = {k: str(v) for k, v in wanted.items() if current.get(k) != v}
    items.update({k: "-1" for k in current if k not in wanted})
    return ",".join(f"{k}={v}" for k, v in sorted(items.items()))


def _wall_text(minutes: int | None) -> str:
    if minutes is None:
        return "none"
    days, rest = divmod(minutes, 1440)
    text = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{text}" if days else text


def _list_text(names: frozenset) -> str:
    return ",".join(sorted(names)) or "none"


def _qos_settings(current: Qos, wanted: Qos) -> tuple[list[str], list[str]]:
    """(what changed, sacctmgr set arguments) between two QOS."""
    words, args = [], []
    if current.description != wanted.description:
        words.append(f"description {current.description!r} -> {wanted.description!r}")
        args.append(f"description={wanted.description}")
    if current.priority != wanted.priority:
        words.append(f"priority {current.priority} -> {wanted.priority}")
        args.append(f"priority={wanted.priority}")
    if current.preempt_mode != wanted.preempt_mode:
        words.append(f"preempt_mode {current.preempt_mode} -> {wanted.preempt_mode}")
        args.append(f"preemptmode={wanted.preempt_mode}")
    if current.preempt != wanted.preempt:
        words.append(f"preempt {_list_text(current.preempt)} -> {_list_text(wanted.preempt)}")
        args.append(f"preempt={','.join(sorted(wanted.preempt))}")
    for key, option in (("grp_tres", "grptres"), ("max_tres_per_user", "maxtrespu")):
        before, after = getattr(current, key), getattr(wanted, key)
        if before != after:
            words.append(f"{key} {_tres_text(before)} -> {_tres_text(after)}")
            args.append(f"{option}={_tres_set(before, after)}")
    if current.max_wall != wanted.max_wall:
        words.append(f"max_wall {_wall_text(current.max_wall)} -> {_wall_text(wanted.max_wall)}")
        args.append(f"maxwall={_wall_text(wanted.max_wall) if wanted.max_wall is not None else -1}")
    return words, args


def _account_settings(current: Account, wanted: Account) -> tuple[list[str], list[str]]:
    """(what changed, sacctmgr set arguments of the association) between two accounts."""
    words, args = [], []
    if current.parent != wanted.parent:
        words.append(f"parent {current.parent} -> {wanted.parent}")
        args.append(f"parent={wanted.parent}")
    if current.fairshare != wanted.fairshare:
        words.append(f"fairshare {current.fairshare} -> {wanted.fairshare}")
        args.append(f"fairshare={wanted.fairshare}")
    if current.grp_tres != wanted.grp_tres:
        words.append(f"grp_tres {_tres_text(current.grp_tres)} -> {_tres_text(wanted.grp_tres)}")
        args.append(f"grptres={_tres_set(current.grp_tres, wanted.grp_tres)}")
    if current.max_wall != wanted.max_wall:
        words.append(f"max_wall {_wall_text(current.max_wall)} -> {_wall_text(wanted.max_wall)}")
        args.append(f"maxwall={_wall_text(wanted.max_wall) if wanted.max_wall is not None else -1}")
    if current.qos != wanted.qos:
        words.append(f"qos {_list_text(current.qos)} -> {_list_text(wanted.qos)}")
        args.append(f"qos={','.join(sorted(wanted.qos))}")
    if current.default_qos != wanted.default_qos:
        words.append(f"default_qos {current.default_qos or 'none'} -> {wanted.default_qos or 'none'}")
        args.append(f"defaultqos={wanted.default_qos or -1}")
    return words, args


def _depth(accounts: dict, name: str) -> int:
    depth, seen = 0, set()
    while name in accounts and name not in seen:
        seen.add(name)
        name = accounts[name].parent
        depth += 1
    return depth


def plan(cluster: str, current: State, wanted: State, jobs: Jobs | None) -> tuple[list[Change], list[str]]:
    """The changes that bring ``current`` to ``wanted``, in the order to apply them, and what is
    kept although no longer declared (it has jobs; with ``jobs`` None, unknown: nothing is
    removed)."""
    base = [SACCTMGR, "--immediate"]
    c = f"cluster={cluster}"
    changes: list[Change] = []
    kept: list[str] = []
    why = "it has running or pending jobs" if jobs is not None else "the job queue could not be read"

    def has_jobs(kind: str, key: object) -> bool:
        return jobs is None or key in getattr(jobs, kind)

    # 1. QOS: every missing one added first (without its preempt list: the QOS it names may be
    # added after it), then each one's settings, preempt lists included, changed
    added: dict[str, Qos] = {}
    for name, want in wanted.qos.items():
        if name not in current.qos:
            added[name] = Qos(**{**want.__dict__, "preempt": frozenset()})
            _, args = _qos_settings(Qos(name=name), added[name])
            changes.append(Change(f"qos {name}: add", [*base, "add", "qos", name, *args]))
    for name, want in wanted.qos.items():
        current_q = added[name] if name in added else current.qos[name]
        words, args = _qos_settings(current_q, want)
        if words:
            argv = [*base, "modify", "qos", "where", f"name={name}", "set", *args]
            changes.append(Change(f"qos {name}: {'; '.join(words)}", argv))
    # 2. accounts: added parent first, changed
    for name, want in wanted.accounts.items():
        if name not in current.accounts:
            _, args = _account_settings(Account(name=name, parent=""), want)
            argv = [*base, "add", "account", name, c, f"description={want.description}", f"organization={cluster}"]
            changes.append(Change(f"account {name}: add (parent {want.parent})", [*argv, *args]))
            continue
        have = current.accounts[name]
        words, args = _account_settings(have, want)
        if words:
            argv = [*base, "modify", "account", "where", f"name={name}", c, "set", *args]
            changes.append(Change(f"account {name}: {'; '.join(words)}", argv))
        if have.description != want.description:
            argv = [*base, "modify", "account", "where", f"name={name}", "set", f"description={want.description}"]
            changes.append(Change(f"account {name}: description {have.description!r} -> {want.description!r}", argv))
    # 3. users: associations added (the default first), then default account, admin level, limits
    for name, want in wanted.users.items():
        have = current.users.get(name)
        order = sorted(want.assocs, key=lambda a: a != want.default_account)
        for account in order:
            if have is not None and account in have.assocs:
                continue
            argv = [*base, "add", "user", name, f"account={account}", c, f"defaultaccount={want.default_account}"]
            if have is None and account == order[0] and want.admin_level != "None":
                argv.append(f"adminlevel={want.admin_level}")
            limits = want.assocs[account].grp_tres
            if limits:
                argv.append(f"grptres={_tres_set({}, limits)}")
            changes.append(Change(f"user {name}: add to account {account}", argv))
        if have is None:
            continue
        if have.default_account != want.default_account and want.default_account:
            argv = [*base, "modify", "user", "where", f"name={name}", c, "set"]
            argv.append(f"defaultaccount={want.default_account}")
            text = f"user {name}: default account {have.default_account or 'none'} -> {want.default_account}"
            changes.append(Change(text, argv))
        if have.admin_level != want.admin_level:
            argv = [*base, "modify", "user", "where", f"name={name}", "set", f"adminlevel={want.admin_level}"]
            changes.append(Change(f"user {name}: admin level {have.admin_level} -> {want.admin_level}", argv))
        for account, assoc in want.assocs.items():
            before = have.assocs.get(account)
            if before is not None and before.grp_tres != assoc.grp_tres:
                argv = [*base, "modify", "user", "where", f"name={name}", f"account={account}", c, "set"]
                argv.append(f"grptres={_tres_set(before.grp_tres, assoc.grp_tres)}")
                text = f"user {name}: account {account} grp_tres {_tres_text(before.grp_tres)} -> "
                changes.append(Change(text + _tres_text(assoc.grp_tres), argv))
    # 4. removals: users' associations, accounts (children first), QOS; each kept while it has jobs
    kept_accounts: set[str] = set()
    for name, have in current.users.items():
        if name == KEEP_USER:
            continue
        want = wanted.users.get(name)
        gone = [a for a in have.assocs if want is None or a not in want.assocs]
        if not gone:
            continue
        if want is None:
            busy = [a for a in gone if has_jobs("assocs", (a, name))]
            if busy:
                kept.append(f"user {name}: kept in account(s) {', '.join(sorted(have.assocs))}, {why}")
                kept_accounts.update(have.assocs)
                continue
            argv = [*base, "delete", "user", "where", f"name={name}", c]
            changes.append(Change(f"user {name}: remove (accounts {', '.join(sorted(have.assocs))})", argv))
            continue
        for account in sorted(gone):
            if has_jobs("assocs", (account, name)):
                kept.append(f"user {name}: kept in account {account}, {why}")
                kept_accounts.add(account)
                continue
            argv = [*base, "delete", "user", "where", f"name={name}", f"account={account}", c]
            changes.append(Change(f"user {name}: remove from account {account}", argv))
    gone_accounts = [a for a in current.accounts if a not in wanted.accounts]
    for name in gone_accounts:
        if has_jobs("accounts", name):
            kept_accounts.add(name)
    for name in list(kept_accounts):  # a kept account keeps its parents
        parent = current.accounts[name].parent if name in current.accounts else None
        while parent in current.accounts and parent not in wanted.accounts and parent not in kept_accounts:
            kept_accounts.add(parent)
            parent = current.accounts[parent].parent
    for name in sorted(gone_accounts, key=lambda a: (-_depth(current.accounts, a), a)):
        if name in kept_accounts:
            reason = why if has_jobs("accounts", name) else "it has kept users or sub-accounts"
            kept.append(f"account {name}: kept, {reason}")
            continue
        argv = [*base, "delete", "account", "where", f"name={name}", c]
        changes.append(Change(f"account {name}: remove", argv))
    for name in sorted(current.qos):
        if name in wanted.qos or name == KEEP_QOS:
            continue
        if has_jobs("qos", name):
            kept.append(f"qos {name}: kept, {why}")
            continue
        changes.append(Change(f"qos {name}: remove", [*base, "delete", "qos", "where", f"name={name}"]))
    return changes, kept


# ---------------------------------------------------------------- running it


def _run(module: AnsibleModule, argv: list) -> str:
    rc, out, err = module.run_command(argv)
    if rc != 0:
        raise Refused(f"{' '.join(argv)} failed (rc {rc}): {(err or out).strip()}")
    return out


def read_state(module: AnsibleModule, cluster: str) -> State:
    read = [SACCTMGR, "--noheader", "--parsable2"]
    return parse_state(
        _run(module, [*read, "show", "qos", f"format={QOS_FORMAT}"]),
        _run(module, [*read, "show", "assoc", "where", f"cluster={cluster}", "WOPLimits", f"format={ASSOC_FORMAT}"]),
        _run(module, [*read, "show", "user", f"format={USER_FORMAT}"]),
        _run(module, [*read, "show", "account", f"format={ACCOUNT_FORMAT}"]),
    )


def read_jobs(module: AnsibleModule) -> Jobs | None:
    rc, out, _ = module.run_command(SQUEUE)
    if rc != 0:
        return None
    try:
        return parse_jobs(out)
    except Refused:
        return None


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "cluster": {"type": "str", "required": True},
            "qos": {"type": "list", "elements": "dict", "default": []},
            "accounts": {"type": "list", "elements": "dict", "default": []},
            "users": {"type": "list", "elements": "dict", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    done: list[str] = []
    try:
        current = read_state(module, params["cluster"])
        wanted = wanted_state(params["qos"], params["accounts"], params["users"])
        changes, kept = plan(params["cluster"], current, wanted, read_jobs(module))
        for change in changes:
            if not module.check_mode:
                _run(module, change.argv)
            done.append(change.text)
    except (Refused, KeyError, ValueError) as error:
        module.fail_json(msg=str(error), changed=bool(done) and not module.check_mode, changed_paths=done)
    for line in kept:
        module.warn(line)
    module.exit_json(changed=bool(changes), changed_paths=done, commands=[c.argv for c in changes], kept=kept)


if __name__ == "__main__":
    main()
