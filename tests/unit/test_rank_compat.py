"""What published scripts do on a rank, made to run unchanged: argv and argparse's --local_rank,
sys.exit, and the arguments of their own init_process_group (procs/rank_argv.py, procs/rank_group.py)."""
from __future__ import annotations

import argparse
from datetime import timedelta

import pytest

from ddp_magic.procs import rank_argv, rank_group


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


def test_the_kernels_default_argv_is_recognised_per_rank():
    assert rank_argv.is_default(["ddp_cell", "--local_rank=1"], 1)
    assert not rank_argv.is_default(["ddp_cell", "--local_rank=0"], 1)  # one --argv string for every rank
    assert not rank_argv.is_default(["ddp_cell", "--epochs", "3"], 0)
    assert rank_argv.cell_argv(["ddp_cell", "--local_rank=2"], 2) == ["ddp_cell"]  # torchrun's convention
    assert rank_argv.cell_argv(["ddp_cell", "--epochs", "3"], 2) == ["ddp_cell", "--epochs", "3"]


@pytest.mark.parametrize("option", ["--local_rank", "--local-rank"])
def test_local_rank_only_for_a_parser_that_declares_it(option):
    assert rank_argv.with_local_rank(_parser(option), [], 3) == [f"{option}=3"]
    assert rank_argv.with_local_rank(_parser(), [], 3) == []
    assert rank_argv.with_local_rank(_parser(option), ["--local_rank", "0"], 3) == ["--local_rank", "0"]


def test_hook_makes_both_eras_of_script_parse(hook, monkeypatch):
    for _ in range(2):  # a re-run of the cell parses the same way
        monkeypatch.setattr("sys.argv", hook.cell_argv(["ddp_cell", "--local_rank=1"], 1))
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
    monkeypatch.setattr("sys.argv", hook.cell_argv(["ddp_cell", "--local_rank=0"], 0))
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(["--bogus"])
    ok, why = rank_argv.exit_outcome(e.value)
    assert not ok and "exit code 2 from argparse" in why and '%%ddp --argv "' in why
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
    hook.cell_argv(["ddp_cell", "--local_rank=0"], 0)  # the next cell starts clean
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
