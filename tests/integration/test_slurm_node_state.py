"""corectl.fleet.slurm_node_state (playbooks/node-state.yml's drain and resume) and slurm_node_info (burn-in.yml's
read) as Ansible runs them: the modules and the two modules they share with corectl (module_utils links to
corectl.node_state and corectl.drain_reason) bundled by Ansible, against a sinfo and an scontrol that keep the
nodes in a file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

# sinfo prints the file (node|state|reason, SINFO_FORMAT's shape); scontrol update sets what it names
FAKE_SINFO = """#!/bin/sh
nodes=$(printf '%s\\n' "$@" | sed -n 's/^--nodes=//p' | tr , '|')
grep -E "^($nodes)[|]" "$SLURM_NODES"
"""
FAKE_SCONTROL = f"""#!{sys.executable}
import os, sys
args = dict(a.split("=", 1) for a in sys.argv[2:])
path = os.environ["SLURM_NODES"]
rows = [line.split("|", 2) for line in open(path).read().splitlines()]
with open(os.environ["SLURM_NODES"] + ".log", "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
names = args["nodename"].split(",")
if args["state"] == "resume" and any(r[1] == "idle" for r in rows if r[0] in names):
    sys.exit("slurm_update error: Invalid node state specified")
for row in rows:
    if row[0] in names:
        row[1:] = ["drain", args["reason"]] if args["state"] == "drain" else ["idle", "none"]
open(path, "w").write("".join("|".join(r) + "\\n" for r in rows))
"""


def module(
    tmp_path: Path, rows: list[str], *, check: bool = False, module_name: str = "slurm_node_state", **args: object
) -> dict:
    """One run of the module on localhost over the nodes' file; its result."""
    tools = tmp_path / "bin"
    if not tools.is_dir():
        tools.mkdir()
        for name, text in (("sinfo", FAKE_SINFO), ("scontrol", FAKE_SCONTROL)):
            (tools / name).write_text(text)
            (tools / name).chmod(0o755)
    state = tmp_path / "nodes"
    if rows:  # else: as the last run left them
        state.write_text("".join(f"{line}\n" for line in rows))
    env = {
        **os.environ,
        "PATH": f"{tools}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "SLURM_NODES": str(state),
        "ANSIBLE_COLLECTIONS_PATH": str(ROOT / "collections"),
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
        "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
    }
    argv = [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-i", "localhost,"]
    argv += ["-m", f"corectl.fleet.{module_name}", "-a", json.dumps(args), *(["--check"] if check else [])]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False)
    assert done.stdout, done.stderr
    return json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_drain_resume_and_only_source_through_ansible(tmp_path: Path):
    log = tmp_path / "nodes.log"
    nodes = ["dgx01|idle|none", "dgx02|mix|none", "dgx03|drain|corectl drain: rack 4", "dgx04|down*|Not responding"]
    drained = module(tmp_path, nodes, nodes="dgx01,dgx02", state="drain", reason="corectl drain: cable")
    assert drained["changed"] and drained["updated"] == ["dgx01", "dgx02"]
    assert drained["after"]["dgx02"] == {"state": "drain", "reason": "corectl drain: cable"}
    assert drained["before"] == {n: {"state": s, "reason": ""} for n, s in (("dgx01", "idle"), ("dgx02", "mix"))}
    assert drained["drained"] == ["dgx01", "dgx02"]
    down = module(tmp_path, [], nodes="dgx03,dgx04", state="drain", reason="corectl drain: cable", check=True)
    assert down["before"]["dgx04"] == {"state": "down*", "reason": "Not responding"}  # sinfo's flag kept
    assert down["updated"] == ["dgx03", "dgx04"] and down["drained"] == ["dgx03"]  # check mode: as before

    again = module(tmp_path, [], nodes="dgx01,dgx02", state="drain", reason="corectl drain: cable")
    assert not again["changed"] and again["updated"] == []  # already drained with this reason: no update
    assert log.read_text().count("update") == 1

    health = "corectl-health: xid: Xid 79 on GPU 3"
    nodes = ["dgx01|drain|" + health, "dgx02|drng|corectl drain: cable", "dgx03|idle|none"]
    only = module(tmp_path, nodes, nodes="dgx01,dgx02,dgx03", state="resume", only_source="health")
    assert only["updated"] == ["dgx01"] and only["drained"] == ["dgx02"]  # an operator's drain is kept
    assert log.read_text().splitlines()[-1] == "update nodename=dgx01 state=resume"

    every = module(tmp_path, [], nodes="dgx01,dgx02,dgx03", state="resume", check=True)
    assert every["changed"] and every["updated"] == ["dgx02"] and every["drained"] == ["dgx02"]  # check mode
    assert log.read_text().count("update") == 2

    # Slurm's own health program resumed it between the read and the update: the state asked for, not a failure
    raced = ["dgx01|drain|" + health]
    (tmp_path / "bin" / "sinfo").write_text(FAKE_SINFO + 'sed -i "s/|drain|.*/|idle|none/" "$SLURM_NODES"\n')
    resumed = module(tmp_path, raced, nodes="dgx01", state="resume")
    assert not resumed.get("failed") and resumed["after"]["dgx01"] == {"state": "idle", "reason": ""}

    # the driver upgrade's drain: a node drained for another reason keeps it (and is not resumed after)
    rows = ["dgx01|drng|corectl drain: cable", "dgx02|idle|none"]
    kept = module(tmp_path, rows, nodes="dgx01,dgx02", state="drain", reason="corectl upgrade", keep_drained=True)
    assert kept["updated"] == ["dgx02"] and kept["after"]["dgx01"]["reason"] == "corectl drain: cable"
    assert log.read_text().splitlines()[-1] == "update nodename=dgx02 state=drain reason=corectl upgrade"

    refused = module(tmp_path, [], nodes="dgx01", state="drain")
    assert refused["failed"] and "reason" in refused["msg"]


def test_the_info_module_reads_states_reasons_and_drains_through_ansible(tmp_path: Path):
    """corectl.fleet.slurm_node_info (burn-in.yml's read of a node): drained means drained or draining, down or
    not; sinfo's "none" is no reason; nothing is updated, in check mode or not."""
    nodes = [
        "dgx01|idle|none",
        "dgx02|drng|corectl-health: xid: Xid 79",
        "dgx03|drain*|x",
        "dgx04|down*|Not responding",
    ]
    for check in (False, True):
        read = module(tmp_path, nodes, module_name="slurm_node_info", check=check, nodes="dgx01,dgx02,dgx03,dgx04")
        assert not read["changed"]
        assert read["nodes"] == {
            "dgx01": {"state": "idle", "reason": "", "drained": False},
            "dgx02": {"state": "drng", "reason": "corectl-health: xid: Xid 79", "drained": True},
            "dgx03": {"state": "drain*", "reason": "x", "drained": True},
            "dgx04": {"state": "down*", "reason": "Not responding", "drained": False},
        }
    assert not (tmp_path / "nodes.log").exists()  # no scontrol update
