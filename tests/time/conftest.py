from pathlib import Path

import pytest


@pytest.fixture
def location(tmp_path: Path) -> str:
    """A checkpoint directory URL on the local filesystem."""
    directory = tmp_path / "chk-1"
    directory.mkdir()
    return "file://" + str(directory)
