"""The corectl command line (typer). Commands parse options and call into corectl.commands."""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import click
import typer
from rich.console import Console
from typer.core import TyperGroup

from corectl.errors import CorectlError, ValidationFailed

if TYPE_CHECKING:
    from collections.abc import Callable

    from corectl.bootstrap import Login
    from corectl.runner import RunResult

err = Console(stderr=True, highlight=False, emoji=False)


class _Group(TyperGroup):
    """User mistakes end as one-line errors with a non-zero exit, never as tracebacks."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ValidationFailed as exc:
            err.print(str(exc), markup=False, soft_wrap=True)
            raise SystemExit(exc.exit_code) from None
        except CorectlError as exc:
            err.print(f"error: {exc}", markup=False, soft_wrap=True)
            raise SystemExit(exc.exit_code) from None
        except KeyboardInterrupt:
            err.print("interrupted")
            raise SystemExit(130) from None


app = typer.Typer(
    cls=_Group,
    help="Bring DGX nodes from bare OS to a working Slurm GPU cluster, and keep them healthy.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
lab_app = typer.Typer(help="The local stand-in cluster (systemd containers).", no_args_is_help=True)
app.add_typer(lab_app, name="lab")
runners_app = typer.Typer(help="Runner hosts that runs fan out over (cluster.yml control).", no_args_is_help=True)
app.add_typer(runners_app, name="runners")
upgrade_app = typer.Typer(help="Rolling, drain-aware upgrades.", no_args_is_help=True)
app.add_typer(upgrade_app, name="upgrade")
secrets_app = typer.Typer(help="Site secrets (munge key, database passwords), vault-encrypted.", no_args_is_help=True)
app.add_typer(secrets_app, name="secrets")

# Piped output (CI logs, grep) gets whole lines instead of rich's 80-column default.
out = Console(highlight=False, emoji=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)

InventoryOpt = Annotated[
    str | None,
    typer.Option(
        "--inventory",
        "-i",
        metavar="SITE",
        help="site name under inventories/, or a path to a site directory "
        "(default: $CORECTL_INVENTORY, else the only site besides the lab)",
        show_default=False,
    ),
]
WaitOpt = Annotated[
    float,
    typer.Option(
        "--wait",
        min=0,
        metavar="SECONDS",
        help="while another changing command holds the site, wait up to this many seconds",
    ),
]


@contextlib.contextmanager
def _changing(site: Any, wait: float) -> Iterator[None]:
    """Hold the site's lock (one changing command per site); the holder is this command line."""
    from corectl.lock import site_lock

    if not site.directory.is_dir():  # no such site: the command says so itself, and nothing is created
        yield
        return
    command = shlex.join(sys.argv[1:])
    with site_lock(site, command, wait=wait, warn=lambda line: err.print(line, markup=False, soft_wrap=True)):
        yield


def _require_ok(result: RunResult, what: str, *, per_host: bool = False) -> None:
    """A run with failed or unreachable hosts (or none that ran) ends the command non-zero, with
    the next step in its last line. ``per_host``: a rerun can be limited to the failed hosts."""
    if result.ok:
        return
    if result.status == "canceled":
        raise CorectlError(
            f"{what} canceled after {result.elapsed:.0f}s ({len(result.hosts)} hosts reached, counts above); "
            "running it again is safe and continues where it stopped",
            exit_code=130,
        )
    failed = result.failed_hosts
    if not failed:
        tail = result.output_tail(1)
        raise CorectlError(f"{what} failed: {result.status}: {tail[-1] if tail else 'no output'}")
    unreachable = [h for h in failed if result.hosts[h].unreachable]
    parts = [f"unreachable: {', '.join(unreachable)}"] if unreachable else []
    if len(unreachable) < len(failed):
        parts.append(f"failed: {', '.join(h for h in failed if h not in unreachable)}")
    retry = f"retry just those: {_with_limit(failed)}" if per_host else "fix the cause and run it again"
    raise CorectlError(f"{what} failed ({'; '.join(parts)}); {retry}")


