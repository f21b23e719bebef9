"""What published scripts do on a rank, made to run unchanged: argv and argparse's --local_rank (the one RUN every rank
gets, kernel/cell_send.py), sys.exit, and the arguments of their own init_process_group (procs/rank_argv.py, procs/rank_group.py)."""
from __future__ import annotations

import argparse
import pickle
import socket
from datetime import timedelta

import pytest

from ddp_magic.kernel.cell_send import run_fields, send_run
from ddp_magic.kernel.hub import Hub
from ddp_magic.kernel.ranks import RankInfo
from ddp_magic.procs import rank_argv, rank_group
from ddp_magic.wire import protocol as P


@pytest.fixture
def hook():
    """The argparse hook installed for one test, argparse restored after it."""
    real = argparse.ArgumentParser.parse_known_args, argparse.ArgumentParser.error
    rank_argv.install()
    yield rank_argv
    rank_argv.end_cell()
    argparse.ArgumentParser.parse_known_args, argparse.ArgumentParser.error = real  # type: ignore[method-assign]


def _parser(option: str = "") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="train.py")
    p.add_argument("--epochs", type=int, default=1)
    if option:
        p.add_argument(option, type=int, default=-1)
    return p


def test_the_kernels_default_argv_is_none_and_the_users_is_passed_as_given():
    assert rank_argv.cell_argv(None, 2) == ["ddp_cell"]  # torchrun's convention
    assert rank_argv.HOOK.local_rank == 2
    assert rank_argv.cell_argv(["ddp_cell", "--epochs", "3"], 2) == ["ddp_cell", "--epochs", "3"]
    assert rank_argv.cell_argv(["ddp_cell", "--local_rank=0"], 1) == ["ddp_cell", "--local_rank=0"]  # one --argv for every rank
    assert rank_argv.HOOK.local_rank is None
    rank_argv.end_cell()


class _NoProcesses:
    """The hub's launcher for ranks it only has sockets to."""

    reports_exits = False

    def fileno(self) -> None:
        return None

    def poll(self, timeout: float = 0.0) -> list:
        return []

    def adopt(self, pid: int, rank: int, host: str) -> None:
        pass


