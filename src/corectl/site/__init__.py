"""Where things live: the project (playbooks, roles, shared group_vars) and a site's inventory."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from corectl.errors import CorectlError


def _is_project(path: Path) -> bool:
    return (path / "playbooks" / "site.yml").is_file() and (path / "roles").is_dir()


def project_root() -> Path:
    """CORECTL_ROOT, else the nearest directory up from here holding playbooks/ and roles/."""
    env = os.environ.get("CORECTL_ROOT")
    if env:
        root = Path(env).resolve()
        if not _is_project(root):
            raise CorectlError(f"CORECTL_ROOT={env} holds no playbooks/site.yml and roles/")
        return root
    for candidate in (Path.cwd(), *Path.cwd().parents):
        if _is_project(candidate):
            return candidate
    packaged = Path(__file__).resolve().parents[3]
    if _is_project(packaged):
        return packaged
    raise CorectlError("cannot find the corectl project (playbooks/site.yml); run inside it or set CORECTL_ROOT")


@dataclass(frozen=True)
class Site:
    """One site: inventories/<name>/ with cluster.yml and everything corectl keeps for it."""

    root: Path
    directory: Path

    @property
    def name(self) -> str:
        return self.directory.name

    @property
    def cluster_file(self) -> Path:
        return self.directory / "cluster.yml"

    @property
    def hosts_file(self) -> Path:
        return self.directory / "hosts.yml"

    @property
    def runs_dir(self) -> Path:
        return self.directory / ".runs"

    @property
    def facts_dir(self) -> Path:
        return self.directory / ".facts"

    @property
    def history_db(self) -> Path:
        """The site's one store (corectl.store): verdicts, actions and drains, the runs' index, marks."""
        return self.directory / ".history.sqlite"

    @property
    def evidence_dir(self) -> Path:
        """What heal kept from nodes before a GPU reset, reboot or power cycle (<time>/<node>/)."""
        return self.directory / ".evidence"

    @property
    def site_file(self) -> Path:
        """cluster.yml's site-wide settings as Ansible variables (written by corectl render)."""
        return self.directory / "site.json"

    @property
    def known_hosts(self) -> Path:
        return self.directory / "known_hosts"

    @property
    def lab_dir(self) -> Path:
        return self.directory / ".lab"


LAB = "lab"


def default_site_name(root: Path, environ: dict[str, str] | None = None) -> str:
    """The site a command without --inventory works on: CORECTL_INVENTORY, else the only site
    (a directory with cluster.yml) under inventories/ besides the lab."""
    environ = os.environ if environ is None else environ
    named = environ.get("CORECTL_INVENTORY", "").strip()
    if named:
        return named
    base = root / "inventories"
    sites = (
        sorted(p.name for p in base.iterdir() if p.name != LAB and (p / "cluster.yml").is_file())
        if base.is_dir()
        else []
    )
    if len(sites) == 1:
        return sites[0]
    seen = f"sites under {base}: {', '.join(sites)}" if sites else f"no site under {base} besides the lab"
    raise CorectlError(
        f"which site? {seen}; name one with --inventory NAME or CORECTL_INVENTORY=NAME (corectl init NAME starts one)",
        exit_code=2,
    )


def resolve_site(inventory: str | None, root: Path | None = None) -> Site:
    """``--inventory prod`` means <root>/inventories/prod; a path (with '/') is taken as given;
    none means the default site (default_site_name)."""
    base = root or project_root()
    if inventory is None:
        inventory = default_site_name(base)
    if "/" in inventory or inventory in (".", ".."):
        directory = Path(inventory).expanduser().resolve()
    else:
        directory = base / "inventories" / inventory
    return Site(root=base, directory=directory)


def require_cluster_file(site: Site) -> None:
    if not site.cluster_file.is_file():
        raise CorectlError(f"{site.cluster_file}: not found (no site '{site.name}')", exit_code=2)
