"""Debugging ranks from the notebook: the kernel's own stdin answers them, and %ddp_debug's post-mortem.

A rank's ``input()``, ``getpass`` and pdb prompts reach the pool as questions
(kernel/stdin.py); here they become the kernel's own ``input``/``getpass``,
which ipykernel turns into an ``input_request`` on the stdin channel: an input
box in a notebook, a prompt in a console. A front end without stdin makes
ipykernel raise StdinNotImplementedError, which the rank reads as EOF, with
the reason.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional, Sequence

from IPython.core.error import StdinNotImplementedError

from ..errors import RankFailure, UsageError
from ..kernel import Listener
from ..kernel.pool import Pool
from ..kernel.stdin import NO_STDIN, Ask
from ..states import FailureKind
from ..wire import protocol as P

NO_FAILURE = "%ddp_debug: no %%ddp cell has failed with an error yet; there is nothing to debug (give a rank to try anyway: %ddp_debug 1)"
NO_POOL = "%ddp_debug: no pool is running; the frames of a failed cell live on its ranks"


def kernel_ask(before: Callable[[], None] = lambda: None) -> Ask:
    """The kernel's own input: what a rank's question becomes in the notebook. ``before`` shows pending output first."""

    def ask(prompt: str, password: bool) -> str:
        before()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        try:
            if password:
                import getpass

                return getpass.getpass(prompt)
            return input(prompt)
        except StdinNotImplementedError:
            raise EOFError(NO_STDIN) from None

    return ask


def no_stdin_in_background(prompt: str, password: bool) -> str:
    """A background cell's ranks ask for input: no cell waits for an answer, so they read EOF, saying why."""
    raise EOFError("a background cell (%%ddp --bg) has no stdin: a rank's input(), getpass and pdb read EOF; run the cell without --bg to answer them")


def debug_rank(failures: Sequence[RankFailure], rank: Optional[int]) -> Optional[int]:
    """The rank to debug: the one asked for, else the root-cause rank whose cell raised (None: none did)."""
    if rank is not None:
        return rank
    errors = [f.rank for f in failures if f.kind == FailureKind.ERROR]
    return errors[0] if errors else None


def parse_rank(line: str, nproc: int) -> Optional[int]:
    text = line.strip()
    if not text:
        return None
    if not text.isdigit() or int(text) >= nproc:
        raise UsageError(f"%ddp_debug: {text!r} is not a rank of this pool (0-{nproc - 1}); e.g. %ddp_debug 1")
    return int(text)


def post_mortem(pool: Optional[Pool], failures: Sequence[RankFailure], line: str, listener: Listener, ask: Ask, quiet: bool = False) -> None:
    """pdb on a rank's kept traceback (``line``: the rank, or empty for the root cause), driven through ``ask``.

    ``quiet``: nothing to debug is no error (the automatic post-mortem of ``--pdb`` and ``%pdb on``)."""
    if pool is None or not pool.alive:
        if quiet:
            return
        raise UsageError(NO_POOL)
    rank = debug_rank(failures, parse_rank(line, pool.nproc))
    if rank is None:
        if quiet:
            return
        raise UsageError(NO_FAILURE)
    pool.run(P.POST_MORTEM_SOURCE.format(rank=rank), listener=listener, label="debug", stdin=ask)


def once_instead_of_ipython(shell: Any) -> None:
    """With ``%pdb on`` IPython would open its own debugger on the magic's frames after ours: not this once."""
    if shell is None or not getattr(shell, "call_pdb", False):
        return
    shell.call_pdb = False

    def restore(result: Any) -> None:
        shell.call_pdb = True
        shell.events.unregister("post_run_cell", restore)

    shell.events.register("post_run_cell", restore)
