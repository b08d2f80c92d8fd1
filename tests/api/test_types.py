"""The public API type-checks: mypy (the `test` extra) over the files `[tool.mypy]` in
pyproject.toml lists, and the package ships its hints (`py.typed`, in the package data)."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tomllib

import pytest

import streamsnap
from tests.api.test_public_api import PUBLIC_MODULES, load

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_package_ships_py_typed():
    assert (pathlib.Path(streamsnap.__file__).parent / "py.typed").is_file(), \
        "streamsnap/py.typed is missing: create the empty file (PEP 561)"
    data = CONFIG["tool"]["setuptools"]["package-data"]["streamsnap"]
    assert "py.typed" in data, "add \"py.typed\" to [tool.setuptools.package-data] streamsnap in pyproject.toml"


def test_mypy_checks_every_public_module():
    files = set(CONFIG["tool"]["mypy"]["files"])
    unchecked = [name for name in PUBLIC_MODULES
                 if str(pathlib.Path(load(name).__file__).relative_to(ROOT)) not in files]
    assert not unchecked, f"public modules missing from [tool.mypy] files in pyproject.toml: {unchecked}"


def test_the_public_api_type_checks(tmp_path):
    pytest.importorskip("mypy", reason="pip install -e '.[test]' (the test extra brings mypy)")
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "mypy-cache")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (
        "mypy found type errors in the public API — fix the annotations (keeping behaviour):\n"
        + done.stdout + done.stderr)
