"""The GPU handover epilog step (roles/slurm/files/corectl-gpu-handover): its parsing, its choice of
what to kill, and a whole run against the stand-in nvidia-smi with real processes on this host."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from conftest import ROOT, SAMPLES, STANDIN

PROGRAM = ROOT / "roles" / "slurm" / "files" / "corectl-gpu-handover"


def load_program() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("corectl_gpu_handover", str(PROGRAM))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module  # dataclasses look their module up while the class is made
    loader.exec_module(module)
    return module


handover = load_program()


def test_job_gpus_reads_slurms_lists_and_ranges():
    assert handover.job_gpus("") == set()
    assert handover.job_gpus("4") == {4}
    assert handover.job_gpus("0,1,4-6") == {0, 1, 4, 5, 6}
    assert handover.job_gpus("x,2") == {2}


def test_minor_numbers_from_a_real_report():
    report = (SAMPLES / "nvidia-smi-q.h100-sxm.545.23.08.txt").read_text()
    assert handover.minor_numbers(report) == {"GPU-10f35015-e921-bfab-2eb8-4e9b6664d5f1": 0}


def test_compute_apps_keep_only_gpus_with_a_device_number():
    minors = {"GPU-a": 0, "GPU-b": 5}
    text = "101, /usr/bin/python3, GPU-b\n102, /opt/app, with comma, GPU-a\n103, /bin/x, GPU-unknown\n\n"
    assert handover.compute_apps(text, minors) == [
        handover.App(101, "/usr/bin/python3", 5),
        handover.App(102, "/opt/app, with comma", 0),
    ]


def test_owning_job_from_cgroup_v2_and_v1_paths():
    assert handover.owning_job("0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n") == "42"
    assert handover.owning_job("4:memory:/slurm/uid_1000/job_7/step_batch\n") == "7"
    assert handover.owning_job("0::/system.slice/ssh.service\n") is None


def test_targets_spare_other_jobs_named_daemons_and_other_gpus():
    App = handover.App
    apps = [
        App(201, "/usr/bin/python3", 4),  # left by job 9: killed
        App(202, "/usr/bin/python3", 5),  # in job 10's cgroup on a shared GPU: spared
        App(203, "/usr/bin/nv-hostengine", 4),  # named spare
        App(204, "/usr/bin/python3", 1),  # not the job's GPU
        App(1, "/sbin/init", 4),  # never pid 1
        App(205, "/usr/bin/python3", 6),  # in the job's own cgroup still: killed
    ]
    cgroups = {202: "0::/system.slice/slurmstepd.scope/job_10/step_0\n", 205: "0::/slurmstepd.scope/job_9/step_0\n"}
    chosen = handover.targets(apps, {4, 5, 6}, "9", {"nv-hostengine"}, lambda pid: cgroups.get(pid, "0::/\n"))
    assert [app.pid for app in chosen] == [201, 205]


@pytest.fixture
def gpu_node(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A simulated 8-GPU node (the stand-in tools' state in tmp_path) and its environment."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "driver-version").write_text("580.95.05\n")
    env = dict(
        os.environ,
        GPU_SIM_STATE=str(tmp_path / "gpus.json"),
        GPU_SIM_LIB=str(lib),
        GPU_SIM_RUN=str(tmp_path / "run"),
        GPU_SIM_SYSFS=str(tmp_path / "sysfs"),
        GPU_SIM_DEV=str(tmp_path / "dev"),
        GPU_SIM_MODULES=str(tmp_path / "modules"),
        PYTHONDONTWRITEBYTECODE="1",
    )
    gpu_sim(env, "init", "--hostname", "dgx01")
    yield env


def gpu_sim(env: dict[str, str], *args: str) -> None:
    subprocess.run([sys.executable, str(STANDIN / "gpusim" / "gpu_sim.py"), *args], env=env, check=True, timeout=30)


def run_handover(env: dict[str, str], tmp_path: Path, gpus: str) -> tuple[subprocess.CompletedProcess[str], list]:
    """One epilog run for job 77 on `gpus`; what it printed and the scontrol calls it made."""
    calls = tmp_path / "scontrol-calls"
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {calls}\n')
    scontrol.chmod(0o755)
    done = subprocess.run(
        [sys.executable, str(PROGRAM), "--grace", "5", "--spare", "nv-hostengine",
         "--nvidia-smi", str(STANDIN / "driver" / "nvidia_smi.py"), "--scontrol", str(scontrol)],
        env=dict(env, SLURM_JOB_ID="77", SLURM_JOB_GPUS=gpus, SLURMD_NODENAME="dgx01"),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    made = calls.read_text().splitlines() if calls.exists() else []
    return done, made


def test_a_run_kills_what_the_job_left_and_drains_when_a_gpu_stays_held(gpu_node: dict[str, str], tmp_path: Path):
    left = subprocess.Popen(["sleep", "120"])  # on the job's GPU 5
    other = subprocess.Popen(["sleep", "120"])  # on GPU 1, another job's
    stuck = subprocess.Popen(["sleep", "120"])  # on the job's GPU 6, its context never released
    try:
        gpu_sim(gpu_node, "attach", "--gpu", "5", "--pid", str(left.pid))
        gpu_sim(gpu_node, "attach", "--gpu", "1", "--pid", str(other.pid))
        done, calls = run_handover(gpu_node, tmp_path, "4-5")
        assert done.returncode == 0, done.stderr
        assert left.wait(timeout=10) == -15  # SIGTERM was enough
        assert other.poll() is None
        assert calls == []
        assert f"pid {left.pid} (/usr/bin/sleep) left on GPU 5: terminating" in done.stderr

        gpu_sim(gpu_node, "attach", "--gpu", "6", "--pid", str(stuck.pid), "--stuck")
        done, calls = run_handover(gpu_node, tmp_path, "6,7")
        assert done.returncode == 0, done.stderr  # the remaining epilog steps still run
        assert stuck.wait(timeout=10) == -15
        assert other.poll() is None
        reason = f"corectl-epilog: job 77 left pid {stuck.pid} (sleep) on GPU 6, still there after SIGKILL"
        assert calls == [f"update nodename=dgx01 state=drain reason={reason}"]
    finally:
        for proc in (left, other, stuck):
            proc.kill()
            proc.wait()


def test_no_gpus_or_no_nvidia_smi_is_a_quiet_success(gpu_node: dict[str, str], tmp_path: Path):
    done, calls = run_handover(gpu_node, tmp_path, "")
    assert (done.returncode, done.stderr, calls) == (0, "", [])
    state = json.loads(Path(gpu_node["GPU_SIM_STATE"]).read_text())
    (Path(gpu_node["GPU_SIM_LIB"]) / "driver-version").unlink()  # the driver is gone: nvidia-smi fails
    assert state["gpus"]
    done, calls = run_handover(gpu_node, tmp_path, "0")
    assert done.returncode == 0 and calls == []
    assert "cannot list the processes on GPUs [0]" in done.stderr
