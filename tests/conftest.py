from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture
def prod_copy(tmp_path: Path) -> Path:
    """A writable copy of inventories/prod as a site directory."""
    site = tmp_path / "prod"
    site.mkdir()
    shutil.copy(ROOT / "inventories" / "prod" / "cluster.yml", site / "cluster.yml")
    return site