def _with_limit(hosts: list[str]) -> str:
    """This command line with ``--limit`` set to ``hosts``."""
    argv, kept = sys.argv[1:], []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--limit", "-l"):
            skip = True
        elif not arg.startswith("--limit="):
            kept.append(arg)
    return "corectl " + shlex.join([*kept, "--limit", ",".join(hosts)])


def _site(inventory: str | None):  # noqa: ANN202 - Site, imported lazily
    from corectl.site import resolve_site

    return resolve_site(inventory)


@app.command()
def init(
    name: Annotated[str, typer.Argument(help="the new site's name (inventories/NAME)")],
) -> None:
    """Start a new site: a commented cluster.yml that validates, group_vars/, and its secrets."""

    from corectl.commands.init import check_name, init_site
    from corectl.secrets import SecretFiles

    check_name(name)
    site = _site(name)
    written = init_site(site)
    for item in written:
        out.print(f"wrote {item}", markup=False)
    password_file = SecretFiles(site).default_password_file
    if not (os.environ.get("CORECTL_VAULT_PASSWORD_FILE") or os.environ.get("CORECTL_VAULT_PASSWORD")):
        out.print(
            f"vault password: {password_file} (git-ignored, mode 0600); keep a copy in your password manager, "
            "or move it off this disk and set CORECTL_VAULT_PASSWORD_FILE",
            markup=False,
        )
    out.print(f"next: edit {site.cluster_file}, then corectl validate --inventory {name}", markup=False)


@app.command()
def validate(inventory: InventoryOpt = None) -> None:
    """Check cluster.yml; print one line per problem (file:line: field: what is wrong)."""
    from corectl.commands.inventory import validate as run_validate

    cluster = run_validate(_site(inventory))
    out.print(f"{cluster.config.cluster.name}: cluster.yml is valid ({len(cluster.nodes)} nodes)")


@app.command()
def render(
    inventory: InventoryOpt = None,
    check: Annotated[bool, typer.Option("--check", help="exit 1 if a rendered file is stale, writing nothing")] = False,
    wait: WaitOpt = 0,
) -> None:
    """Write inventories/<site>/hosts.yml, nodes.json, switches.json and site.json from cluster.yml (deterministic)."""
    from corectl.commands.inventory import render_site

    site = _site(inventory)
    with contextlib.nullcontext() if check else _changing(site, wait):
        cluster, changed = render_site(site, check_only=check)
    state = "up to date" if check or not changed else "written"
    out.print(f"{site.hosts_file}: {state} ({len(cluster.nodes)} hosts)")


@app.command()
def schema() -> None:
    """Print the JSON Schema of cluster.yml (for editors)."""
    from corectl.commands.inventory import schema as make_schema

    out.print(make_schema(), markup=False, soft_wrap=True)


@app.command()
def provision(
    inventory: InventoryOpt = None,
    limit: Annotated[
        str | None, typer.Option("--limit", "-l", metavar="HOSTS", help="only these hosts/groups (Ansible pattern)")
    ] = None,
    tags: Annotated[str | None, typer.Option("--tags", "-t", metavar="TAGS", help="only tasks with these tags")] = None,
    check: Annotated[bool, typer.Option("--check", help="dry run: change nothing")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="show the changes to files")] = False,
    wait: WaitOpt = 0,
    local: Annotated[
        bool, typer.Option("--local", help="run from this host even where cluster.yml names runner hosts")
    ] = False,
) -> None:
    """Validate, render and run the site playbook on the site's nodes (through its runners, if any)."""
    from corectl.commands.provision import provision as run_provision

    site = _site(inventory)
    with _changing(site, wait):
        result = run_provision(site, out, limit=limit, tags=tags, check=check, diff=diff, local=local)
    _require_ok(result, "provision", per_host=True)


