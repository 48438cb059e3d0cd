"""The programs the roles ship as zipapps (the health checker, corectl-backup) are their packages as they are:
tools/zipapps.py builds the same bytes from them on any machine, and each runs as the role installs it."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import zipapps


def test_every_shipped_zipapp_is_built_from_its_package():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "zipapps.py"), "--check"], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_a_zipapp_holds_its_package_and_an_entry_and_runs_as_installed():
    for app in zipapps.ZIPAPPS:
        shipped = ROOT / app.target
        package = ROOT / app.package
        with zipfile.ZipFile(shipped) as zipped:
            names = zipped.namelist()
            assert names[0] == "__main__.py"
            assert sorted(names[1:]) == sorted(f"{package.name}/{p.name}" for p in package.glob("*.py"))
            assert {info.date_time for info in zipped.infolist()} == {zipapps.STAMP}
        assert shipped.read_bytes().startswith(b"#!/usr/bin/python3\n") and shipped.stat().st_mode & 0o111
        done = subprocess.run([str(shipped), "--help"], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0 and done.stdout.startswith(f"usage: {shipped.name} "), done.stderr


def test_a_stale_zipapp_is_found(tmp_path, monkeypatch):
    app = zipapps.ZIPAPPS[1]
    copy = tmp_path / "corectl-backup"
    copy.write_bytes(app.archive()[:-1] + b"x")
    monkeypatch.setattr(zipapps, "ROOT", ROOT)
    monkeypatch.setattr(zipapps, "ZIPAPPS", (app._replace(target=str(copy)),))
    assert zipapps.main(["--check"]) == 1
