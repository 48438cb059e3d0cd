"""The lab site's description, written by `corectl lab up`: its cluster.yml from a template
(corectl/lab/templates/cluster.yml.j2) and its group_vars (templates/group_vars.yml, how stand-ins differ
from metal), with the comments an operator reads."""

from __future__ import annotations

from importlib import resources

import jinja2
import yaml

from corectl import hostlist
from corectl.files import write_if_changed
from corectl.lab import bmc
from corectl.lab.spec import LabSpec

LAB_USER = "alice"  # a declared user whose SSH key the lab keeps in .lab/ (try logins as a user)
HEADER = "# Written by `corectl lab up`; `corectl lab up` rewrites it. See docs/testing.md.\n"


def _template(name: str) -> str:
    return resources.files("corectl.lab").joinpath("templates", name).read_text(encoding="utf-8")


def cluster_text(spec: LabSpec, user_key: str | None = None) -> str:
    """The lab's cluster.yml: a head node and N DGX stand-ins on one leaf switch (a second head, `lab add
    --head`, is declared by the operator). ``user_key``: the public SSH key declared for LAB_USER."""
    declared = spec.nodes()[: 1 + spec.computes]
    nodes = [
        {**vars(n), "index": i, "bmc": None if n.head else bmc.declaration(n.address, i)}
        for i, n in enumerate(declared)
    ]
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    return environment.from_string(_template("cluster.yml.j2")).render(
        name=spec.site.name.replace("_", "-"),
        site=spec.site.name,
        head=declared[0],
        nodes=nodes,
        computes=hostlist.compress([n.name for n in declared if not n.head]),
        user=LAB_USER,
        user_key=user_key,
        runners=spec.runner_hosts() if spec.runners else [],
        ceph=spec.ceph_address() if spec.ceph else "",
    )


def lab_cluster(spec: LabSpec, user_key: str | None = None) -> dict:
    """The lab's cluster.yml as data."""
    return yaml.safe_load(cluster_text(spec, user_key))


def group_vars_text(repo_vars: dict | None = None) -> str:
    """The lab's group_vars/all.yml: how stand-ins differ from metal, then the stand-in package repository's
    locations (corectl.lab.repo)."""
    text = _template("group_vars.yml")
    if repo_vars:
        text += "\n# the stand-in package repository (corectl.lab.repo)\n"
        text += yaml.safe_dump(repo_vars, sort_keys=False, default_flow_style=False, width=100)
    return text


def write_inventory(spec: LabSpec, repo_vars: dict | None = None, user_key: str | None = None) -> None:
    site = spec.site
    (site.directory / "group_vars").mkdir(parents=True, exist_ok=True)
    (site.directory / "host_vars").mkdir(parents=True, exist_ok=True)
    write_if_changed(site.cluster_file, cluster_text(spec, user_key))
    write_if_changed(site.directory / "group_vars" / "all.yml", group_vars_text(repo_vars))
    head = spec.nodes()[0]
    host_vars = {"base_chrony_allow": [spec.subnet], "base_chrony_local_stratum": 8}
    write_if_changed(
        site.directory / "host_vars" / f"{head.name}.yml",
        HEADER + yaml.safe_dump(host_vars, sort_keys=False, default_flow_style=False, width=100),
    )
