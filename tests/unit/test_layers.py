"""The layer contracts of pyproject.toml ([tool.importlinter]) hold for the code, and each one
fails when its rule is broken on purpose (in a copy of the package)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

# contract id -> (module of the copy, the import appended to it)
BREAKS = {
    "layers": ("site/render.py", "from corectl.commands import status"),
    "commands-independent": ("commands/health.py", "from corectl.commands import power"),
    "one-ansible-boundary": ("health/report.py", "import ansible_runner"),
    "one-run-entry": ("slurm.py", "from corectl.ansible import runner"),
    "cli-thin": ("cli/site.py", "from corectl.site import model"),
    # the run's events are below the runner, which records runs with them
    "no-cycles": ("ansible/events.py", "from corectl.ansible import runner"),
}


def lint_imports(source_root: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    options = [arg for contract in contracts for arg in ("--contract", contract)]
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache", *options],
        env={**os.environ, "PYTHONPATH": str(source_root)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_code_keeps_every_contract():
    result = lint_imports(ROOT / "src")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {len(BREAKS)} kept, 0 broken." in result.stdout


@pytest.mark.parametrize("contract", sorted(BREAKS))
def test_a_contract_breaks_when_its_rule_is_broken(contract: str, tmp_path: Path):
    shutil.copytree(ROOT / "src" / "corectl", tmp_path / "corectl", ignore=shutil.ignore_patterns("__pycache__"))
    module, line = BREAKS[contract]
    target = tmp_path / "corectl" / module
    target.write_text(target.read_text() + f"\n{line}  # broken on purpose\n")
    result = lint_imports(tmp_path, contract)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout and "0 kept, 1 broken" in result.stdout, result.stdout
