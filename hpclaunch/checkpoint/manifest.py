"""A checkpoint's manifest: what a save committed, written inside the commit, and
checked by ``load_latest`` before it trusts the files.

    step-000000000042/hpclaunch-manifest.json   a sharded checkpoint's, in its folder
    step-000000000042.pt.manifest.json          a one-file checkpoint's, beside it

It holds the step the save was called with, the world (ranks) that saved it, the
layout version, and the size and CRC-32 of every file. CRC-32 (zlib) because it is the
fastest checksum the standard library has (about 4 GB/s on one core here, against 1
for blake2b and 1.5 for sha1; ``bench/checkpoint.py`` measures it): it is there to
catch bit rot, truncation and a file put under another step's name, not an attacker.

A sharded save's ranks each sum the files they wrote into a part
(``.hpclaunch-manifest-rank-R.json``) before torch's distributed checkpoint gathers
their write results; rank 0 merges the parts into the manifest after that gather,
before the rename that commits: no collective of its own. Pure file work, no torch.
"""

from __future__ import annotations

import enum
import json
import os
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpclaunch.jobdir.atomic import write_bytes_atomic

LAYOUT = 1  # the newest layout this hpclaunch reads and writes
NAME = "hpclaunch-manifest.json"
SIDECAR_SUFFIX = ".manifest.json"
CHECKSUM = "crc32"
_PART_PREFIX = ".hpclaunch-manifest-rank-"
_BUFFER = 8 << 20  # big reads: the sum costs less than the read below about 1 MiB


class Problem(enum.Enum):
    """Why a checkpoint failed verification; the value names it on stderr and in status."""

    CHECKSUM = "checksum mismatch"
    SIZE = "size mismatch"
    MISSING = "file missing"
    STEP = "step mismatch"
    LAYOUT = "newer layout"
    UNREADABLE = "manifest unreadable"
    LOAD = "load failed"  # not the manifest's: the load itself raised (wrong shapes)


class ManifestError(Exception):
    """A checkpoint that failed verification: ``problem`` says how, ``file`` which file
    (None: the manifest itself), the message the values found."""

    def __init__(self, problem: Problem, file: str | None, message: str) -> None:
        super().__init__(message)
        self.problem = problem
        self.file = file


class ReadError(Exception):
    """A file of the checkpoint could not be read (EIO, ESTALE, EACCES, out of memory):
    no verdict on its content, so the checkpoint must not be set aside for it.
    ``file`` names it (None: the manifest itself), ``error`` is what was raised."""

    def __init__(self, file: str | None, path: Path, error: BaseException) -> None:
        super().__init__(f"{path} cannot be read: {error}")
        self.file = file
        self.error = error


def read_failure(file: str | None, path: Path, error: OSError) -> ManifestError | ReadError:
    """What an OSError met reading ``path`` says: a file that is not there (ENOENT) is a
    verdict, MISSING; any other error (EIO, ESTALE, EACCES, EISDIR) is the filesystem's,
    not the checkpoint's: ReadError."""
    if isinstance(error, FileNotFoundError):
        return ManifestError(Problem.MISSING, file, f"{path} is missing")
    return ReadError(file, path, error)


@dataclass(frozen=True)
class FileSum:
    bytes: int
    crc32: str  # 8 hex digits


@dataclass(frozen=True)
class Manifest:
    step: int
    world: int
    layout: int
    files: Mapping[str, FileSum]  # relative path -> its size and sum, sorted by path

    def to_json(self) -> str:
        files = {name: {"bytes": s.bytes, "crc32": s.crc32} for name, s in self.files.items()}
        body = {
            "layout": self.layout,
            "step": self.step,
            "world": self.world,
            "checksum": CHECKSUM,
            "files": dict(sorted(files.items())),
        }
        return json.dumps(body, indent=1, sort_keys=True) + "\n"


def checksum(path: Path) -> FileSum:
    """The size and CRC-32 of ``path``, read in big blocks. Raises OSError."""
    crc, size = 0, 0
    block = bytearray(_BUFFER)
    view = memoryview(block)
    with open(path, "rb", buffering=0) as handle:
        while count := handle.readinto(block):
            crc = zlib.crc32(view[:count], crc)
            size += count
    return FileSum(size, f"{crc:08x}")


def sums(folder: Path, names: Iterable[str]) -> dict[str, FileSum]:
    """``checksum`` of each of ``names`` under ``folder``. Raises OSError."""
    return {name: checksum(folder / name) for name in sorted(set(names))}


def sidecar(path: Path) -> Path:
    """Where a one-file checkpoint's manifest goes."""
    return path.with_name(path.name + SIDECAR_SUFFIX)


def location(checkpoint: Path) -> Path:
    """The manifest of ``checkpoint`` (a sharded folder or a one-file checkpoint)."""
    return sidecar(checkpoint) if checkpoint.name.endswith(".pt") else checkpoint / NAME


def write(path: Path, manifest: Manifest, *, mode: int | None = None) -> None:
    """Write ``manifest`` to ``path`` atomically (fsynced); ``mode``: the file's (else
    the umask's). Raises OSError."""
    write_bytes_atomic(path, manifest.to_json().encode(), mode=mode)