@app.command()
def bootstrap(
    inventory: InventoryOpt = None,
    nodes: Annotated[list[str] | None, typer.Argument(help="nodes (default: every node of the site)")] = None,
    user: Annotated[str, typer.Option(help="user for the first login (root, or an admin user with sudo)")] = "root",
    password_env: Annotated[
        str | None, typer.Option(help="read the login (and sudo) password from this environment variable")
    ] = None,
    key: Annotated[Path | None, typer.Option(help="log in with this existing private key instead")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="accept new host keys without asking")] = False,
    wait: WaitOpt = 0,
) -> None:
    """First contact with fresh nodes: record host keys, install corectl's key, make sure python3 is there."""
    from corectl.commands.bootstrap import bootstrap as run_bootstrap

    site = _site(inventory)
    login = _bootstrap_login(user, password_env, key)
    with _changing(site, wait):
        run_bootstrap(site, out, nodes or [], login, _host_key_prompt(yes))


def _bootstrap_login(user: str, password_env: str | None, key: Path | None) -> Login:
    import getpass

    from corectl.bootstrap import Login

    password = None
    if password_env:
        password = os.environ.get(password_env)
        if password is None:
            raise CorectlError(f"--password-env {password_env}: not set", exit_code=2)
    elif key is None or user != "root":
        password = getpass.getpass(f"password of {user} on the nodes: ")
    return Login(user, password, key)


def _host_key_prompt(yes: bool) -> Callable[[str, str], bool]:
    def accept(node: str, shown: str) -> bool:
        out.print(f"{node}: host key {shown}", highlight=False)
        return yes or typer.confirm(f"accept the host key of {node}?")

    return accept


@app.command()
def plan(
    inventory: InventoryOpt = None,
    limit: Annotated[
        str | None, typer.Option("--limit", "-l", metavar="HOSTS", help="only these hosts/groups (Ansible pattern)")
    ] = None,
    tags: Annotated[str | None, typer.Option("--tags", "-t", metavar="TAGS", help="only tasks with these tags")] = None,
) -> None:
    """Dry run of provision (check + diff) with a per-host list of what would change."""
    from corectl.commands.provision import plan as run_plan

    _require_ok(run_plan(_site(inventory), out, limit=limit, tags=tags), "plan", per_host=True)


@app.command()
def drain(
    nodes: Annotated[str, typer.Argument(help="compute node(s), e.g. dgx03 or dgx[01-04]")],
    inventory: InventoryOpt = None,
    reason: Annotated[str, typer.Option("--reason", "-r", help="why (shown by sinfo -R)")] = "",
    wait: WaitOpt = 0,
) -> None:
    """Drain nodes in Slurm: running jobs finish, no new jobs start there."""
    from corectl.commands.nodes import set_state

    site = _site(inventory)
    with _changing(site, wait):
        result = set_state(site, out, nodes, "drain", reason)
    _require_ok(result, "drain")


@app.command()
def resume(
    nodes: Annotated[str, typer.Argument(help="compute node(s), e.g. dgx03 or dgx[01-04]")],
    inventory: InventoryOpt = None,
    wait: WaitOpt = 0,
) -> None:
    """Return drained nodes to service in Slurm."""
    from corectl.commands.nodes import set_state

    site = _site(inventory)
    with _changing(site, wait):
        result = set_state(site, out, nodes, "resume")
    _require_ok(result, "resume")


