"""Issue 46: `corectl -v` shows what Ansible does. The option sets Ansible's own ANSIBLE_VERBOSITY for the command's
runs, and the live progress prints what Ansible says for each event, which it does not without it."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from conftest import probe_project
from corectl.ansible.events import RunRequest
from corectl.ansible.runner import run_playbook
from corectl.cli import app
from corectl.progress import LiveProgress

PROBE = """
- name: Probe
  hosts: all
  gather_facts: false
  tasks:
    - name: A fact
      ansible.builtin.set_fact:
        corectl_probe_fact: 42
"""


@pytest.mark.parametrize(("argv", "expected"), [(["-vv", "schema"], "2"), (["schema"], None)])
def test_corectl_v_asks_ansible_to_be_verbose(argv: list[str], expected: str | None):
    # the option writes os.environ itself: kept and put back by hand (monkeypatch would restore what it last saw)
    before = os.environ.pop("ANSIBLE_VERBOSITY", None)
    try:
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 0, result.output
        assert os.environ.get("ANSIBLE_VERBOSITY") == expected
    finally:
        os.environ.pop("ANSIBLE_VERBOSITY", None)
        if before is not None:
            os.environ["ANSIBLE_VERBOSITY"] = before


def shown(tmp_path: Path, name: str) -> str:
    site = probe_project(tmp_path / name, PROBE, ("a",))
    screen = io.StringIO()
    with LiveProgress(Console(file=screen, width=200), "probe") as progress:
        result = run_playbook(RunRequest(site=site, playbook="probe.yml", command="probe", secrets=False), progress)
    assert result.ok, result.output_tail(20)
    return screen.getvalue()


def test_a_verbose_run_prints_what_ansible_says_and_a_quiet_one_does_not(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("ANSIBLE_VERBOSITY", raising=False)
    quiet = shown(tmp_path, "quiet")
    monkeypatch.setenv("ANSIBLE_VERBOSITY", "1")
    verbose = shown(tmp_path, "verbose")
    assert "PLAY Probe: 1 host, 1 ok, 0 changed, 0 failed" in quiet and "PLAY Probe: 1 host" in verbose
    # ansible-playbook -v's own lines: the configuration file it read, each result with what the module returned;
    # in a file (not a terminal) without Ansible's colour codes
    assert " as config file" in verbose and " as config file" not in quiet
    assert "ok: [a] =>" in verbose and "corectl_probe_fact: 42" in verbose, verbose
    assert "ok: [a]" not in quiet
    assert "\x1b[" not in verbose
