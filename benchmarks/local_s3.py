"""The local S3-compatible server of the tests and benchmarks (scripts/s3-server: moto's, on
127.0.0.1), and the storage options a checkpoint configuration points at it with.

Why it lives here, not in tests/: the object-store tests and benchmarks/checkpoint_storage.py
share it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "s3-server")


@dataclass(frozen=True)
class LocalS3:
    endpoint: str

    @property
    def storage_options(self) -> dict:
        """What a user passes as CheckpointConfig.storage_options for this server (s3fs's options;
        moto accepts any key and secret)."""
        return {"endpoint_url": self.endpoint, "key": "testing", "secret": "testing"}

    def new_bucket(self, prefix: str = "ckpt") -> str:
        """A fresh, empty bucket; returns its name."""
        import s3fs

        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        s3fs.S3FileSystem(**self.storage_options, skip_instance_cache=True).mkdir(name)
        return name


def start_server(directory: str) -> LocalS3:
    out = subprocess.run([sys.executable, SCRIPT, "start", directory], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"scripts/s3-server start failed: {out.stderr or out.stdout}")
    return LocalS3(out.stdout.strip().splitlines()[-1])


def stop_server(directory: str) -> None:
    subprocess.run([sys.executable, SCRIPT, "stop", directory], check=True, timeout=60)