@app.command()
def health(
    inventory: InventoryOpt = None,
    limit: Annotated[
        str | None,
        typer.Option("--limit", "-l", metavar="HOSTS", help="only these compute nodes/groups (Ansible pattern)"),
    ] = None,
    level: Annotated[
        int | None, typer.Option("--level", min=0, max=3, help="dcgmi diag level (0 off, 1-3); default: the nodes'")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print {nodes: {node: result}, ok} as JSON")] = False,
    wide: Annotated[bool, typer.Option("--wide", help="the full node x check matrix instead of the summary")] = False,
    burn_in: Annotated[
        bool, typer.Option("--burn-in", help="NCCL all_reduce through Slurm instead, busbw vs the profile's")
    ] = False,
) -> None:
    """Run the node health checks on compute nodes in parallel; exit 1 if any node fails."""
    import json

    if burn_in:
        from corectl.commands.burnin import burn_in as run_burn_in

        if any(r.status == "fail" for r in run_burn_in(_site(inventory), out, limit=limit)):
            raise typer.Exit(1)
        return

    from corectl.commands.health import health as run_health
    from corectl.commands.health import health_json, render_report

    result = run_health(_site(inventory), err if json_out else out, limit=limit, level=level)
    if json_out:
        print(json.dumps(health_json(result.nodes), indent=2))
    else:
        out.print(render_report(result.nodes, wide=wide))
    if not result.ok:
        raise typer.Exit(1)


@app.command("add-node")
def add_node(
    node: Annotated[str, typer.Argument(help="the new compute node's name, e.g. dgx13")],
    inventory: InventoryOpt = None,
    address: Annotated[str | None, typer.Option(help="its address (when cluster.yml does not declare it yet)")] = None,
    profile: Annotated[str | None, typer.Option(help="its hardware profile (idem)")] = None,
    leaf: Annotated[str | None, typer.Option(help="its leaf switch (idem)")] = None,
    rack: Annotated[str | None, typer.Option(help="its rack (idem)")] = None,
    ssh_host: Annotated[str | None, typer.Option(help="SSH endpoint host, when not the address")] = None,
    ssh_port: Annotated[int | None, typer.Option(help="SSH port, when not 22")] = None,
    partition: Annotated[
        list[str] | None, typer.Option("--partition", "-p", help="partitions to join (default: the default one)")
    ] = None,
    bootstrap_user: Annotated[
        str | None, typer.Option(help="bootstrap the node first, logging in as this user (see corectl bootstrap)")
    ] = None,
    password_env: Annotated[str | None, typer.Option(help="bootstrap: the password's environment variable")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="bootstrap: accept the new host key")] = False,
    wait: WaitOpt = 0,
) -> None:
    """Add a compute node: declare it, update only the hosts that must change, provision and check it, resume it."""
    from corectl.commands.lifecycle import add_node as run_add
    from corectl.commands.lifecycle import node_entry

    entry = node_entry(address, profile, rack=rack, leaf=leaf, ssh_host=ssh_host, ssh_port=ssh_port)
    login = None
    if bootstrap_user:
        login = _bootstrap_login(bootstrap_user, password_env, None)
    site = _site(inventory)
    with _changing(site, wait):
        run_add(site, out, node, entry=entry, partitions=partition or [], login=login, accept=_host_key_prompt(yes))


@app.command("remove-node")
def remove_node(
    node: Annotated[str, typer.Argument(help="the compute node to retire")],
    inventory: InventoryOpt = None,
    timeout: Annotated[int, typer.Option("--timeout", min=0, help="seconds to wait for its jobs to end")] = 3600,
    wait: WaitOpt = 0,
) -> None:
    """Drain a node, wait for its jobs, and remove it from Slurm, monitoring and cluster.yml."""
    from corectl.commands.lifecycle import remove_node as run_remove

    site = _site(inventory)
    with _changing(site, wait):
        run_remove(site, out, node, timeout=timeout)


@app.command()
def status(inventory: InventoryOpt = None) -> None:
    """Show compute nodes with their Slurm state, reason, running jobs, last health check and repeat offenders."""
    from datetime import UTC, datetime

    from corectl.commands.failures import site_offenders
    from corectl.commands.health import last_verdicts
    from corectl.commands.inventory import render_site
    from corectl.commands.status import read_slurm_status, status_table

    site = _site(inventory)
    render_site(site, check_only=False)
    offenders = site_offenders(site, datetime.now(UTC), _warn)
    out.print(status_table(read_slurm_status(site), last_verdicts(site), offenders))


