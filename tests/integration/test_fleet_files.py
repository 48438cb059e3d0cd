"""corectl.fleet.files, run by ansible-playbook on this machine (connection local) against a
temporary directory: what it writes, what it reports, which handlers it notifies."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

# one pytest-xdist worker for the module, so that first_converge runs once (tests/conftest.py)
pytestmark = pytest.mark.xdist_group("fleet_files")

PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"

KEEP_RESULT = """
- name: Keep the result
  ansible.builtin.copy:
    content: "{{ written | to_json }}"
    dest: "{{ out }}/result.json"
    mode: "0644"
  check_mode: false
"""

TASKS = (
    """
- name: Write the files
  corectl.fleet.files:
    files:
      - {path: "{{ out }}/etc", state: directory, mode: "0750"}
      - {path: "{{ out }}/etc/app.conf", template: app.conf.j2, mode: "0640", notify: Restart app}
      - {path: "{{ out }}/etc/prolog", template: script.j2, vars: {item: prolog}, mode: "0755"}
      - {path: "{{ out }}/etc/tool", src: tool.sh, mode: "0755", notify: [Reload tool]}
      - {path: "{{ out }}/etc/blob", src: blob.bin, mode: "0600"}
      - {path: "{{ out }}/etc/current", state: link, src: tool}
      - {path: "{{ out }}/etc/inline", content: "value={{ app_value }}\\n", mode: "0644", notify: Restart app}
      - {path: "{{ out }}/etc/old.conf", state: absent, notify: Reload tool}
      - {path: "{{ out }}/etc/skipped", content: "x", mode: "0644", when: "{{ false }}"}
  register: written
"""
    + KEEP_RESULT
)

HANDLERS = """
- name: Restart app
  ansible.builtin.copy: {content: "", dest: "{{ out }}/fired-restart-app", mode: "0644"}
- name: Reload tool
  ansible.builtin.copy: {content: "", dest: "{{ out }}/fired-reload-tool", mode: "0644"}
"""


def make_role(tmp_path: Path) -> Path:
    base = tmp_path / "roles" / "demo"
    for part, text in {
        "tasks/main.yml": TASKS,
        "handlers/main.yml": HANDLERS,
        "templates/app.conf.j2": (
            "# {{ ansible_managed }}\n{% for n in [1, 2] %}\nline {{ n }}\n{% endfor %}\nv={{ app_value }}\n"
        ),
        "templates/script.j2": "#!/bin/sh\necho {{ item }}\n",
        "files/tool.sh": "#!/bin/sh\necho tool\n",
    }.items():
        (base / part).parent.mkdir(parents=True, exist_ok=True)
        (base / part).write_text(text)
    (base / "files" / "blob.bin").write_bytes(bytes(range(256)))
    (tmp_path / "play.yml").write_text("- hosts: localhost\n  gather_facts: false\n  roles: [demo]\n")
    return tmp_path


@pytest.fixture
def role(tmp_path: Path) -> Path:
    return make_role(tmp_path)


@pytest.fixture(scope="module")
def first_converge(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The role converged once from nothing (what test_writes_every_path_then_changes_nothing proves):
    the starting point of the tests of what a later run does, each on a copy of its own."""
    where = make_role(tmp_path_factory.mktemp("converged"))
    converge(where)
    return where


@pytest.fixture
def converged(first_converge: Path, tmp_path: Path) -> Path:
    """A copy of first_converge (modes and the symlink kept: what the files module compares)."""
    where = tmp_path / "converged"
    shutil.copytree(first_converge, where, symlinks=True)
    return where


