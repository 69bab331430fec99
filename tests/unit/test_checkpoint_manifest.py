"""The checkpoint manifest's pure parts, on plain files: what a save writes, what a load
checks, and each way a checkpoint fails that check, named."""

from __future__ import annotations

import errno
import json
import zlib
from pathlib import Path

import pytest

from hpclaunch.checkpoint import loading, manifest, store
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


@pytest.mark.parametrize("data", [b"\xff\xfe{", b"\x00" * 8])
def test_a_manifest_that_is_not_utf8_or_json_is_named_unreadable(
    tmp_path: Path, data: bytes
) -> None:
    (tmp_path / manifest.NAME).write_bytes(data)
    with pytest.raises(ManifestError, match="is not a manifest") as caught:
        manifest.read(tmp_path / manifest.NAME)
    assert caught.value.problem is Problem.UNREADABLE


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.EIO, "Input/output error"),
        OSError(errno.ESTALE, "Stale file handle"),
        PermissionError(errno.EACCES, "Permission denied"),
        IsADirectoryError(errno.EISDIR, "Is a directory"),
    ],
)
def test_a_read_error_is_not_a_verdict_on_the_file(error: OSError) -> None:
    found = manifest.read_failure("__0_0.distcp", Path("/c/step-000000000003/__0_0.distcp"), error)
    assert isinstance(found, manifest.ReadError)
    assert (found.file, found.error) == ("__0_0.distcp", error)


def test_a_file_not_there_is_missing() -> None:
    found = manifest.read_failure(
        ".metadata", Path("/c/s/.metadata"), FileNotFoundError(errno.ENOENT, "No such file")
    )
    assert isinstance(found, ManifestError)
    assert (found.problem, found.file, str(found)) == (
        Problem.MISSING,
        ".metadata",
        "/c/s/.metadata is missing",
    )


def test_a_directory_where_a_file_is_expected_cannot_be_read(tmp_path: Path) -> None:
    """A real read error on plain files (as root, no mode keeps a file from being read):
    ReadError naming the file, from both checks, not a ManifestError."""
    path = _sharded(tmp_path, 3, SHARDS)
    found = manifest.read(manifest.location(path))
    assert found is not None
    (path / "__1_0.distcp").unlink()
    (path / "__1_0.distcp").mkdir()
    with pytest.raises(manifest.ReadError) as caught:
        manifest.check_sums(found, path, ["__1_0.distcp"])
    assert caught.value.file == "__1_0.distcp"
    assert caught.value.error.errno == errno.EISDIR  # type: ignore[attr-defined]
    where = manifest.location(path)
    where.unlink()
    where.mkdir()
    with pytest.raises(manifest.ReadError) as manifest_caught:
        manifest.read(where)
    assert manifest_caught.value.file is None


def test_the_ranks_agreed_message_names_the_file_and_the_errno() -> None:
    path = Path("/c/step-000000000003")
    said = loading.unreadable_message(path, 2, "__1_0.distcp", errno.EIO)
    assert said.startswith(
        "/c/step-000000000003 cannot be verified: reading /c/step-000000000003/__1_0.distcp "
        "failed on rank 2: [Errno 5] EIO: Input/output error; rank 2's log says more. It was "
        "not set aside"
    )
    assert "reading /c/step-000000000003/hpclaunch-manifest.json failed" in (
        loading.unreadable_message(path, 0, -1, errno.ESTALE)
    )
    assert "not an error of the filesystem (out of memory, say)" in (
        loading.unreadable_message(path, 0, -2, 0)
    )


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


def test_a_read_error_while_verifying_renames_nothing_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One process, real torch: step 2's manifest cannot be read (a directory where the
    file goes gives EISDIR): load_latest raises naming it and the errno; step 2 is not
    set aside and step 1 not loaded in its place."""
    import torch

    from hpclaunch import checkpoint

    for step in (1, 2):
        checkpoint.save({"x": torch.full((10,), float(step))}, step, folder=tmp_path)
    where = manifest.sidecar(store.path_for(tmp_path, 2))
    where.unlink()
    where.mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(checkpoint.CheckpointUnreadable) as caught:
        checkpoint.load_latest(tmp_path)
    assert str(caught.value) == loading.unreadable_message(
        store.path_for(tmp_path, 2), 0, -1, errno.EISDIR
    )
    assert f"reading {where} failed on rank 0: [Errno 21] EISDIR" in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert "IsADirectoryError" in capsys.readouterr().err


def _failed(step: int, problem: Problem) -> loading._Failed:
    return loading._Failed(store.Checkpoint(step, Path(f"/c/step-{step:012d}")), "why", problem)


def test_when_none_loads_only_the_advice_that_fits_is_given() -> None:
    manifest_only = loading.none_loads_message(
        Path("/c"), [_failed(2, Problem.CHECKSUM), _failed(1, Problem.SIZE)]
    )
    assert manifest_only == (
        "no checkpoint in /c can be loaded: step-000000000002 (why); step-000000000001 "
        "(why). Nothing was renamed, since none loads: when they are damaged, move them "
        "out of the folder"
    )
    assert "fix it" not in manifest_only
    mixed = loading.none_loads_message(
        Path("/c"), [_failed(2, Problem.LOAD), _failed(1, Problem.LAYOUT)]
    )
    assert mixed.endswith(
        "none loads: when the script changed (the state given to into=, weights_only), fix "
        "it; ones of a newer layout load with the hpclaunch that saved them"
    )


def test_a_one_file_checkpoint_set_aside_is_renamed_back_with_its_manifest(
    tmp_path: Path,
) -> None:
    (tmp_path / "step-000000000004.pt.damaged.2").write_bytes(b"x")
    (tmp_path / "step-000000000004.pt.damaged.2.manifest.json").write_text("{}")
    (tmp_path / "step-000000000003.damaged").mkdir()
    with pytest.raises(store.CheckpointError) as caught:
        loading._refuse_none_left(tmp_path, [])
    assert str(caught.value) == (
        f"{tmp_path} holds no committed checkpoint, only ones set aside as damaged: "
        "step-000000000003.damaged, step-000000000004.pt.damaged.2; rename one back, as "
        "step-000000000004.pt.damaged.2 to step-000000000004.pt and its manifest "
        "step-000000000004.pt.damaged.2.manifest.json to step-000000000004.pt.manifest.json, "
        "to resume from it, or move them away to start from step 0"
    )
