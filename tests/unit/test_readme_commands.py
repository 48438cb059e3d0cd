"""Issue 14: the README's usage lines work as typed, from a fresh clone, against the example site.

Each `corectl ...` line of the README's "Using corectl" block runs as printed (the default site is
inventories/prod) in a copy of the project. The example's nodes are not reachable from here: the
copy adds one line to cluster.yml, a jump host on a closed loopback port, so that no SSH packet
leaves this machine. Every line ends in exit 0, or in a message that the nodes could not be
reached: never a usage error, a validation error or a traceback.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, closed_port

CORECTL = str(Path(sys.executable).parent / "corectl")
UNREACHABLE = re.compile(r"unreachable|cannot reach", re.IGNORECASE)


def readme_lines() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("## Using corectl", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith(". ")]


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("clone")
    for name in ("playbooks", "roles", "group_vars", "collections"):
        shutil.copytree(ROOT / name, root / name, symlinks=True)
    shutil.copy(ROOT / "ansible.cfg", root / "ansible.cfg")
    shutil.copytree(ROOT / "inventories" / "prod", root / "inventories" / "prod")
    cluster = root / "inventories" / "prod" / "cluster.yml"
    text = cluster.read_text()
    assert "    user: root\n" in text
    text = text.replace("    user: root\n", f"    user: root\n    jump_host: nobody@127.0.0.1:{closed_port()}\n", 1)
    # and the BMCs (corectl power, heal) at a closed loopback port, so no packet reaches 10.10.9.x
    assert "bmc: {address: 10.10.9." in text
    cluster.write_text(text.replace("bmc: {address: 10.10.9.", f"bmc: {{port: {closed_port()}, address: 127.0.9."))
    subprocess.run([CORECTL, "render", "--inventory", "prod"], env=environ(root), check=True, capture_output=True)
    (root / "home" / ".ssh").mkdir(parents=True)
    (root / "client.corectl.key").write_text("AQ" + "B" * 36 + "==\n")  # what `ceph auth get-key` prints
    (root / "bmc.password").write_text("not-a-real-bmc-password\n")
    return root


def environ(root: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith("CORECTL_")}
    return {**keep, "CORECTL_ROOT": str(root), "HOME": str(root / "home"), "NODE_ROOT_PASSWORD": "not-used"}


def run_line(line: str, root: Path) -> subprocess.CompletedProcess[str]:
    words = shlex.split(line, comments=True)
    env = environ(root)
    while "=" in words[0]:
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    stdin = stdout = None
    for op in ("<", ">"):
        if op in words:
            at = words.index(op)
            target = root / words[at + 1]
            words = words[:at] + words[at + 2 :]
            if op == "<":
                stdin = target.open()
            else:
                stdout = target.open("w")
    words = [env["HOME"] + w[1:] if w.startswith("~/") else w for w in words]  # as the shell expands it
    argv = [CORECTL, *words[1:]] if words[0] == "corectl" else words
    try:
        return subprocess.run(
            argv, cwd=root, env=env, stdin=stdin or subprocess.DEVNULL,
            stdout=stdout or subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300, check=False,
        )  # fmt: skip
    finally:
        for handle in (stdin, stdout):
            if handle is not None:
                handle.close()


def test_the_readme_block_is_what_this_test_runs():
    lines = readme_lines()
    assert len(lines) >= 15
    assert any(line.startswith("corectl add-node dgx13 ") for line in lines)
    assert all(
        shlex.split(line, comments=True)[0] in ("corectl", "ssh-keygen") or "=" in line.split()[0] for line in lines
    )


def test_every_readme_line_runs_as_typed(clone: Path):
    outcomes = []
    for line in readme_lines():
        proc = run_line(line, clone)
        said = (proc.stdout or "") + proc.stderr
        outcomes.append((line, proc.returncode, said.strip().splitlines()[-1:] if said.strip() else []))
        assert "Traceback" not in said, (line, said)
        assert "Usage:" not in said and "No such option" not in said, (line, said)
        if proc.returncode != 0:
            assert proc.returncode != 2, (line, said)
            assert UNREACHABLE.search(said), (line, proc.returncode, said)
    reached = [line for line, rc, _ in outcomes if rc != 0]
    assert any(line.startswith("corectl provision") for line in reached)  # the nodes were really tried
    assert (clone / "inventories" / "mysite" / "cluster.yml").is_file()  # the last line: corectl init mysite
