from pathlib import Path

import pytest

from streamsnap.state import HashMapKeyedStateBackend, KeyGroupRange
from streamsnap.state.backends.changelog import ChangelogConfig
from streamsnap.state.backends.rocksdb.backend import RocksDBKeyedStateBackend
from streamsnap.state.backends.rocksdb.config import RocksDBConfig

BACKEND_KINDS = ("hashmap", "rocksdb")
# RocksDB in changelog mode (materializations only when a test starts one): a module opts in by
# overriding `backend_kind` with these params.
CHANGELOG_KIND = "rocksdb-changelog"
CHANGELOG = ChangelogConfig(materialization_interval=3600.0)


@pytest.fixture
def location(tmp_path: Path) -> str:
    """A checkpoint directory URL on the local filesystem."""
    directory = tmp_path / "chk-1"
    directory.mkdir()
    return "file://" + str(directory)


def files_in(url: str) -> list[str]:
    return sorted(p.name for p in Path(url.removeprefix("file://")).iterdir())


def make_backend(kind: str, max_parallelism: int, kg_range: KeyGroupRange, uid: str = "op",
                 config: RocksDBConfig | None = None):
    """A keyed state backend of `kind` ("hashmap" or "rocksdb")."""
    if kind == "hashmap":
        return HashMapKeyedStateBackend(uid, max_parallelism, kg_range)
    return RocksDBKeyedStateBackend(uid, max_parallelism, kg_range, config)


@pytest.fixture(params=BACKEND_KINDS)
def backend_kind(request) -> str:
    """Runs a test once per keyed state backend."""
    return request.param


@pytest.fixture
def new_backend(backend_kind, tmp_path):
    """Factory of backends of the test's `backend_kind` (RocksDB ones under tmp_path),
    disposed after the test."""
    created = []

    def new(kg_range: KeyGroupRange, max_parallelism: int = 128, uid: str = "op", **config):
        cfg = None
        if backend_kind == CHANGELOG_KIND:
            config.setdefault("changelog", CHANGELOG)
        if backend_kind != "hashmap":
            cfg = RocksDBConfig(local_dir=str(tmp_path / "rocksdb"), **config)
        backend = make_backend("hashmap" if cfg is None else "rocksdb", max_parallelism, kg_range, uid, cfg)
        created.append(backend)
        return backend

    yield new
    for backend in created:
        backend.dispose()
