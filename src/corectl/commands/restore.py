"""restore: a replacement head (same name and address, provisioned) back to a backup of role backup. The head's
corectl-backup (playbooks/restore.yml) refuses a backup that does not verify and a database holding jobs newer
than the backup (unless forced), and loads the database, and slurmctld's saved state where none is present, with both
daemons stopped (and a second controller's slurmctld too); corectl's provision keeps slurmctld stopped on an empty
state directory, and slurmdbd on an empty database, until then."""

from __future__ import annotations

import json
from dataclasses import dataclass

from rich.console import Console

from corectl import ansible
from corectl.ansible import Returned, RunRequest
from corectl.errors import CorectlError
from corectl.progress import LiveProgress
from corectl.site.context import Context

# what playbooks/restore.yml hands back: the check's answer, then the restore's
CHECKED, RESTORED = "corectl_restore_check", "corectl_restore"
REFUSED = 3  # corectl-backup's exit code for a restore it refused, nothing changed


@dataclass(frozen=True)
class Restored:
    head: str
    backup: str
    created: str
    state: str  # slurmctld's state directory, or "" when the backup held none or a saved state was there
    kept_aside: str  # where the state found there was moved, or ""
    second: str  # the second controller, whose slurmctld was stopped meanwhile and started again, or ""
    state_kept: str = ""  # the state directory whose saved state (newer than the backup) was kept, or ""


def restore(ctx: Context, console: Console, backup: str | None, force: bool) -> Restored:
    site, cluster = ctx.site, ctx.rendered()
    if cluster.config.backup is None:
        raise CorectlError(f"{site.cluster_file}: backup is not set (there is nothing to restore from)", exit_code=2)
    head = cluster.with_role("slurm_dbd")[0].name
    controllers = [n.name for n in cluster.with_role("slurm_controller")]
    if controllers != [head]:
        raise CorectlError(f"restore expects slurmctld and slurmdbd on one head; cluster.yml has {controllers} "
                           f"and {head}")  # fmt: skip
    # a second controller's slurmctld is stopped while the head is restored (it would take over and write the
    # shared state directory) and started again after
    second = cluster.config.slurm.backup_controller
    request = RunRequest.of(
        ctx,
        playbook="restore.yml",
        command="restore" + (f" --backup {backup}" if backup else "") + (" --force" if force else ""),
        limit=",".join([head, *([second] if second else [])]),
        extravars={"corectl_restore_backup": backup or "latest", "corectl_restore_force": force},
        secrets=False,
        fan_out=False,
    )
    with LiveProgress(console, f"restore {site.name}") as progress:
        restored = Returned(RESTORED, progress)
        checked = Returned(CHECKED, restored)
        run = ansible.run(request, checked, cluster=cluster)
    said = checked.by_host.get(head) or {}
    if said.get("rc") == REFUSED:
        raise CorectlError(str(said.get("stderr", "")).strip().removeprefix("corectl-backup: "))
    res = restored.by_host.get(head) or {}
    if res.get("rc") != 0 or not run.ok:
        why = (
            checked.unreachable.get(head)
            or res.get("stderr")
            or said.get("stderr")
            or res.get("msg")
            or said.get("msg")
        )
        raise CorectlError(f"restore on {head} failed: {str(why or 'see corectl runs --show last').strip()}")
    done = json.loads(res.get("stdout") or "{}")
    state, aside = done.get("state", ""), done.get("kept_aside", "")
    return Restored(head, done["backup"], done["created"], state, aside, second or "", done.get("state_kept", ""))
