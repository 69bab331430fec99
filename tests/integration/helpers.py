"""Helpers for tests that run real processes."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent
# Fake job ids (random, from here up) of agents run on this host, above every test
# worker's sandbox job ids (sandbox_fixture.first_job_id): a scan for the processes
# of a sandbox job never finds a local agent's, nor the other way round.
LOCAL_JOB_IDS = 100_000


def wait_for(
    condition: Callable[[], bool], timeout_s: float = 20.0, what: str = "condition"
) -> None:
    """Poll ``condition`` until it holds; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def base_env(**extra: str) -> dict[str, str]:
    """A minimal child environment: the venv's bin first, system tools after."""
    env = {
        "PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
    }
    env.update(extra)
    return env


def flip_a_tensor_byte(shard: Path) -> None:
    """Flip a bit inside a saved tensor's bytes in ``shard`` (a file of a sharded
    checkpoint), not in DCP's or the zip's structure: damage torch would load without a
    word. The checkpoint's .metadata says where each item lies in the shard (the largest
    is taken); each item there is a torch.save zip whose first tensor's storage is
    the entry ``.../data/0``, after its local header (30 bytes, its name, its extra)."""
    import io
    import struct
    import zipfile

    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(shard.parent).read_metadata()
    place = max(
        (item for item in metadata.storage_data.values() if item.relative_path == shard.name),
        key=lambda item: item.length,
    )
    with open(shard, "r+b") as handle:
        handle.seek(place.offset)
        raw = handle.read(place.length)
        [entry] = [
            i for i in zipfile.ZipFile(io.BytesIO(raw)).infolist() if i.filename.endswith("/data/0")
        ]
        name_len, extra_len = struct.unpack(
            "<HH", raw[entry.header_offset + 26 : entry.header_offset + 30]
        )
        at = place.offset + entry.header_offset + 30 + name_len + extra_len + 5
        handle.seek(at)
        byte = handle.read(1)
        handle.seek(at)
        handle.write(bytes([byte[0] ^ 0x40]))
