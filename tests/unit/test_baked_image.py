"""Issue 45: the baked stand-in image holds exactly the Debian packages the roles install.

Every ansible.builtin.apt task under roles/ (in blocks too) is read, its package names rendered with its
role's defaults and every optional feature on (OPTIONAL below), the stand-in repository's packages left
out (their install is what the GPU roles prove); what remains must be tests/standin/node-packages.yml,
with the same recommends setting as the task that installs it. A role that starts installing a package
fails here until the list has it, and a package no role installs any more fails until it leaves the list.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml
from jinja2 import StrictUndefined
from jinja2.nativetypes import NativeEnvironment

from conftest import ROOT
from corectl.lab.image import baked_packages

# the variables that switch optional installs on (each role's default leaves them off)
OPTIONAL = {
    "cephfs_mounts": [{"fuse": True}],
    "slurm_gpu_autodetect": "nvml",
}


def standin_names() -> set[str]:
    spec = importlib.util.spec_from_file_location("build_repo", ROOT / "tests" / "standin" / "build_repo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(sys.modules[spec.name])
    module = sys.modules[spec.name]
    return {pkg.name for pkg in module.all_packages()}


def environment() -> NativeEnvironment:
    from ansible.plugins.filter.core import FilterModule

    env = NativeEnvironment(undefined=StrictUndefined)
    env.filters.update(FilterModule().filters())
    return env


def facts_set(tasks: list[dict]) -> dict[str, object]:
    found: dict[str, object] = {}
    for task in tasks or []:
        for key in ("block", "rescue", "always"):
            found.update(facts_set(task.get(key, [])))
        facts = task.get("ansible.builtin.set_fact")
        if isinstance(facts, dict):
            found.update({k: v for k, v in facts.items() if k != "cacheable"})
    return found


def role_vars(env: NativeEnvironment, role: Path) -> dict[str, object]:
    """The role's defaults, the facts its tasks set, and OPTIONAL, rendered where they can be."""
    defaults = role / "defaults" / "main.yml"
    raw = yaml.safe_load(defaults.read_text()) or {} if defaults.is_file() else {}
    for path in sorted((role / "tasks").rglob("*.yml")):
        raw.update(facts_set(yaml.safe_load(path.read_text())))
    raw.update(OPTIONAL)
    values: dict[str, object] = {}
    for _ in range(5):  # defaults that refer to other defaults
        for name, value in raw.items():
            if isinstance(value, str) and "{{" in value:
                try:
                    values[name] = env.from_string(value).render({**raw, **values})
                except Exception:  # refers to one not rendered yet
                    continue
            else:
                values[name] = value
    return values


def apt_tasks(tasks: list[dict]) -> list[dict]:
    found = []
    for task in tasks or []:
        for key in ("block", "rescue", "always"):
            found += apt_tasks(task.get(key, []))
        apt = task.get("ansible.builtin.apt")
        if isinstance(apt, dict) and "name" in apt:
            found.append(apt)
    return found


def names(env: NativeEnvironment, value: object, variables: dict[str, object]) -> list[str]:
    if isinstance(value, str) and "{{" in value:
        value = env.from_string(value).render(**variables)
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        if isinstance(item, str) and "{{" in item:
            out += names(env, item, variables)
        else:
            out.append(str(item).split("=", 1)[0])  # a pinned version: pkg=1.2-3
    return out


def roles_packages() -> dict[str, bool]:
    """Each Debian package the roles install -> whether its task installs recommends."""
    env = environment()
    found: dict[str, bool] = {}
    for role in sorted((ROOT / "roles").iterdir()):
        variables = role_vars(env, role)
        for path in sorted((role / "tasks").rglob("*.yml")):
            for apt in apt_tasks(yaml.safe_load(path.read_text())):
                recommends = apt.get("install_recommends", True) is not False
                for name in names(env, apt["name"], variables):
                    found[name] = found.get(name, False) or recommends
    return found


def listed() -> tuple[dict[str, bool], dict[str, str]]:
    data = yaml.safe_load((ROOT / "tests" / "standin" / "node-packages.yml").read_text())
    packages = {name: True for name in data["packages"]}
    packages.update({name: False for name in data["packages_without_recommends"]})
    return packages, data["not_baked"]


def test_the_baked_list_is_what_the_roles_install():
    baked, not_baked = listed()
    standin = standin_names()
    assert standin, "the stand-in repository builds no package"
    wanted = {name: rec for name, rec in roles_packages().items() if name not in standin and name not in not_baked}
    missing = sorted(set(wanted) - set(baked))
    extra = sorted(set(baked) - set(wanted))
    assert not missing, f"the roles install {missing}: add them to tests/standin/node-packages.yml"
    assert not extra, f"no role installs {extra} any more: remove them from tests/standin/node-packages.yml"
    recommends = sorted(name for name in wanted if wanted[name] != baked[name])
    assert not recommends, f"{recommends}: baked with another recommends setting than their role's task"
    assert not set(not_baked) & set(baked)


def test_the_image_recipe_reads_the_same_list():
    with_recommends, without = baked_packages(ROOT)
    baked, _ = listed()
    assert with_recommends == sorted(n for n, rec in baked.items() if rec)
    assert without == sorted(n for n, rec in baked.items() if not rec)


@pytest.mark.parametrize("name", ["munge", "slurm"])
def test_fixed_ids_are_the_roles_defaults(name: str):
    from corectl.lab.image import baked_ids

    defaults = yaml.safe_load((ROOT / "roles" / name / "defaults" / "main.yml").read_text())
    assert baked_ids(ROOT)[name] == (defaults[f"{name}_uid"], defaults[f"{name}_gid"])