def _warn(line: str) -> None:
    err.print(line, markup=False, soft_wrap=True)


@app.command("history")
def node_history(
    node: Annotated[str, typer.Argument(help="a node of the site, e.g. dgx07")],
    inventory: InventoryOpt = None,
    last: Annotated[int, typer.Option("--last", min=1, help="how many verdicts and actions to show")] = 20,
) -> None:
    """A node's health verdicts and remediation actions, newest first (every corectl health adds one)."""
    from corectl.commands.failures import history_view

    out.print(history_view(_site(inventory), node, last))


@app.command()
def rma(
    inventory: InventoryOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
    failures: Annotated[
        int | None,
        typer.Option(min=1, help="failing health runs that make a repeat offender (default: group_vars, 3)"),
    ] = None,
    days: Annotated[
        int | None, typer.Option(min=1, help="in this many days up to now (default: group_vars, 7)")
    ] = None,
) -> None:
    """Nodes to send back (repeat offenders of the health checks), with the dates and failing checks."""
    import json
    from datetime import UTC, datetime

    from corectl.commands.failures import rma as rma_report
    from corectl.commands.failures import rma_json, rma_view

    site = _site(inventory)
    offenders, cases = rma_report(site, datetime.now(UTC), failures, days)
    if json_out:
        print(json.dumps(rma_json(site, offenders, cases), indent=2))
    else:
        out.print(rma_view(site, offenders, cases))


@app.command()
def heal(
    nodes: Annotated[
        str | None, typer.Argument(metavar="[NODES]", help="only these compute nodes (default: every one)")
    ] = None,
    inventory: InventoryOpt = None,
    wait: WaitOpt = 0,
) -> None:
    """Remediate nodes the health checks drained: each failing check's ladder (group_vars), checks after
    every step, resume what passes; what cannot be healed stays drained for hardware service."""
    from corectl.commands.heal import heal as run_heal
    from corectl.commands.heal import outcome_table

    site = _site(inventory)
    with _changing(site, wait):
        outcomes = run_heal(site, out, nodes, warn=_warn)
    out.print(outcome_table(outcomes))
    if not all(o.ok for o in outcomes):
        raise typer.Exit(1)


@app.command()
def power(
    action: Annotated[str, typer.Argument(metavar="ACTION", help="status, on, off (hard), soft (ACPI) or cycle")],
    nodes: Annotated[str, typer.Argument(metavar="NODES", help="node(s) with a bmc in cluster.yml, e.g. dgx[01-04]")],
    inventory: InventoryOpt = None,
    force: Annotated[
        bool, typer.Option("--force", help="off/soft/cycle even a node with running jobs or a non-compute node")
    ] = False,
    timeout: Annotated[int, typer.Option("--timeout", min=1, help="seconds to wait for the new power state")] = 120,
    wait: WaitOpt = 0,
) -> None:
    """Power through the nodes' BMCs (Redfish or IPMI); refuses to cut a node with running jobs."""
    from corectl.commands.power import power as run_power
    from corectl.commands.power import power_table

    site = _site(inventory)
    guard = contextlib.nullcontext() if action == "status" else _changing(site, wait)
    with guard:
        results = run_power(site, action, nodes, force=force, timeout=timeout, warn=_warn)
    out.print(power_table(action, results))
    failed = [r.node for r in results if not r.ok]
    if failed:
        raise CorectlError(f"power {action} failed on {', '.join(failed)}")


