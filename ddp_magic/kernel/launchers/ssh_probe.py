"""What ``%ddp_env --hosts`` shows without starting anything: each host asked over ssh who it is, and whether it reaches the kernel.

Every host runs ``python -m ddp_magic.procs.ssh_template --probe`` (its hello, then it exits;
no torch import, no rank), all at once. A first round says who each host is (ssh's words
when it does not answer, its code against this kernel's, its GPUs against its slots, whether
MASTER_PORT is free on the first); a second, once MASTER_ADDR and the control address are
known, has each host dial a port the kernel listens on for the moment (a firewall between the
hosts and the kernel). One check a host, named with its fix.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from ...logs import log
from ...plan.check import Check
from ...plan.net import address_family, route_source
from ...wire import node_hello
from .ssh_words import gpu_problem, ssh_problem

if TYPE_CHECKING:
    from ...plan.plan import Plan

PROBE_TIMEOUT_S = 40.0


def _probe(plan: Plan, host: str, port: int, dial: str) -> Tuple[Optional[dict], str]:
    """(the host's hello, or None with ssh's words)."""
    assert plan.ssh is not None
    argv = plan.ssh.template_argv(host, os.getcwd(), os.environ.get("PYTHONPATH", ""), port, probe=dial)
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None, f"no answer within {PROBE_TIMEOUT_S:.0f}s"
    except OSError as e:
        return None, f"ssh could not run: {e}"
    for line in done.stdout.splitlines():
        if line.startswith('{"'):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "hello":
                return event, ""
    return None, (done.stderr + done.stdout).strip()


def _round(plan: Plan, port: int, dial: str) -> Dict[str, Tuple[Optional[dict], str]]:
    assert plan.ssh is not None
    names = plan.ssh.names
    with ThreadPoolExecutor(max_workers=min(32, len(names))) as pool:
        answers = list(pool.map(lambda ih: _probe(plan, ih[1], port if ih[0] == 0 else 0, dial), enumerate(names)))
    return dict(zip(names, answers))


def _host_check(plan: Plan, host: str, hello: Optional[dict], said: str, first: bool) -> Check:
    assert plan.ssh is not None
    name = f"host {host}"
    if hello is None:
        return Check(name, False, ssh_problem(host, said, plan.ssh.remote_python) if said else "no answer")
    differs = node_hello.mismatch(node_hello.identity(), hello)
    if differs:
        return Check(name, False, f"other code: {differs}; install the same versions there, or --remote-python PATH")
    gpus, slots = int(hello.get("gpus") or 0), dict(plan.ssh.hosts)[host]
    why = gpu_problem(plan, gpus, slots)
    if why:
        return Check(name, False, why)
    if first and hello.get("port_free") is False:
        return Check(name, False, f"MASTER_PORT {plan.master_port} is taken there; --master-port PORT, or leave it out for a free one")
    return Check(name, True, f"{hello.get('hostname')}: python {hello.get('python')}, ddp_magic {hello.get('ddp_magic')}, "
                 f"torch {hello.get('torch')} (the same code as here), {gpus} GPUs for {slots} slots")


def _dial_checks(plan: Plan, control: str) -> List[Check]:
    """Each host dials a port the kernel listens on at ``control`` for the moment: a firewall between them is named."""
    try:
        listener = socket.socket(address_family(control), socket.SOCK_STREAM)
        listener.bind((control, 0))
        listener.listen(64)
    except OSError as e:
        return [Check("control channel", False, f"cannot listen on {control}: {e}; --control-addr ADDR")]
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                listener.accept()[0].close()
            except OSError:
                continue

    threading.Thread(target=accept, name="ddp-ssh-probe", daemon=True).start()
    target = f"{control}:{listener.getsockname()[1]}"
    try:
        answers = _round(plan, 0, target)
    finally:
        stop.set()
        listener.close()
    out = []
    for host, (hello, said) in answers.items():
        why = "no answer the second time: " + said if hello is None else str(hello.get("dial") or "")
        out.append(Check(f"{host} reaches the kernel", not why, f"{target}: " + (
            f"{why}: a firewall between {host} and this machine? --control-addr ADDR chooses another address" if why else "reached")))
    return out


def preview(plan: Plan) -> Tuple[Plan, List[Check]]:
    """The plan with MASTER_ADDR the first host's, and a check a host (nothing started)."""
    assert plan.ssh is not None
    answers = _round(plan, plan.master_port, "")
    names = plan.ssh.names
    checks = [Check("SSH hosts", True, f"{plan.ssh.describe()}; ssh: {' '.join(plan.ssh.ssh_argv(names[0], ['...']))}", level="info")]
    checks += [_host_check(plan, h, answers[h][0], answers[h][1], i == 0) for i, h in enumerate(names)]
    hellos = {h: a[0] for h, a in answers.items() if a[0] is not None}
    if len(hellos) < len(names):
        return plan, checks
    addr = node_hello.master_addr(hellos[names[0]], [hellos[h] for h in names[1:]]) or names[0]
    plan = replace(plan, master_addr=addr)
    control = plan.master_addr if not addr else (route_source(address_family(addr), addr) or "")
    if not control:
        return plan, checks + [Check("control channel", False, f"no route from this machine to {addr}; --control-addr ADDR")]
    try:
        checks += _dial_checks(plan, control)
    except Exception:  # a probe that could not run: the start finds the same and says so
        log.debug("the hosts' dial check failed", exc_info=True)
    return plan, checks
