"""A rank's arming for --save-on-preempt (procs/rank_preempt.py), in a real process with real signals.

The reader thread gets ARM while the main thread cannot run a handler yet (as inside a collective's C call): the marker that tells
the template "armed" appears only once the main thread ignores SIGTERM, so the template's SIGUSR1 can never merge with
the arming's own poke; after it, SIGUSR1 is reported once and SIGTERM no longer ends the rank. A later ARM pokes no
more. Unarmed, SIGUSR1 changes nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from ddp_magic.wire import shm

CHILD = r"""
import json, os, signal, sys, threading, time
from ddp_magic.procs import rank_preempt
from ddp_magic.wire import shm

sent = []
rank_preempt.install(lambda kind, **kw: sent.append(kw), rank=0)
marker = shm.armed_file(os.environ[shm.ENV])
out = {}
os.kill(os.getpid(), signal.SIGUSR1)  # unarmed: nothing told, nothing ended
time.sleep(0.1)
out["unarmed_told"] = list(sent)

def reader():
    rank_preempt.arm({"id": 7})
    time.sleep(0.3)
    out["marker_during_c_call"] = os.path.exists(marker)

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # as inside a collective's C call: no handler runs yet
t = threading.Thread(target=reader)
t.start()
t.join()
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})  # the call returns: the poke's handler runs now
deadline = time.monotonic() + 5
while not os.path.exists(marker) and time.monotonic() < deadline:
    time.sleep(0.01)
out["marker_after"] = os.path.exists(marker)
rank_preempt.arm({"id": 8})  # a later cell's ARM: no poke (it could swallow a preemption)
out["arming_again"] = rank_preempt.STATE.arming
os.kill(os.getpid(), signal.SIGTERM)  # ignored now
os.kill(os.getpid(), signal.SIGUSR1)  # the template's word: told once, under the last desk
os.kill(os.getpid(), signal.SIGUSR1)
deadline = time.monotonic() + 5
while not sent and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.2)
out["told"] = sent
print(json.dumps(out), flush=True)
"""


def test_the_marker_waits_for_the_main_thread_and_a_sigusr1_after_it_is_told_once() -> None:
    prefix = shm.pool_prefix(os.urandom(4).hex())
    env = dict(os.environ, **{shm.ENV: prefix})
    try:
        done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert out["unarmed_told"] == []
        assert out["marker_during_c_call"] is False, "no marker while SIGTERM would still end the rank"
        assert out["marker_after"] is True
        assert out["arming_again"] is False
        assert out["told"] == [{"id": 8, "what": "preempted", "rank": 0, "signal": "SIGUSR1"}], out["told"]
    finally:
        shm.remove_pool_files(prefix)