@upgrade_app.command("drivers")
def upgrade_drivers(
    inventory: InventoryOpt = None,
    batch: Annotated[int, typer.Option("--batch", "-b", min=1, help="nodes upgraded at a time")] = 1,
    timeout: Annotated[
        int, typer.Option("--timeout", min=60, help="seconds to wait for a node's running jobs to end")
    ] = 3600,
    limit: Annotated[
        str | None, typer.Option("--limit", "-l", metavar="HOSTS", help="only these GPU nodes, e.g. dgx[01-04]")
    ] = None,
    wait: WaitOpt = 0,
) -> None:
    """Rolling, drain-aware upgrade to group_vars' nvidia_driver_version: idle nodes first, no job killed."""
    from corectl.commands.upgrade import upgrade_drivers as run_upgrade

    site = _site(inventory)
    with _changing(site, wait):
        results = run_upgrade(site, out, batch=batch, timeout=timeout, limit=limit)
    out.print(f"upgrade drivers: {len(results)} batch(es) done", highlight=False)


@app.command()
def runs(
    inventory: InventoryOpt = None,
    last: Annotated[int, typer.Option(help="how many runs to list")] = 20,
    show: Annotated[
        str | None, typer.Option("--show", help="what one run changed, per host and task: a run id, a prefix, or last")
    ] = None,
) -> None:
    """List past runs (when, command, result, hosts changed/failed) from the kept artifacts."""
    from corectl.commands.history import runs_table, show_run

    site = _site(inventory)
    out.print(show_run(site, show) if show else runs_table(site, last))


@secrets_app.command("init")
def secrets_init(inventory: InventoryOpt = None, wait: WaitOpt = 0) -> None:
    """Generate every missing secret of the site (existing ones are kept), vault-encrypted."""
    from corectl import secrets

    site = _site(inventory)
    with _changing(site, wait):
        made = secrets.init(site)
        secrets.check(site)
    for item in made:
        out.print(f"generated {item}")
    out.print(f"{site.name}: secrets complete ({len(made)} generated)")


@secrets_app.command("check")
def secrets_check(inventory: InventoryOpt = None) -> None:
    """Check that every secret exists, decrypts and is no placeholder (values are never shown)."""
    from corectl import secrets

    site = _site(inventory)
    secrets.check(site)
    out.print(f"{site.name}: secrets complete")


@secrets_app.command("set-ceph-key")
def secrets_set_ceph_key(
    client: Annotated[str, typer.Argument(help="cephx client id, without 'client.'")],
    inventory: InventoryOpt = None,
    wait: WaitOpt = 0,
) -> None:
    """Store a CephFS client key read from standard input (ceph auth get-key client.ID | ...)."""
    from corectl import secrets

    site = _site(inventory)
    key = sys.stdin.read()
    with _changing(site, wait):
        secrets.set_ceph_key(site, client, key)
    out.print(f"{site.name}: key for client.{client} stored (vault-encrypted)")


@secrets_app.command("set-bmc")
def secrets_set_bmc(
    user: Annotated[str, typer.Option("--user", help="the BMC user corectl logs in as")],
    inventory: InventoryOpt = None,
    wait: WaitOpt = 0,
) -> None:
    """Store the nodes' BMC user and password (read from standard input), vault-encrypted."""
    from corectl import secrets

    site = _site(inventory)
    password = (
        sys.stdin.readline().rstrip("\n") if not sys.stdin.isatty() else typer.prompt("BMC password", hide_input=True)
    )
    with _changing(site, wait):
        secrets.set_bmc_credentials(site, user, password)
    out.print(f"{site.name}: BMC credentials for {user} stored (vault-encrypted)")


@runners_app.command("bootstrap")
def runners_bootstrap(inventory: InventoryOpt = None) -> None:
    """Install this host's ansible-core, ansible-runner and collections on every runner host."""
    from corectl.commands.runners import bootstrap_runners

    bootstrap_runners(_site(inventory), out)


