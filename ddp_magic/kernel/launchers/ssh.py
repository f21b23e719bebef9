"""The SSH launcher: one template a host (the remote command of one ssh session a host, in parallel) forks that host's ranks.

``acquire`` starts the user's own ``ssh`` to every host at once (plan/ssh.py: BatchMode,
their config, agent, ProxyJump and known_hosts), each running procs/ssh_template.py. Each
template first says who it is (wire/node_hello.py); a host that does not answer, asks for a
password, has an unknown or changed key, lacks python or ddp_magic, runs other code
(version or content hash), has fewer GPUs than slots under nccl, or holds MASTER_PORT is
refused by name, with its fix, and every session ends: nothing ran. Then each template
gets its first line on stdin: the pool's secret and the env its ranks share; it imports
torch while the kernel listens. From there it is Slurm's machinery (nodes.py): spawn
commands on the session's stdin, events on its stdout, ranks dialling the kernel with
TLS, a lost host's template started again when its ranks are.

MASTER_ADDR is the first host's address on the route to the others; each rank picks the
interface on its route to it (procs/rank_net.py), as on Slurm. The kernel beats every
``BEAT_S`` on every session: a template that hears nothing for its silence ends its ranks
(the kernel's host gone, its link down), as it does when its session closes.

A kept pool (docs/keep.md, "Over SSH"): the first host's template holds the lease (TCP and TLS), the others
follow it, and every template detaches from its session (procs/ssh_template.py says why); on this host a process
of its own watches the lease (procs/lease_keeper.py), since nothing else here outlives the kernel.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Dict, List, Optional

from ...logs import log
from ...plan.net import address_family, is_local_ip, master_port, route_source
from ...plan.ssh import AUTO_REASON, CONNECT_TIMEOUT_S, SshRequest
from ...wire import node_hello, tls
from .base import LaunchError, popen
from .hosts import HostLauncher, forwarded
from .slurm_steps import TemplateStep
from .ssh_words import failed_text, gpu_problem, ssh_problem

if TYPE_CHECKING:
    from ...plan.plan import Plan

HELLO_WAIT_S = CONNECT_TIMEOUT_S + 20.0  # ssh's own connect timeout, then a slow login and python's start


class SshLauncher(HostLauncher):
    """Ranks forked by one template a host, each the remote command of an ssh session; the sessions are held across
    restarts (a new -n on the same hosts forks from them) and ended by ``close``."""

    name = "ssh"

    def __init__(self, secret: bytes, python: str = sys.executable) -> None:
        super().__init__(secret, python)
        self.request: Optional[SshRequest] = None
        self.hellos: Dict[str, dict] = {}  # host -> its template's hello (wire/node_hello.py)
        self._port = 0  # a MASTER_PORT the first host said is free
        self.released = ""
        self.keeper: Optional[subprocess.Popen] = None  # a kept pool's watch of its lease on this host (procs/lease_keeper.py)

    def start(self, timeout: float = 0) -> str:
        return "ssh (a template a host, over your ssh)"

    def nodes(self) -> List[str]:
        return self.request.names if self.request is not None else []

    # ------------------------------------------------------------ the sessions
    def acquire(self, plan: Plan, progress: Callable[[str], None]) -> Optional[str]:
        """Every host's template, checked: the sessions held if they serve ``plan``, else new ones (refused by name)."""
        request = plan.ssh
        assert request is not None, "an SSH launcher needs a plan with hosts"
        self.plan = plan
        if self.serves(plan):
            self.tls_key = tls.ServerKey() if self._needs_tls() else None
            return None
        self._release()
        self.request = request
        t0 = time.monotonic()
        self._port = plan.master_port if plan.port_was_given else master_port(request.names[0], local=False)
        steps = {host: self._session(host, self._port if i == 0 else 0) for i, host in enumerate(request.names)}
        problems = self._check(steps, plan)
        if problems:
            self._end_steps()
            self.request = None
            raise LaunchError(failed_text(problems))
        env = forwarded(dict(os.environ))
        for step in self.steps:
            self.hand_over(step, env)
        self.start_beat()
        self.tls_key = tls.ServerKey() if self._needs_tls() else None
        return (f"{request.describe()}: {len(steps)} templates started in {time.monotonic() - t0:.1f}s"
                + (" (control channel: TLS)" if self.tls_key else ""))

    def _session(self, host: str, port: int) -> TemplateStep:
        """One ssh session running ``host``'s template (it says hello at once)."""
        assert self.request is not None
        argv = self.request.template_argv(host, os.getcwd(), os.environ.get("PYTHONPATH", ""), port)
        step = TemplateStep(argv, {}, self.secret, [host], self.log, proc_env=dict(os.environ))
        self.steps.append(step)
        return step

    def _check(self, steps: Dict[str, TemplateStep], plan: Plan) -> Dict[str, str]:
        """host -> what is wrong with it (ssh's words, another code, too few GPUs, MASTER_PORT held); {} when none."""
        deadline = time.monotonic() + HELLO_WAIT_S
        mine = node_hello.identity()
        problems: Dict[str, str] = {}
        for i, (host, step) in enumerate(steps.items()):
            if not step.wait_until(lambda h=host, s=step: h in s.hello, deadline):  # type: ignore[misc]
                said, python = "\n".join(step.said), self.request.remote_python if self.request else ""
                problems[host] = ssh_problem(host, said, python) if said else f"no answer within {HELLO_WAIT_S:.0f}s"
                continue
            hello = self.hellos[host] = step.hello[host]
            differs = node_hello.mismatch(mine, hello)
            too_few = gpu_problem(plan, int(hello.get("gpus") or 0), dict(plan.ssh.hosts)[host] if plan.ssh else plan.nproc)
            if differs:
                problems[host] = f"other code: {differs}"
            elif too_few:
                problems[host] = too_few
            elif i == 0 and hello.get("port_free") is False:
                problems[host] = f"MASTER_PORT {self._port} is taken there"
        return problems

    def _start_step(self, nodes: List[str], env: Dict[str, str]) -> TemplateStep:
        """A new session for a host whose template is gone (its ranks are started again): its hello is not waited for,
        its first line queued at once (ssh sends it once the host's key and our key are checked)."""
        step = self._session(nodes[0], 0)
        self.hand_over(step, env)
        return step

    def serves(self, plan: Plan) -> bool:
        """Whether the sessions held run ``plan``'s hosts (the same request) and each still has its template."""
        return (plan.ssh is not None and self.request == plan.ssh and bool(self.steps)
                and all(self._step_for(h) is not None for h in self.request.names))

    def _needs_tls(self) -> bool:
        """TLS unless every host is this machine (or when forced)."""
        addrs = [str(h.get("ssh_server") or "") for h in self.hellos.values()]
        return tls.forced() or not all(a and is_local_ip(address_family(a), a) for a in addrs)

    def placed(self, plan: Plan, avoid: int = 0) -> Plan:
        """MASTER_ADDR the first host's address on the route to the others; the port it said is free; nccl when the
        backend was left to choose and every host has a GPU a slot."""
        assert self.request is not None
        names = self.request.names
        first = self.hellos.get(names[0], {})
        addr = node_hello.master_addr(first, [self.hellos.get(h, {}) for h in names[1:]]) or names[0]
        port = plan.master_port if plan.port_was_given else (self._port if self._port != avoid else master_port(addr, avoid, local=False))
        out = replace(plan, master_addr=addr, master_port=port)
        gpus = [int(self.hellos.get(h, {}).get("gpus") or 0) for h in names]
        slots = [s for _, s in self.request.hosts]
        if plan.backend_reason == AUTO_REASON and all(g >= s for g, s in zip(gpus, slots)) and plan.init:
            out = replace(out, backend="nccl", backend_reason=f"each host has a GPU a slot ({', '.join(map(str, gpus))})")
        return out

    def listen_addr(self, asked: Optional[str], default: str) -> str:
        """--control-addr, else the address this machine reaches the first host from."""
        if asked:
            return asked
        assert self.request is not None
        first = self.hellos.get(self.request.names[0], {})
        addr = node_hello.master_addr(first, []) or ""
        return (route_source(address_family(addr), addr) if addr else None) or default

    def unanswered(self, nodes: List[str], within: float) -> List[str]:
        """The nodes whose template does not answer a ping over its session within ``within`` seconds, less those a new
        ssh connection reaches now: a link that came back may leave the old session in TCP's backoff for many seconds
        more; such a session is ended (its template with it) and the host's ranks get a new one."""
        silent = super().unanswered(nodes, within)
        if not silent or self.request is None:
            return silent
        request = self.request

        def answers(host: str) -> bool:
            argv = request.ssh_argv(host, ["true"])
            argv[argv.index(f"ConnectTimeout={CONNECT_TIMEOUT_S}")] = f"ConnectTimeout={max(1, int(within))}"
            try:
                return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=within + 5).returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                log.debug("ssh %s true: no answer", host, exc_info=True)
                return False

        with ThreadPoolExecutor(max_workers=len(silent)) as pool:
            back = [h for h, ok in zip(silent, pool.map(answers, silent)) if ok]
        for host in back:
            step = self._step_for(host)
            if step is not None:
                step.end()
                step.wait_end(time.monotonic() + 2.0)
        return [h for h in silent if h not in back]

    def alive(self) -> bool:
        """Whether any host's template is there (a lost host's ranks are started again, with a new template)."""
        return self.request is not None and any(s.proc.poll() is None for s in self.steps)

    def where(self) -> str:
        """'2 hosts over SSH (n1:2,n2:2): n1 (198.51.100.11), n2 (198.51.100.12)'."""
        if self.request is None:
            return ""
        hosts = ", ".join(f"{h} ({self.hellos.get(h, {}).get('ssh_server') or '?'}"
                          + ("" if self._step_for(h) is not None else ", its template gone") + ")" for h in self.request.names)
        return f"{self.request.describe()}: {hosts}"

    def without(self, nodes: str) -> str:
        return f"--hosts without {nodes}"

    def give_up(self) -> str:
        self._release()
        return "every host's template ended"

    # ------------------------------------------------------------ a kept pool (kernel/keep/keeping.py, docs/keep.md)
    def keepable(self) -> str:
        """Why this pool cannot outlive its kernel ("" when it can): every host must still have its template."""
        gone = [h for h in self.nodes() if self._step_for(h) is None]
        if self.request is None or gone:
            return f"{', '.join(gone) or 'its hosts'} lost {'its' if len(gone) == 1 else 'their'} template; run a cell (it starts it again), then keep"
        return ""

    @property
    def notes(self) -> List[dict]:
        """What the lease holder's template answered to keep and unkeep (its session's, the first host's)."""
        step = self._step_for(self.lease_node)
        return step.notes if step is not None else []

    def lease_bind(self) -> str:
        """Where the first host's template holds the lease: the address this host's ssh reached it at (TCP and TLS, even
        for this machine: a template's runtime directory is its login's, not the kernel's)."""
        return node_hello.master_addr(self.hellos.get(self.lease_node, {}), []) or "127.0.0.1"

    def kept_blob(self) -> Dict[str, object]:
        """What a kernel that attaches the kept pool needs to fork a rank again (kernel/keep/launcher.py): hosts, env."""
        step = self._step_for(self.lease_node)
        return {"nodes": self.nodes(), "step_env": dict(step.env if step is not None else {}), "job": ""}

    def outlive_kernel(self, lock: str, watch: Optional[Dict[str, object]] = None) -> None:
        """``%ddp keep``: a process of its own on this host watches the lease (procs/lease_keeper.py): it holds ``lock``
        and mirrors the discovery file while the lease lives, and exits with it. ``lock=""`` (``keep --off``, a keep
        that failed): the lease's ``off`` (or its absence) ends that process; the pool is this kernel's again."""
        self.lease_lock = lock
        if not lock or watch is None:
            return
        proc = popen([sys.executable, "-m", "ddp_magic.procs.lease_keeper"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                     stderr=self.log, start_new_session=True, close_fds=True)
        assert proc.stdin is not None
        proc.stdin.write((json.dumps(watch) + "\n").encode())  # the secret on its stdin only
        proc.stdin.close()
        self.keeper = proc

    def detach(self) -> None:
        """The kept pool is no more this kernel's (its exit, or another kernel took it): our sessions' stdin closes, their
        templates go on (detached since the keep); the ssh clients end with this kernel, as on Slurm nothing is signalled
        here (a signal to a session's group could reach more than its ssh client)."""
        self.let_go_of_steps("a kept pool's ssh session")
        self.request = None
        self.hellos.clear()

    def _release(self) -> None:
        self._end_steps()
        if self.keeper is not None and self.keeper.poll() is None:  # the lease's end or off ends it: give it a moment
            try:
                self.keeper.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                log.debug("the lease keeper %s is still there", self.keeper.pid)
        self.keeper = None
        self.hellos.clear()
        self.released = "; its hosts' templates ended" if self.request is not None else ""
        self.request = None
        self.tls_key = None

    def close(self) -> None:
        """End every session (each template ends its ranks), and the beat."""
        self.stop_beat()
        try:
            self._release()
        except Exception:  # a session that would not end: its template ends on its own (no beat, no stdin)
            log.debug("ending the ssh sessions failed", exc_info=True)
