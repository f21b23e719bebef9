"""Why a host was refused, in words with the fix: ssh's own messages read once, here, for the start and for %ddp_env alike.

ssh says what went wrong on its stderr (BatchMode makes every prompt a failure with words);
the template says what it is (wire/node_hello.py). Each problem names its host and says
what to do; host-key checking is never the fix (ddp_magic never turns it off).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Tuple

from ...words import plural

if TYPE_CHECKING:
    from ...plan.plan import Plan

# (what ssh or the remote shell says, what it means and the fix; {host} and {python} filled in)
SSH_WORDS: List[Tuple[Tuple[str, ...], str]] = [
    (("REMOTE HOST IDENTIFICATION HAS CHANGED", "Host key for"),
     "its host key changed since you last connected (ssh refused it: a reinstalled host, or someone in between); if you know "
     "why, remove the old key with ssh-keygen -R {host} and ssh {host} once from a terminal to check and accept the new one"),
    (("host key is known for", "Host key verification failed"),
     "its host key is not in your known_hosts; ssh {host} once from a terminal to check and accept it "
     "(ddp_magic never turns host-key checking off)"),
    (("Permission denied (", "Too many authentication failures"),  # ssh's: Permission denied (publickey,password).
     "it wants a password or a key ssh has not got (BatchMode: ddp_magic never waits at a prompt); ssh-copy-id {host}, "
     "or load your key into the agent (ssh-add)"),
    (("Could not resolve hostname",),
     "its name does not resolve: a typo, or an alias missing from ~/.ssh/config"),
    (("Connection timed out", "Connection refused", "No route to host", "Network is unreachable", "Operation timed out",
      "Connection closed by", "kex_exchange_identification", "UNKNOWN port"),
     "it does not answer on ssh: is it up, sshd running, and its port open from here?"),
    (("No module named ddp_magic", "No module named 'ddp_magic"),
     "no ddp_magic for {python} there: install this version there (pip install ddp_magic), or --remote-python PATH"),
    (("No module named",),
     "{python} there cannot import what the template needs; install ddp_magic's requirements there"),
    (("not found", "No such file or directory", "Permission denied"),  # a shell's: bash: /x/python: Permission denied
     "no python at {python} there: --remote-python PATH names the one to use"),
]


def ssh_problem(host: str, said: str, python: str) -> str:
    """What ``said`` (ssh's and the remote shell's last words) means for ``host``, with its fix; the words as they are
    when none is known."""
    for needles, meaning in SSH_WORDS:
        if any(n in said for n in needles):
            last = next((ln.strip() for ln in reversed(said.splitlines()) if ln.strip() and not ln.startswith("@")), "")
            return meaning.format(host=host, python=python) + (f" (ssh: {last})" if last else "")
    return said.strip()[-400:] or "the session ended without a word"


def gpu_problem(plan: "Plan", gpus: int, slots: int) -> str:
    """A host with fewer GPUs than its ``slots`` under nccl ("" when it has enough, or the backend is not nccl)."""
    if plan.backend != "nccl" or gpus >= slots:
        return ""
    return (f"{plural(gpus, 'GPU')} there for {plural(slots, 'slot')}: nccl needs one GPU a rank; give fewer slots "
            "(--ntasks-per-node, host:N) or --backend gloo")


def failed_text(problems: Dict[str, str]) -> str:
    """The start's refusal: every host with its problem, then that nothing ran."""
    lines = [f"  {host}: {why}" for host, why in problems.items()]
    return (f"{plural(len(problems), 'host')} refused, so no rank was started on any host (every ssh session ended):\n"
            + "\n".join(lines))