@lab_app.command("up")
def lab_up(
    inventory: Annotated[str, typer.Option("--inventory", "-i", help="lab site name or directory")] = "lab",
    nodes: Annotated[int, typer.Option("--nodes", "-n", min=1, max=32, help="DGX stand-ins beside the head")] = 2,
    subnet: Annotated[str, typer.Option(help="private docker network for the nodes")] = "172.29.10.0/24",
    ssh_port_base: Annotated[int, typer.Option(help="head's sshd on 127.0.0.1:BASE, dgxNN on BASE+NN")] = 22100,
    prefix: Annotated[str, typer.Option(help="node name prefix (two labs on one machine need distinct names)")] = "",
    ceph: Annotated[bool, typer.Option("--ceph/--no-ceph", help="a stand-in Ceph cluster, mounted at /shared")] = True,
    runners: Annotated[
        int, typer.Option(min=0, max=8, help="runner host stand-ins; runs fan out over them, a rack per DGX")
    ] = 0,
    wait: WaitOpt = 0,
) -> None:
    """Start a head node and N DGX stand-ins and write the lab inventory for them."""
    from corectl.commands.lab import lab_up as start
    from corectl.lab.nodes import LabSpec

    site = _site(inventory)
    spec = LabSpec(
        site=site, computes=nodes, subnet=subnet, ssh_port_base=ssh_port_base, prefix=prefix, ceph=ceph, runners=runners
    )
    site.directory.mkdir(parents=True, exist_ok=True)  # a new lab's site: locked like any other
    with _changing(site, wait):
        started, ceph_address = start(spec)
    for node in [*started, *spec.runner_hosts()]:
        out.print(f"{node.name:8} {node.address:15} ssh 127.0.0.1:{node.ssh_port}")
    if ceph_address:
        out.print(f"{'ceph':8} {ceph_address:15} stand-in Ceph (mon, mgr, OSD, MDS): CephFS mounted at /shared")
    out.print(f"lab '{site.name}' is up; next: corectl provision --inventory {inventory}")


@lab_app.command("down")
def lab_down(
    inventory: Annotated[str, typer.Option("--inventory", "-i", help="lab site name or directory")] = "lab",
    wait: WaitOpt = 0,
) -> None:
    """Remove the lab's containers, network, cgroup leftovers and cached facts."""
    from corectl.lab.nodes import down

    site = _site(inventory)
    with _changing(site, wait):
        removed = down(site)
    out.print(f"lab '{site.name}' removed ({len(removed)} nodes)")


@lab_app.command("image")
def lab_image() -> None:
    """Build the stand-in node image if missing (starting Docker if needed); print its tag."""
    from corectl.lab.image import ensure_image

    out.print(ensure_image())


@lab_app.command("add")
def lab_add(
    inventory: Annotated[str, typer.Option("--inventory", "-i", help="lab site name or directory")] = "lab",
    bare: Annotated[
        bool,
        typer.Option("--bare", help="like a fresh machine: no corectl key; admin user dgxadmin (password in .lab/)"),
    ] = False,
    wait: WaitOpt = 0,
) -> None:
    """Start one more DGX stand-in beside a running lab (declare it with corectl add-node)."""
    from corectl.lab.nodes import add

    site = _site(inventory)
    with _changing(site, wait):
        node = add(site, bare=bare)
    out.print(f"{node.name:8} {node.address:15} ssh 127.0.0.1:{node.ssh_port}")
    out.print(
        f"next: corectl add-node {node.name} --inventory {inventory} --address {node.address} "
        f"--profile dgx-standin --leaf leaf1 --ssh-host 127.0.0.1 --ssh-port {node.ssh_port}",
        highlight=False,
        soft_wrap=True,
    )


@lab_app.command("repo")
def lab_repo(
    name: Annotated[str, typer.Option(help="container name")],
    network: Annotated[str, typer.Option(help="docker network to serve on")] = "",
    address: Annotated[str, typer.Option(help="the server's address on that network")] = "",
    stop: Annotated[bool, typer.Option("--stop", help="remove the server instead")] = False,
) -> None:
    """Serve the stand-in package repository (tests/standin) on a test network; print its URL."""
    from corectl.lab import repo

    if stop:
        repo.stop(name)
        return
    if not network or not address:
        raise CorectlError("lab repo: --network and --address are required to serve", exit_code=2)
    out.print(repo.serve(name, network, address, label=name))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
