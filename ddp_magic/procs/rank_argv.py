"""A rank's sys.argv and sys.exit: launch-era and torchrun-era scripts both run unchanged.

torch.distributed.launch passed ``--local_rank=N`` to every script; torchrun passes
nothing (the rank reads LOCAL_RANK). A script's own argparse parser declares one or
the other, so by default a cell sees torchrun's ``sys.argv`` (no arguments) and a
small hook on ``ArgumentParser.parse_known_args`` adds ``--local_rank=N`` only for a
parser that declares ``--local_rank`` or ``--local-rank`` and only when it parses
``sys.argv``. ``%%ddp --argv "…"`` turns the hook off for that cell.

``sys.exit`` ends a script under torchrun normally (code 0 or None) or as a failed
process (any other code); a cell does the same, without a Python traceback.
"""
from __future__ import annotations

import argparse
import functools
from typing import Any, List, Optional, Sequence, Tuple

PROGRAM = "ddp_cell"  # sys.argv[0] on the ranks
LOCAL_RANK_OPTIONS = ("--local_rank", "--local-rank")
ARGV_HINT = 'pass the script\'s arguments with %%ddp --argv "…", e.g. %%ddp --argv "--epochs 3 --lr 0.1"'


class _Hook:
    """The hook's per-cell state: on (the cell got the default argv) and the rank's local rank."""

    local_rank: Optional[int] = None  # None: off (the user gave --argv, or no cell runs)
    argparse_exit = False  # the last SystemExit came out of an argparse parser


HOOK = _Hook()


def cell_argv(argv: Optional[Sequence[str]], local_rank: int) -> List[str]:
    """sys.argv for a cell, and the hook switched on (``argv`` None: the kernel's default) or off (the user's --argv).

    The default is the same for every rank (kernel/cell_send.py pickles one RUN for all of them): the local
    rank is this rank's own, and whatever ``--argv`` the user gives is passed as given.
    """
    HOOK.argparse_exit = False
    if argv is None:
        HOOK.local_rank = local_rank
        return [PROGRAM]
    HOOK.local_rank = None
    return list(argv or [PROGRAM])


def end_cell() -> None:
    """Code that runs outside a cell (the worker's own parsers) is never touched."""
    HOOK.local_rank = None


def with_local_rank(parser: argparse.ArgumentParser, args: List[str], local_rank: int) -> List[str]:
    """``args`` plus ``--local_rank=N`` when ``parser`` declares that option and ``args`` lacks it."""
    declared = [opt for opt in LOCAL_RANK_OPTIONS if opt in parser._option_string_actions]
    given = any(a.split("=", 1)[0] in LOCAL_RANK_OPTIONS for a in args)
    if not declared or given:
        return args
    return args + [f"{declared[0]}={local_rank}"]


def install() -> None:
    """Wrap ``ArgumentParser.parse_known_args`` (parse_args and the intermixed variants go through it)
    and ``ArgumentParser.error`` (to tell an argparse exit from the script's own)."""
    real_parse, real_error = argparse.ArgumentParser.parse_known_args, argparse.ArgumentParser.error
    if getattr(real_parse, "_ddp_magic", False):
        return

    @functools.wraps(real_parse)
    def parse_known_args(self: argparse.ArgumentParser, args: Optional[Sequence[str]] = None, namespace: Any = None) -> Any:
        if args is None and HOOK.local_rank is not None:
            import sys

            args = with_local_rank(self, list(sys.argv[1:]), HOOK.local_rank)
        return real_parse(self, args, namespace)

    @functools.wraps(real_error)
    def error(self: argparse.ArgumentParser, message: str) -> Any:
        HOOK.argparse_exit = True
        return real_error(self, message)

    parse_known_args._ddp_magic = True  # type: ignore[attr-defined]
    argparse.ArgumentParser.parse_known_args = parse_known_args  # type: ignore[method-assign,assignment]
    argparse.ArgumentParser.error = error  # type: ignore[method-assign]


def exit_outcome(exc: SystemExit) -> Tuple[bool, str]:
    """(ended normally, the failure's message): code 0 or None is a normal end, as under torchrun."""
    code = exc.code
    if code is None or code == 0:
        return True, ""
    if HOOK.argparse_exit:
        return False, f"exit code {code} from argparse: the script's arguments did not parse (its usage error is above); {ARGV_HINT}"
    if isinstance(code, int):
        return False, f"sys.exit({code}): the cell ended with exit code {code}"
    return False, f"sys.exit({code!r}): the cell ended with exit code 1"  # Python prints a non-int code and exits 1