def write_part(folder: Path, rank: int, files: Mapping[str, FileSum]) -> None:
    """One rank's part of a sharded save's manifest, into the save's folder. Raises OSError."""
    body = {name: {"bytes": s.bytes, "crc32": s.crc32} for name, s in sorted(files.items())}
    write_bytes_atomic(folder / f"{_PART_PREFIX}{rank}.json", json.dumps(body).encode())


def merge_parts(folder: Path, world: int) -> dict[str, FileSum]:
    """Every rank's part in ``folder``, merged, and the parts removed. Raises
    ManifestError when a rank's part is missing or unreadable (its files would go
    unchecked: the save must not commit), OSError when the folder cannot be read."""
    merged: dict[str, FileSum] = {}
    for rank in range(world):
        path = folder / f"{_PART_PREFIX}{rank}.json"
        try:
            merged.update(_files(json.loads(path.read_text()), path))
        except (OSError, ValueError) as exc:
            raise ManifestError(
                Problem.MISSING,
                path.name,
                f"rank {rank}'s part of the manifest ({path}) cannot be read: {exc}",
            ) from None
    for rank in range(world):
        (folder / f"{_PART_PREFIX}{rank}.json").unlink()
    return merged


def read(path: Path) -> Manifest | None:
    """The manifest at ``path``; None when there is none (a checkpoint saved before
    hpclaunch wrote manifests). Raises ManifestError when it cannot be parsed (not
    UTF-8, not JSON, not a manifest) or holds a layout newer than this hpclaunch's;
    ReadError when the filesystem fails to give it."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ReadError(None, path, exc) from None
    try:
        body = json.loads(data.decode())  # UnicodeDecodeError is a ValueError
        layout = int(body["layout"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ManifestError(Problem.UNREADABLE, None, f"{path} is not a manifest: {exc}") from None
    if layout > LAYOUT:
        raise ManifestError(
            Problem.LAYOUT,
            None,
            f"{path} is of layout {layout}, newer than this hpclaunch's {LAYOUT}: it was "
            "saved by a newer hpclaunch; load it with that version",
        )
    try:
        if body.get("checksum") != CHECKSUM:
            raise ValueError(f"checksum {body.get('checksum')!r}, not {CHECKSUM!r}")
        return Manifest(int(body["step"]), int(body["world"]), layout, _files(body["files"], path))
    except (ValueError, KeyError, TypeError) as exc:
        raise ManifestError(Problem.UNREADABLE, None, f"{path} is not a manifest: {exc}") from None


def check_step(manifest: Manifest, step: int) -> None:
    """The step the manifest was saved at against ``step``, the one in the checkpoint's
    name. Raises ManifestError."""
    if manifest.step != step:
        raise ManifestError(
            Problem.STEP,
            None,
            f"its manifest says step {manifest.step}, its name step {step}: another step's "
            "checkpoint under this name",
        )


def check(manifest: Manifest, checkpoint: Path, step: int) -> None:
    """What costs no reading of the data: ``check_step``, and each file there with its
    size. Raises ManifestError, or ReadError (``read_failure``)."""
    check_step(manifest, step)
    for name, want in manifest.files.items():
        path = _file(checkpoint, name)
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise read_failure(name, path, exc) from None
        if size != want.bytes:
            raise ManifestError(
                Problem.SIZE, name, f"{path} holds {size} bytes, its manifest {want.bytes}"
            )


def check_sums(manifest: Manifest, checkpoint: Path, share: Sequence[str]) -> None:
    """Sum each of ``share`` (names in the manifest) against the manifest. Raises
    ManifestError, or ReadError (``read_failure``; out of memory too)."""
    for name in share:
        path = _file(checkpoint, name)
        try:
            found = checksum(path)
        except OSError as exc:
            raise read_failure(name, path, exc) from None
        except MemoryError as exc:
            raise ReadError(name, path, exc) from None
        want = manifest.files[name]
        if found != want:
            raise ManifestError(
                Problem.CHECKSUM,
                name,
                f"{path}: crc32 {found.crc32} ({found.bytes} bytes), its manifest says "
                f"{want.crc32} ({want.bytes} bytes)",
            )


def share_of(manifest: Manifest, rank: int, world: int) -> list[str]:
    """The files ``rank`` of ``world`` sums when a checkpoint is loaded: every
    ``world``-th, so that the ranks read the checkpoint once between them."""
    return [name for index, name in enumerate(manifest.files) if index % world == rank]


def _file(checkpoint: Path, name: str) -> Path:
    # A one-file checkpoint's manifest names the one file it covers.
    return checkpoint / name if checkpoint.is_dir() else checkpoint


def _files(body: object, where: Path) -> dict[str, FileSum]:
    if not isinstance(body, dict):
        raise ValueError(f"{where}: files is not an object")
    out = {}
    for name, item in sorted(body.items()):
        # DCP's ``.metadata`` is the one dotted name a save writes.
        if os.sep in name or (name.startswith(".") and name != ".metadata"):
            raise ValueError(f"{where}: {name!r} is not a file of the checkpoint")
        crc = str(item["crc32"])
        int(crc, 16)  # 8 hex digits, else ValueError
        out[name] = FileSum(int(item["bytes"]), crc)
    return out
