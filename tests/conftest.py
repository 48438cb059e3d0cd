from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture
def core_copy(tmp_path: Path) -> Path:
    """A writable copy of inventories/core as a site directory."""
    site = tmp_path / "core"
    site.mkdir()
    shutil.copy(ROOT / "inventories" / "core" / "cluster.yml", site / "cluster.yml")
    return site
