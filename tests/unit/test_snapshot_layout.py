"""A snapshot folder as wire/snapshot.py reads it: the newest whole one is loaded, a partial one never, a changed file is named."""
from __future__ import annotations

import os

import pytest

from ddp_magic.kernel.snapshots import listing
from ddp_magic.wire import snapshot as S


def _snapshot(parent, step, when, world=2):
    path = os.path.join(parent, S.snapshot_name(step, when))
    os.makedirs(os.path.join(path, S.DCP_DIR))
    for rank in range(world):
        with open(os.path.join(path, S.rank_file(rank)), "wb") as f:
            f.write(b"rank %d" % rank)
    with open(os.path.join(path, S.DCP_DIR, "__0_0.distcp"), "wb") as f:
        f.write(b"x" * 100)
    S.Meta(world_size=world, time=when, step=step, names={"model": {"kind": "module", "sharing": "replicated"}},
           unsaved={"gen": "a generator"}, files=S.file_table(path), versions={"torch": "2.13"}).write(path)
    return path


def test_the_newest_whole_snapshot_is_loaded_and_a_partial_one_never(tmp_path):
    old = _snapshot(str(tmp_path), 10, 1000.0)
    new = _snapshot(str(tmp_path), 20, 2000.0)
    os.makedirs(tmp_path / (S.PARTIAL + "abcd"))  # a save that died after it
    assert S.resolve(str(tmp_path)) == new
    assert S.resolve(old) == old
    text = listing(str(tmp_path))
    assert text.splitlines()[0].startswith("2 snapshots in ")
    assert "step 10  1970-01-01 00:16:40 UTC  2 ranks" in text and "model (not saved: gen)" in text
    assert ".partial-abcd  partial: a save not finished" in text


def test_a_changed_or_missing_file_is_named(tmp_path):
    path = _snapshot(str(tmp_path), 5, 1000.0)
    meta = S.Meta.read(path)
    assert S.damaged(path, meta) == []
    with open(os.path.join(path, S.rank_file(1)), "wb") as f:
        f.write(b"rank 9")  # same size, other content
    os.remove(os.path.join(path, S.DCP_DIR, "__0_0.distcp"))
    assert S.damaged(path, meta) == ["dcp/__0_0.distcp (missing)", "rank-1.pkl (its content hash differs)"]
    with open(os.path.join(path, S.rank_file(0)), "ab") as f:
        f.write(b"!")
    assert "rank-0.pkl (its size differs)" in S.damaged(path, meta)
    for count in (1, 2, 3, 7):  # a load's ranks each check a share: together every file, each once
        parts = S.shares(meta, count)
        assert sorted(f for p in parts for f in p) == sorted(meta.files) and len(parts) == count
        found = sorted(f for i in range(count) for f in S.damaged(path, meta, share=(i, count)))
        assert found == sorted(S.damaged(path, meta)), count


def test_a_format_1_snapshot_is_checked_by_its_sha256(tmp_path):
    """Snapshots saved before crc32 (format 1) record sha256: a load checks those, and names a changed file the same."""
    import hashlib
    import zlib

    path = _snapshot(str(tmp_path), 5, 1000.0)
    meta = S.Meta.read(path)
    rel = S.rank_file(1)
    with open(os.path.join(path, rel), "rb") as f:
        data = f.read()
    assert meta.format == 2 and meta.files[rel] == {"bytes": len(data), "crc32": f"{zlib.crc32(data):08x}"}
    big = tmp_path / "big"
    big.write_bytes(os.urandom(S.BLOCK * 2 + 12345))  # more than one block: the digest runs on
    assert S.file_digest(str(big)) == f"{zlib.crc32(big.read_bytes()):08x}"
    assert S.file_digest(str(big), S.Digest.SHA256) == hashlib.sha256(big.read_bytes()).hexdigest()
    for entry in meta.files.values():
        entry["sha256"] = S.file_digest(os.path.join(path, [k for k, v in meta.files.items() if v is entry][0]), S.Digest.SHA256)
        del entry["crc32"]
    meta.format = 1
    meta.write(path)
    old = S.Meta.read(path)
    assert S.damaged(path, old) == []
    with open(os.path.join(path, rel), "wb") as f:
        f.write(b"rank 9")
    assert S.damaged(path, old) == ["rank-1.pkl (its content hash differs)"]


def test_the_shares_balance_the_bytes():
    meta = S.Meta(world_size=2, time=0.0, files={f"f{i}": {"bytes": b, "crc32": ""} for i, b in enumerate([100, 90, 60, 50, 10, 5])})
    loads = [sum(int(meta.files[f]["bytes"]) for f in part) for part in S.shares(meta, 2)]
    assert sorted(loads) == [155, 160]


def test_no_snapshot_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="save one with %ddp save"):
        S.resolve(str(tmp_path))
    assert "no snapshots in" in listing(str(tmp_path / "nothing")) and "(no such folder)" in listing(str(tmp_path / "nothing"))


def test_a_newer_format_is_refused_with_the_fix(tmp_path):
    path = _snapshot(str(tmp_path), 1, 1.0)
    meta = S.Meta.read(path)
    meta.format = S.FORMAT + 1
    meta.write(path)
    with pytest.raises(ValueError, match="upgrade ddp_magic"):
        S.Meta.read(path)


def test_a_save_at_a_safe_point_goes_only_where_every_rank_arrived_at_one_step():
    """kernel/jobs/safe_save.py's verdict: GO (None) at one step; otherwise the ranks named, and the cell goes on."""
    from ddp_magic.kernel.jobs.safe_save import Outcome, _verdict

    assert _verdict([0, 1], {0: {"step": 12}, 1: {"step": 12}}) is None
    apart = _verdict([0, 1], {0: {"step": 12}, 1: {"step": 13}})
    assert apart is not None and apart.outcome == Outcome.CANCELLED and "(rank 0 at step 12, rank 1 at step 13)" in apart.why
    alone = _verdict([0, 1, 2], {0: {"step": 19}})
    assert alone is not None and alone.outcome == Outcome.CANCELLED
    assert "(rank 0 at step 19 reached one; ranks 1-2 never reached one): call ddp_magic.log(step=…)" in alone.why, alone.why
    ended = _verdict([0, 1], {0: {"ended": True}, 1: {"ended": True}})
    assert ended is not None and ended.outcome == Outcome.ENDED
    half = _verdict([0, 1], {0: {"step": 3}, 1: {"ended": True}})
    assert half is not None and half.outcome == Outcome.CANCELLED and "rank 1 ended the cell" in half.why