def converge(where: Path, value: str = "1", *extra: str) -> dict:
    out = where / "out"
    out.mkdir(exist_ok=True)
    for fired in out.glob("fired-*"):
        fired.unlink()
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(where / "roles"),
        "ANSIBLE_LOCAL_TEMP": str(where / "tmp"),
    }
    argv = [str(PLAYBOOK), "-c", "local", "-i", "localhost,", str(where / "play.yml"), "-e", f"out={out}"]
    result = subprocess.run(
        [*argv, "-e", f"app_value={value}", *extra], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    outcome = json.loads((out / "result.json").read_text())
    outcome["fired"] = sorted(p.name for p in out.glob("fired-*"))
    return outcome


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_writes_every_path_then_changes_nothing(role: Path):
    out = role / "out"
    (out / "etc").mkdir(parents=True)
    (out / "etc" / "old.conf").write_text("stale\n")
    first = converge(role)
    assert first["changed"] is True
    assert first["changed_paths"] == [
        f"{out}/etc",  # mode 0750
        f"{out}/etc/app.conf",
        f"{out}/etc/prolog",
        f"{out}/etc/tool",
        f"{out}/etc/blob",
        f"{out}/etc/current",
        f"{out}/etc/inline",
        f"{out}/etc/old.conf",
    ]
    assert first["fired"] == ["fired-reload-tool", "fired-restart-app"]
    assert "invocation" not in first  # the contents stay out of the result
    assert (out / "etc" / "app.conf").read_text() == "# Ansible managed\nline 1\nline 2\nv=1\n"
    assert (out / "etc" / "prolog").read_text() == "#!/bin/sh\necho prolog\n"
    assert (out / "etc" / "blob").read_bytes() == bytes(range(256))
    assert os.readlink(out / "etc" / "current") == "tool"
    assert not (out / "etc" / "old.conf").exists()
    assert not (out / "etc" / "skipped").exists()
    assert [mode(out / "etc"), mode(out / "etc" / "app.conf"), mode(out / "etc" / "tool")] == [0o750, 0o640, 0o755]

    second = converge(role)
    assert (second["changed"], second["changed_paths"], second["fired"]) == (False, [], [])


def test_repairs_drift_and_notifies_only_the_changed_paths_handlers(converged: Path):
    role = converged
    out = role / "out"
    (out / "etc" / "tool").write_text("tampered\n")
    (out / "etc" / "app.conf").chmod(0o666)
    repaired = converge(role)
    assert repaired["changed_paths"] == [f"{out}/etc/app.conf", f"{out}/etc/tool"]
    assert repaired["fired"] == ["fired-reload-tool", "fired-restart-app"]
    assert (out / "etc" / "tool").read_text() == "#!/bin/sh\necho tool\n"
    assert mode(out / "etc" / "app.conf") == 0o640

    (out / "etc" / "tool").write_text("tampered\n")
    only_tool = converge(role)
    assert (only_tool["changed_paths"], only_tool["fired"]) == ([f"{out}/etc/tool"], ["fired-reload-tool"])

    # a changed variable reaches the template and the inline content, and only their handler
    changed_value = converge(role, "2")
    assert changed_value["changed_paths"] == [f"{out}/etc/app.conf", f"{out}/etc/inline"]
    assert changed_value["fired"] == ["fired-restart-app"]


def test_check_mode_reports_without_writing(converged: Path):
    role = converged
    out = role / "out"
    (out / "etc" / "inline").write_text("drifted\n")
    checked = converge(role, "1", "--check")
    assert checked["changed_paths"] == [f"{out}/etc/inline"]
    assert (out / "etc" / "inline").read_text() == "drifted\n"


def test_ansible_cores_private_template_helper_is_where_the_files_action_imports_it(tmp_path: Path):
    """corectl.fleet.files renders templates with ansible-core's private helper (as the template
    action does); an ansible-core release that moves it or changes its keywords fails here first."""
    import inspect

    from ansible._internal._templating import _template_vars

    parameters = inspect.signature(_template_vars.generate_ansible_template_vars).parameters
    assert {"path", "fullpath", "dest_path", "include_ansible_managed"} <= set(parameters)
    source = tmp_path / "x.j2"
    source.write_text("{{ ansible_managed }}\n")
    made = _template_vars.generate_ansible_template_vars(
        path="x.j2", fullpath=str(source), dest_path="/etc/x", include_ansible_managed=True
    )
    assert "ansible_managed" in made and made["template_path"] == "x.j2"


VALIDATED_TASKS = (
    """
- name: Write the checked file and the role's directory of files
  corectl.fleet.files:
    files: >-
      {{ [{'path': out ~ '/checked.conf', 'content': 'value=' ~ app_value, 'mode': '0640',
           'validate': 'grep -qx value=good %s'}]
         + query('ansible.builtin.fileglob', 'boards/*.json')
           | corectl.fleet.files_under(out ~ '/boards', mode='0644') }}
  register: written
"""
    + KEEP_RESULT
)


def test_validate_checks_new_content_before_it_replaces_the_file(tmp_path: Path):
    """An entry's validate command runs on the new content (mode already set) before the rename; a
    failure leaves the old file and no temporary file, and names the path. files_under puts a role
    directory's files in the same call."""
    base = tmp_path / "roles" / "demo"
    (base / "tasks").mkdir(parents=True)
    (base / "tasks" / "main.yml").write_text(VALIDATED_TASKS)
    (base / "files" / "boards").mkdir(parents=True)
    for name in ("b.json", "a.json"):
        (base / "files" / "boards" / name).write_text(f'{{"board": "{name}"}}\n')
    (tmp_path / "play.yml").write_text("- hosts: localhost\n  gather_facts: false\n  roles: [demo]\n")
    out = tmp_path / "out"
    (out / "boards").mkdir(parents=True)

    written = converge(tmp_path, "good")
    assert written["changed_paths"] == [f"{out}/checked.conf", f"{out}/boards/a.json", f"{out}/boards/b.json"]
    assert (out / "checked.conf").read_text() == "value=good"
    assert mode(out / "checked.conf") == 0o640
    assert (out / "boards" / "b.json").read_text() == '{"board": "b.json"}\n'
    assert converge(tmp_path, "good")["changed_paths"] == []  # unchanged content: validate not even run

    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(tmp_path / "roles")}
    argv = [str(PLAYBOOK), "-c", "local", "-i", "localhost,", str(tmp_path / "play.yml"), "-e", f"out={out}"]
    refused = subprocess.run([*argv, "-e", "app_value=bad"], env=env, capture_output=True, text=True, check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"{out}/checked.conf: the new content fails grep (exit 1): no output" in refused.stdout
    assert (out / "checked.conf").read_text() == "value=good"
    assert sorted(p.name for p in out.iterdir()) == ["boards", "checked.conf", "result.json"]