def test_one_run_pickle_is_sent_to_every_rank_and_each_rank_reads_its_own_local_rank(hook, monkeypatch):
    """kernel/cell_send.py: the same RUN bytes to every rank on this host (one more for a rank elsewhere: no shm)."""
    hub = Hub(_NoProcesses(), lambda rank, code: None)  # type: ignore[arg-type]
    ranks = {r: RankInfo(rank=r) for r in range(4)}
    hub.reset(ranks, None)
    hosts, ours = [socket.gethostname()] * 3 + ["elsewhere"], {}
    for r in range(4):
        theirs, ours[r] = socket.socketpair()
        hub.register(theirs, P.message(P.HELLO, rank=r, pid=100 + r, host=hosts[r], device="cpu", local_rank=r % 2, node=r // 2))
    frames: list = []
    real_encode = P.encode
    monkeypatch.setattr(P, "encode", lambda msg: frames.append(real_encode(msg)) or frames[-1])
    try:
        for argv in (None, ["ddp_cell", "--epochs", "3"]):
            frames.clear()
            send_run(hub, ranks, 4, run_fields(1, "x", "<ddp-cell-1>", {}, (), "auto", argv, None))
            assert len(frames) == 2  # one pickle for this host's ranks, one for the rank elsewhere
            got = [ours[r].recv(1 << 16) for r in range(4)]
            assert got[0] == got[1] == got[2] == frames[0] and got[3] == frames[1]
            for r in range(4):
                msg = pickle.loads(got[r][P.HEADER.size:])
                assert (msg["op"], msg["shm"], msg["argv"]) == (P.RUN, r < 3, argv)
                monkeypatch.setattr("sys.argv", hook.cell_argv(msg["argv"], ranks[r].local_rank))
                args = _parser("--local_rank").parse_args()
                assert (args.epochs, args.local_rank) == ((1, r % 2) if argv is None else (3, -1))
                hook.end_cell()
    finally:
        hub.close_all()
        for s in ours.values():
            s.close()


@pytest.mark.parametrize("option", ["--local_rank", "--local-rank"])
def test_local_rank_only_for_a_parser_that_declares_it(option):
    assert rank_argv.with_local_rank(_parser(option), [], 3) == [f"{option}=3"]
    assert rank_argv.with_local_rank(_parser(), [], 3) == []
    assert rank_argv.with_local_rank(_parser(option), ["--local_rank", "0"], 3) == ["--local_rank", "0"]


def test_hook_makes_both_eras_of_script_parse(hook, monkeypatch):
    for _ in range(2):  # a re-run of the cell parses the same way
        monkeypatch.setattr("sys.argv", hook.cell_argv(None, 1))
        assert _parser("--local_rank").parse_args().local_rank == 1  # launch era
        assert _parser("--local-rank").parse_args().local_rank == 1
        assert _parser().parse_args().epochs == 1  # torchrun era: no unknown --local_rank
        assert _parser("--local_rank").parse_args(["--epochs", "2"]).local_rank == -1  # an explicit list is the script's own


def test_hook_is_off_with_the_users_argv_and_outside_cells(hook, monkeypatch):
    monkeypatch.setattr("sys.argv", hook.cell_argv(["ddp_cell", "--epochs", "4"], 0))
    args = _parser("--local_rank").parse_args()
    assert (args.epochs, args.local_rank) == (4, -1)
    hook.end_cell()
    monkeypatch.setattr("sys.argv", ["ddp_cell"])
    assert _parser("--local_rank").parse_args().local_rank == -1


def test_exit_codes(hook, monkeypatch, capsys):
    assert rank_argv.exit_outcome(SystemExit()) == (True, "")
    assert rank_argv.exit_outcome(SystemExit(0)) == (True, "")
    ok, why = rank_argv.exit_outcome(SystemExit(3))
    assert not ok and "exit code 3" in why and "--argv" not in why
    monkeypatch.setattr("sys.argv", hook.cell_argv(None, 0))
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(["--bogus"])
    ok, why = rank_argv.exit_outcome(e.value)
    assert not ok and "exit code 2 from argparse" in why and '%%ddp --argv "' in why
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
    hook.cell_argv(None, 0)  # the next cell starts clean
    assert "argparse" not in rank_argv.exit_outcome(SystemExit(2))[1]


def test_init_arguments_the_kept_group_ignores():
    torch = pytest.importorskip("torch")
    current = {"backend": "gloo", "world_size": 2, "rank": 1, "timeout": timedelta(seconds=300), "device_id": None}
    given = {"backend": "nccl", "rank": 1, "world_size": 2, "device_id": torch.device("cpu"), "timeout": timedelta(minutes=30)}
    assert rank_group.ignored_arguments(given, current) == ["backend='nccl'", "device_id=cpu", "timeout=0:30:00"]
    same = {"backend": "gloo", "init_method": "env://", "rank": -1, "world_size": -1, "timeout": timedelta(seconds=300)}
    assert rank_group.ignored_arguments(same, current) == []
    assert rank_group.ignored_arguments({"backend": "GLOO", "world_size": 4}, current) == ["world_size=4"]


@pytest.mark.parametrize("line, argv", [
    ('--argv "--epochs 5 --lr 0.1"', ["--epochs", "5", "--lr", "0.1"]),
    ("--argv '--epochs 5'", ["--epochs", "5"]),
    ("--argv=--epochs=5", ["--epochs=5"]),
    ("--argv \"--name 'a b'\"", ["--name", "a b"]),
])
def test_the_magics_argv_option_splits_like_a_shell(line, argv):
    from ddp_magic.magic_options import cell_argv
    from ddp_magic.magics import DDPMagics, _parse

    args = _parse(DDPMagics.ddp, line, "%%ddp")
    assert cell_argv(args.argv) == ["ddp_cell", *argv]
