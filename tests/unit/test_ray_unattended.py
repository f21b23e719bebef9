"""A kept Ray pool's driver with no kernel here (procs/ray_unattended.py, procs/ray_keep.py): which lost node it places
again itself, and what the new template hears from it: the words the keeping kernel would have said."""
from __future__ import annotations

import json
import threading
from types import SimpleNamespace

from ddp_magic.procs.ray_keep import DriverKeep
from ddp_magic.procs.ssh_template import init_secret
from ddp_magic.wire import node_hello, seal

SECRET = bytes(range(32))
THEN = [{"op": "keep", "id": "ab", "node": "n1"}, {"op": "follow", "node": "n1", "id": "ab", "lease": {"host": "h", "port": 1}}]


def _kept(alone: bool = True) -> DriverKeep:
    keep = DriverKeep(lambda: None)
    keep.watch = SimpleNamespace(secret=SECRET, over=threading.Event(), stopping=False, failed=False)  # type: ignore[assignment]
    keep.admit = {"env": {"OMP_NUM_THREADS": "1"}, "then": THEN}
    keep.alone = alone
    return keep


def test_only_a_kept_pools_follower_node_is_placed_again_and_only_with_no_kernel_here() -> None:
    assert _kept().places_alone(1)
    assert not _kept().places_alone(0), "the lease holder's node: its loss ended the lease"
    assert not _kept(alone=False).places_alone(1), "the kernel that kept the pool is here: its next cell places it"
    unkept = _kept()
    unkept.watch = None
    assert not unkept.places_alone(1)
    nothing = _kept()
    nothing.admit = {}
    assert not nothing.places_alone(1), "a keeping kernel that said nothing of how to admit it"


def test_the_new_template_hears_its_secret_sealed_to_its_key_then_the_keep_and_follow() -> None:
    key = seal.Ephemeral()
    hello = dict(node_hello.hello("n2"), key=key.public)
    words = _kept().first_words("n2", hello)
    assert SECRET.hex() not in "".join(words)
    first = json.loads(words[0])
    assert init_secret(first, "n2", key) == SECRET and first["env"] == {"OMP_NUM_THREADS": "1"}
    assert [json.loads(w) for w in words[1:]] == THEN


def test_a_template_placed_again_with_other_code_or_no_key_is_dropped() -> None:
    other = dict(node_hello.hello("n2"), key=seal.Ephemeral().public, ddp_magic_hash="0" * 16)
    assert _kept().first_words("n2", other) == []
    assert _kept().first_words("n2", node_hello.hello("n2")) == []
