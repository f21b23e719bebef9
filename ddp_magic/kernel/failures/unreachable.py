"""Nodes that cannot be reached: which ranks share a silent node, and what a user reads when a node cannot reach the kernel.

The liveness check itself is the OS's (wire/liveness.py); these are the kernel's pure decisions
over what it found: one rank's connection gone silent means its whole node is (they share the
link), so the node and all its ranks are named at once, never a rank on a healthy node. And a
rank that could not reach the control port at start-up says so through its launcher (a Slurm
template's events on srun's output), so the pool names the node instead of waiting out its join.
Before ranks lost with their node are started again, the node is asked first (a ping through its
launcher): one still silent fails the cell at once, naming it, where new ranks asked of it would
wait out the whole join timeout; nothing runs, and the other ranks keep their state. The launcher
remembers such a node (``silent_since``) across restarts until it answers, so every other way to
start ranks there asks it first too: a restart (refused before anything stops) and a pool started in
the allocation held; and ``%ddp stop`` names what it could not reach.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Protocol, Sequence

from ...errors import NodeUnreachable, StartError
from ...plan.plan import Plan
from ...states import RankState
from ...wire import liveness
from ...words import plural, ranks_phrase
from ..launchers import Launcher
from ..launchers.base import slurm_without
from ..ranks import RankInfo

_GONE = (RankState.STOPPED, RankState.DEAD)
SETTLE_S, SETTLE_MAX_S = 0.5, 3.0  # how long the other ranks' "cannot reach" may follow the first one's
# how long a node whose ranks were unreachable gets to answer a ping before they are started again: a round trip
# through srun takes milliseconds; this leaves room for a loaded login host, and the answer inside the liveness bound
ANSWER_S = 5.0


def node_key(info: RankInfo) -> str:
    """The name a rank's node goes by: the scheduler's (Slurm's n2), else the host's."""
    return info.node_name or info.host


def silent_siblings(ranks: Dict[int, RankInfo], rank: int) -> List[int]:
    """The other live ranks on ``rank``'s node: unreachable with it."""
    key = node_key(ranks[rank])
    return [r for r, info in sorted(ranks.items()) if r != rank and key and node_key(info) == key and info.state not in _GONE]


def cannot_reach_text(events: Sequence[dict], joined: int, nproc: int, released: str) -> str:
    """Why a pool did not start when ranks said they cannot reach the kernel's control port: each node named once,
    with its ranks, the address and why; then what to do. ``released`` says what became of the allocation."""
    by_node: Dict[str, List[dict]] = {}
    for ev in events:
        by_node.setdefault(str(ev.get("node") or "?"), []).append(ev)
    lines = []
    for node, evs in sorted(by_node.items()):
        ranks = sorted({int(ev["rank"]) for ev in evs if isinstance(ev.get("rank"), int)})
        first = evs[0]
        lines.append(f"{ranks_phrase(ranks)} on {node} cannot reach the kernel at {first.get('addr')} ({first.get('why')})")
    head = "; ".join(lines)
    return (
        f"{head}: a firewall between the nodes and this machine? --control-addr ADDR chooses another address. "
        f"{joined} of {plural(nproc, 'rank')} joined; {released}."
    )


def raise_if_cut_off(launcher: Launcher, joined: int, nproc: int) -> None:
    """A start that failed because ranks could not reach the control port: the launcher lets go of its nodes (a retry
    in the same place would fail the same way) and the user reads which nodes, at which address, and the fix."""
    events = launcher.cannot_reach()
    deadline = time.monotonic() + SETTLE_MAX_S
    while events and time.monotonic() < deadline:  # the node's other ranks timed out at the same moment: wait for their word
        time.sleep(SETTLE_S)
        more = launcher.cannot_reach()
        if len(more) == len(events):
            break
        events = more
    if events:
        raise StartError(cannot_reach_text(events, joined, nproc, launcher.give_up()))


def raise_if_never_joined(launcher: Launcher, ranks: Dict[int, RankInfo], timeout: float, control: str) -> None:
    """A pool whose nodes the launcher started (Slurm: no command was the user's to run) where ranks never connected."""
    missing = [r for r, info in sorted(ranks.items()) if info.state == RankState.STARTING]
    if missing and launcher.node_of(missing[0]):
        raise StartError(never_joined_text(launcher, missing, len(ranks), timeout, control))


def never_joined_text(launcher: Launcher, missing: Sequence[int], nproc: int, timeout: float, control: str) -> str:
    """Why a pool whose nodes the launcher started did not start: the ranks that never connected, by node."""
    by_node: Dict[str, List[int]] = {}
    for r in missing:
        by_node.setdefault(launcher.node_of(r) or "?", []).append(r)
    who = "; ".join(f"{ranks_phrase(rs)} on {node}" for node, rs in sorted(by_node.items()))
    return (
        f"{plural(len(missing), 'rank')} of {nproc} never reached the kernel at {control} within {timeout:.0f}s ({who}). "
        f"Slurm started them; a firewall between the nodes and this machine? --control-addr ADDR chooses another address, "
        f"--join-timeout SECONDS waits longer."
    )


def asked_again(launcher: Launcher, nodes: Sequence[str]) -> List[str]:
    """Ping ``nodes`` through the launcher (``ANSWER_S`` at most); those that answer are no longer silent (the launcher
    forgets them). Returns the nodes still silent."""
    if not nodes:
        return []
    quiet = launcher.unanswered(sorted(nodes), ANSWER_S)
    for node in nodes:
        if node not in quiet:
            launcher.silent_since.pop(node, None)
    return quiet


def raise_if_still_silent(launcher: Launcher, ranks: Dict[int, RankInfo], gone: Sequence[int]) -> None:
    """Before the ranks ``gone`` are started again: those lost with their node (``silent``) wait for that node to answer
    a ping, ``ANSWER_S`` at most. A node that does not fails the cell now, naming it, before anything is sent: the
    other ranks keep their state, and the next cell asks again."""
    by_node: Dict[str, List[int]] = {}
    for r in gone:
        if ranks[r].silent:
            by_node.setdefault(node_key(ranks[r]), []).append(r)
    quiet = asked_again(launcher, list(by_node))
    if quiet:
        kept = [r for r, info in sorted(ranks.items()) if r not in gone and info.state not in _GONE]
        raise NodeUnreachable(still_silent_text({n: by_node[n] for n in quiet}, launcher.silent_since, kept, launcher.without))


def on_silent_nodes(launcher: Launcher, plan: Plan) -> Dict[str, List[int]]:
    """The ranks of ``plan`` the launcher would start on nodes whose ranks went silent (node -> ranks)."""
    by_node: Dict[str, List[int]] = {}
    if launcher.silent_since:
        for rank, node in sorted(launcher.placement(plan).items()):
            if node in launcher.silent_since:
                by_node.setdefault(node, []).append(rank)
    return by_node


class PoolLike(Protocol):
    """What of a pool (kernel/pool.py) a restart's and a stop's checks read."""

    started: bool
    plan: Plan
    ranks: Dict[int, RankInfo]

    @property
    def launcher(self) -> Launcher: ...

    def refresh(self) -> None: ...


def raise_if_restart_silent(pool: PoolLike, who: str = "") -> None:
    """Before a restart stops the ranks (``who``: "%ddp restart", "%%ddp --restart", or "" for a cell that restarts a
    broken pool): a node its ranks went silent on (found now, if it went while the pool was idle) is pinged first.
    Still silent: NodeUnreachable, and nothing changed (the ranks that live keep their state); new ranks asked of it
    would have waited out the whole join timeout."""
    if pool.launcher.remote_ranks:  # ranks on other hosts: a node gone silent while the pool was idle is found now
        pool.refresh()
    launcher, ranks = pool.launcher, pool.ranks
    by_node = on_silent_nodes(launcher, pool.plan)
    quiet = asked_again(launcher, list(by_node))
    if quiet:
        live = [r for r, info in sorted(ranks.items()) if info.state not in _GONE and not info.silent]
        done = f"the pool was not restarted, {held_text(live)}" if who else "nothing ran, and the pool was not restarted"
        raise NodeUnreachable(silent_text({n: by_node[n] for n in quiet}, launcher.silent_since, done, "it" if who else "the cell",
                                          lead=f"{who}: " if who else "", without=launcher.without))


def raise_if_start_silent(launcher: Launcher, plan: Plan) -> None:
    """A pool starting in an allocation held (its templates running): a node of it whose ranks went silent is pinged
    before any rank is asked of it. Still silent: NodeUnreachable at once, the allocation kept for the next try."""
    by_node = on_silent_nodes(launcher, plan)
    quiet = asked_again(launcher, list(by_node))
    if quiet:
        done = "the pool did not start; its allocation stays held for the next try (%ddp stop releases it)"
        raise NodeUnreachable(silent_text({n: by_node[n] for n in quiet}, launcher.silent_since, done, "the cell", without=launcher.without))


def stop_note(pool: PoolLike) -> str:
    """What ``%ddp stop`` adds about a node of the pool it cannot reach (its ranks went silent, found now if that happened
    while the pool was idle, and not heard from since), "" when there is none. Ranks lost there end on their own, cut off
    from the kernel (wire/liveness.py ``RANK_SILENCE_S``); whatever else of ours runs there (a template) ends with the
    job's step, which Slurm ends there once the node answers it (``Launcher.left_there``: an SSH or Ray host's ends unbeaten)."""
    if pool.launcher.remote_ranks:  # ranks on other hosts: a node gone silent while the pool was idle is found now
        pool.refresh()
    since = pool.launcher.silent_since
    nodes = sorted(on_silent_nodes(pool.launcher, pool.plan))
    if not nodes:
        return ""
    lost: Dict[str, List[int]] = {}
    for r, info in sorted(pool.ranks.items()):
        if info.silent and node_key(info) in nodes:
            lost.setdefault(node_key(info), []).append(r)
    quiet, where = _quiet_words(dict.fromkeys(nodes, []), since, pinged=False), ",".join(nodes)
    if lost:  # what Slurm holds meanwhile: slurm_alloc.released_text ("n1 free, n2 once it answers")
        who = " and ".join(f"{ranks_phrase(rs)} on {node}" for node, rs in sorted(lost.items()))
        return (f", except {who}, which could not be reached ({quiet}): cut off from the kernel, they end on their own within "
                f"{liveness.RANK_SILENCE_S}s")
    return f"; {where} could not be reached ({quiet}): {pool.launcher.left_there(nodes)}"


def held_text(kept: Sequence[int]) -> str:
    """'ranks 0-1 keep their variables', 'rank 0 keeps its variables', or 'no rank is left'."""
    return f"{ranks_phrase(kept)} {'keeps its' if len(kept) == 1 else 'keep their'} variables" if kept else "no rank is left"


def _quiet_words(by_node: Dict[str, List[int]], since: Dict[str, float], pinged: bool = True) -> str:
    """'no answer since 00:41:07, nor to a ping just now' (``since``: node -> when it went quiet, wall clock)."""
    first = min((since[n] for n in by_node if n in since), default=None)
    ping = "nor to a ping just now" if pinged else ""
    if first is None:
        return "no answer to a ping just now" if pinged else "no answer"
    return f"no answer since {time.strftime('%H:%M:%S', time.localtime(first))}" + (f", {ping}" if ping else "")


def silent_text(by_node: Dict[str, List[int]], since: Dict[str, float], done: str, again: str, still: bool = False, lead: str = "",
                without: Callable[[str], str] = slurm_without) -> str:
    """'{lead}ranks 2-3 on n2 are [still] unreachable (no answer since 00:41:07, nor to a ping just now): {done}. Run
    {again} again once n2 is back, or %ddp stop and start a pool without it (--slurm-args "--exclude=n2")."""
    who = " and ".join(f"{ranks_phrase(rs)} on {node}" for node, rs in sorted(by_node.items()))
    count, nodes, one = sum(len(rs) for rs in by_node.values()), ",".join(sorted(by_node)), len(by_node) == 1
    return (
        f"{lead}{who} {'is' if count == 1 else 'are'} {'still ' if still else ''}unreachable ({_quiet_words(by_node, since)}): {done}. "
        f"Run {again} again once {nodes} {'is' if one else 'are'} back, or %ddp stop and start a pool without "
        f"{'it' if one else 'them'} ({without(nodes)})."
    )


def still_silent_text(by_node: Dict[str, List[int]], since: Dict[str, float], kept: Sequence[int],
                      without: Callable[[str], str] = slurm_without) -> str:
    """'ranks 2-3 on n2 are still unreachable (no answer since 00:41:07, nor to a ping just now): nothing ran, ranks 0-1
    keep their variables. Run the cell again once n2 is back, or ...'"""
    return silent_text(by_node, since, f"nothing ran, {held_text(kept)}", "the cell", still=True, without=without)
