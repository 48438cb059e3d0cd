"""init: scaffold a new site (a commented cluster.yml that validates, group_vars/, secrets)."""

from __future__ import annotations

import re
import shutil
from importlib import resources

from corectl import secrets
from corectl.errors import CorectlError
from corectl.files import atomic_write
from corectl.site import LAB, Site

SITE_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


def _scaffold(name: str, site: str) -> bytes:
    text = resources.files("corectl").joinpath("scaffold", name).read_text(encoding="utf-8")
    return text.format(site=site).encode()


def check_name(name: str) -> None:
    if not SITE_NAME.match(name):
        raise CorectlError(
            f"init {name!r}: a site name is a lower-case letter, then letters, digits, '-' or '_' (at most 32)",
            exit_code=2,
        )
    if name == LAB:
        raise CorectlError("init lab: the lab site is written by `corectl lab up`", exit_code=2)


def init_site(site: Site) -> list[str]:
    """Write the new site's files; refuse a site that has a cluster.yml already. Returns what was
    written (secrets included, generated as `corectl secrets init` does)."""
    check_name(site.name)
    if site.cluster_file.exists():
        raise CorectlError(f"{site.cluster_file}: exists already; init never overwrites a site", exit_code=2)
    created = not site.directory.exists()
    group_vars = site.directory / "group_vars" / "all.yml"
    try:
        group_vars.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(site.cluster_file, _scaffold("cluster.yml.in", site.name), 0o644)
        if not group_vars.exists():
            atomic_write(group_vars, _scaffold("group_vars_all.yml.in", site.name), 0o644)
        made = secrets.init(site)
    except BaseException:
        if created:  # all or nothing: a half-made site is no site
            shutil.rmtree(site.directory, ignore_errors=True)
        raise
    return [str(site.cluster_file), str(group_vars), *made]


def next_steps(site: Site, password_env_set: bool) -> list[str]:
    """What `corectl init` prints after the files: where the vault password is, and what to do next."""
    lines = []
    if not password_env_set:
        password_file = secrets.SecretFiles(site).default_password_file
        lines.append(
            f"vault password: {password_file} (git-ignored, mode 0600); keep a copy in your password manager, "
            "or move it off this disk and set CORECTL_VAULT_PASSWORD_FILE"
        )
    lines.append(f"next: edit {site.cluster_file}, then corectl validate --inventory {site.name}")
    return lines
