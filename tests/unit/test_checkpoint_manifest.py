"""The checkpoint manifest's pure parts, on plain files: what a save writes, what a load
checks, and each way a checkpoint fails that check, named."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

from hpclaunch.checkpoint import manifest, store
from hpclaunch.checkpoint.manifest import Manifest, ManifestError, Problem
from hpclaunch.jobdir.set_aside import SetAside, parse


def _sharded(folder: Path, step: int, shards: dict[str, bytes]) -> Path:
    """A sharded checkpoint as a save commits it: the files, then the manifest."""
    path = store.path_for(folder, step, sharded=True)
    path.mkdir(parents=True)
    for name, data in shards.items():
        (path / name).write_bytes(data)
    files = manifest.sums(path, shards)
    manifest.write(path / manifest.NAME, Manifest(step, 2, manifest.LAYOUT, files))
    return path


SHARDS = {".metadata": b"meta", "__0_0.distcp": b"a" * 1000, "__1_0.distcp": b"b" * 999}


def test_checksum_is_zlibs_crc32_over_big_reads(tmp_path: Path) -> None:
    data = bytes(range(256)) * 40_000  # over one read buffer
    (tmp_path / "f").write_bytes(data)
    assert manifest.checksum(tmp_path / "f") == manifest.FileSum(
        len(data), f"{zlib.crc32(data):08x}"
    )


def test_a_written_manifest_reads_back_and_checks(tmp_path: Path) -> None:
    path = _sharded(tmp_path, 15, SHARDS)
    found = manifest.read(manifest.location(path))
    assert found is not None
    assert (found.step, found.world, found.layout) == (15, 2, 1)
    assert list(found.files) == sorted(SHARDS)
    manifest.check(found, path, 15)
    manifest.check_sums(found, path, list(found.files))


def test_a_flipped_byte_is_a_checksum_mismatch_naming_the_file(tmp_path: Path) -> None:
    path = _sharded(tmp_path, 15, SHARDS)
    data = bytearray((path / "__1_0.distcp").read_bytes())
    data[500] ^= 0x01
    (path / "__1_0.distcp").write_bytes(data)
    found = manifest.read(manifest.location(path))
    assert found is not None
    manifest.check(found, path, 15)  # the size is right: only the sum tells
    with pytest.raises(ManifestError) as caught:
        manifest.check_sums(found, path, ["__1_0.distcp"])
    assert (caught.value.problem, caught.value.file) == (Problem.CHECKSUM, "__1_0.distcp")
    assert str(caught.value).startswith(f"{path / '__1_0.distcp'}: crc32 ")


def test_another_steps_checkpoint_under_this_name_is_a_step_mismatch(tmp_path: Path) -> None:
    older = _sharded(tmp_path, 14, SHARDS)
    newer = store.path_for(tmp_path, 15, sharded=True)
    older.rename(newer)
    found = manifest.read(manifest.location(newer))
    assert found is not None
    with pytest.raises(ManifestError, match="says step 14, its name step 15") as caught:
        manifest.check(found, newer, 15)
    assert caught.value.problem is Problem.STEP


@pytest.mark.parametrize(
    ("damage", "problem", "file"),
    [
        (lambda p: (p / "__0_0.distcp").write_bytes(b"a" * 10), Problem.SIZE, "__0_0.distcp"),
        (lambda p: (p / ".metadata").unlink(), Problem.MISSING, ".metadata"),
    ],
)
def test_a_truncated_or_missing_file_is_named_without_reading_the_data(
    tmp_path: Path, damage: object, problem: Problem, file: str
) -> None:
    path = _sharded(tmp_path, 3, SHARDS)
    damage(path)  # type: ignore[operator]
    found = manifest.read(manifest.location(path))
    assert found is not None
    with pytest.raises(ManifestError) as caught:
        manifest.check(found, path, 3)
    assert (caught.value.problem, caught.value.file) == (problem, file)


def test_a_newer_layout_is_refused_by_name(tmp_path: Path) -> None:
    path = _sharded(tmp_path, 3, SHARDS)
    where = manifest.location(path)
    body = json.loads(where.read_text())
    where.write_text(json.dumps({**body, "layout": manifest.LAYOUT + 1, "new": "field"}))
    with pytest.raises(ManifestError, match="is of layout 2, newer than this hpclaunch's 1") as c:
        manifest.read(where)
    assert c.value.problem is Problem.LAYOUT


@pytest.mark.parametrize(
    "text",
    [
        "{",
        '{"layout": 1}',
        '{"layout": 1, "step": 1, "world": 1, "checksum": "md5", "files": {}}',
        '{"layout": 1, "step": 1, "world": 1, "checksum": "crc32", "files": {"../x": '
        '{"bytes": 1, "crc32": "00000000"}}}',
    ],
)
def test_a_manifest_that_cannot_be_parsed_is_named_unreadable(tmp_path: Path, text: str) -> None:
    (tmp_path / manifest.NAME).write_text(text)
    with pytest.raises(ManifestError, match="is not a manifest") as caught:
        manifest.read(tmp_path / manifest.NAME)
    assert caught.value.problem is Problem.UNREADABLE


def test_a_checkpoint_saved_before_manifests_has_none(tmp_path: Path) -> None:
    path = store.path_for(tmp_path, 3, sharded=True)
    path.mkdir()
    assert manifest.read(manifest.location(path)) is None


def test_the_ranks_parts_merge_and_a_missing_part_stops_the_commit(tmp_path: Path) -> None:
    for rank, name in enumerate(["__0_0.distcp", "__1_0.distcp"]):
        (tmp_path / name).write_bytes(SHARDS[name])
        manifest.write_part(tmp_path, rank, manifest.sums(tmp_path, [name]))
    merged = manifest.merge_parts(tmp_path, 2)
    assert sorted(merged) == ["__0_0.distcp", "__1_0.distcp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(merged)  # parts removed
    manifest.write_part(tmp_path, 0, {})
    with pytest.raises(ManifestError, match="rank 1's part of the manifest") as caught:
        manifest.merge_parts(tmp_path, 2)
    assert caught.value.problem is Problem.MISSING


def test_the_ranks_share_the_sums_and_every_file_is_summed_once() -> None:
    files = {f"__{r}_0.distcp": manifest.FileSum(1, "00000000") for r in range(5)}
    found = Manifest(1, 5, 1, files)
    shares = [manifest.share_of(found, rank, 3) for rank in range(3)]
    assert sorted(name for share in shares for name in share) == sorted(files)
    assert [len(share) for share in shares] == [2, 2, 1]


def test_a_one_file_checkpoints_manifest_goes_with_it(tmp_path: Path) -> None:
    path = store.path_for(tmp_path, 4)
    path.write_bytes(b"x" * 100)
    files = manifest.sums(tmp_path, [path.name])
    manifest.write(manifest.sidecar(path), Manifest(4, 1, 1, files))
    assert manifest.location(path).name == "step-000000000004.pt.manifest.json"
    found = manifest.read(manifest.location(path))
    assert found is not None
    manifest.check(found, path, 4)
    manifest.check_sums(found, path, list(found.files))
    target = store.set_aside(store.Checkpoint(4, path))
    assert manifest.sidecar(target).is_file() and not manifest.sidecar(path).exists()


def test_prune_takes_a_one_file_checkpoints_manifest_and_orphans(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        path = store.path_for(tmp_path, step)
        path.write_bytes(b"x")
        manifest.sidecar(path).write_text("{}")
    # A save killed between its manifest and the rename of its file.
    manifest.sidecar(store.path_for(tmp_path, 4)).write_text("{}")
    # One killed while it wrote its manifest.
    (tmp_path / ".step-000000000005.pt.manifest.json.tmp-99").write_text("{")
    store.prune(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-000000000002.pt",
        "step-000000000002.pt.manifest.json",
        "step-000000000003.pt",
        "step-000000000003.pt.manifest.json",
    ]


def test_a_set_aside_note_says_the_step_the_problem_and_where() -> None:
    note = SetAside(15, "checksum mismatch", "__1_0.distcp", "crc32 ...", "/c/x.damaged", 1.0)
    assert note.describe() == (
        "checkpoint step 15 set aside: checksum mismatch in __1_0.distcp (now /c/x.damaged)"
    )
    line = json.dumps({**note.__dict__})
    assert parse([line, "torn {", '{"step": "x"}']) == [note]


def test_a_one_file_checkpoints_shapes_are_checked_against_into() -> None:
    import torch

    from hpclaunch.checkpoint.loading import shape_mismatch

    saved = {"model": {"w": torch.zeros(3, 4)}, "optimizer": {"state": {0: {"m": torch.zeros(3)}}}}
    same = {"model": {"w": torch.ones(3, 4)}, "optimizer": {"state": {0: {"m": torch.ones(3)}}}}
    assert shape_mismatch(saved, same) is None
    assert shape_mismatch(saved, {"model": {}}) is None  # into need not hold it all
    wider = {"model": {"w": torch.zeros(5, 4)}}
    assert shape_mismatch(saved, wider) == (
        "Size mismatch between saved (3, 4) and current (5, 4) for model.w"
    )
    moments = {"optimizer": {"state": {0: {"m": torch.zeros(4)}}}}
    assert shape_mismatch(saved, moments) == (
        "Size mismatch between saved (3,) and current (4,) for optimizer.state.0.m"
    )
