"""The pool's secret across a clear wire (wire/seal.py): masked by a key both ends had (srun's stdin, a Slurm step's
secret), or by one they agree on over the wire itself (a Ray node's template, whose every line crosses Ray's RPC)."""
from __future__ import annotations

import json

import pytest

from ddp_magic.kernel.launchers.ray import RayLauncher
from ddp_magic.procs.ssh_template import init_secret
from ddp_magic.wire import seal


def test_a_later_pools_secret_crosses_srun_stdin_sealed_with_the_steps():
    key, secret = bytes(range(32)), bytes(range(100, 132))
    nonce_a, nonce_b = b"a" * 16, b"b" * 16
    sealed = seal.seal(key, secret, nonce_a)
    assert secret.hex() not in sealed and len(bytes.fromhex(sealed)) == len(secret)
    assert seal.unseal(key, sealed, nonce_a) == secret
    assert seal.seal(key, secret, nonce_b) != sealed, "another nonce, another pad"
    assert seal.unseal(bytes(32), sealed, nonce_a) != secret, "only the step's key opens it"
    long = bytes(range(70))
    assert seal.unseal(key, seal.seal(key, long, nonce_a), nonce_a) == long, "longer than one HMAC block"


def test_a_secret_sealed_to_a_public_key_opens_with_its_private_half_only():
    mine, other, secret = seal.Ephemeral(), seal.Ephemeral(), bytes(range(32))
    entry = seal.sealed_for(mine.public, secret)
    assert seal.opened(mine, entry) == secret
    assert seal.opened(other, entry) != secret, "another key (one who read the hello and the line) opens other bytes"
    wire = json.dumps([mine.public, entry])
    assert secret.hex() not in wire, "nothing on the wire holds the secret as it is"
    again = seal.sealed_for(mine.public, secret)
    assert again["key"] != entry["key"] and again["sealed"] != entry["sealed"], "a key of the kernel's own each line"
    assert seal.Ephemeral().public != mine.public


@pytest.mark.parametrize("bad", ["0", "1", format(seal.P - 1, "x"), format(seal.P, "x"), "not hex", ""])
def test_a_public_half_no_honest_peer_sends_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        seal.sealed_for(bad, b"s" * 32)


def test_a_ray_templates_first_line_holds_the_secret_sealed_to_each_nodes_key_and_never_as_it_is():
    secret = bytes(range(7, 39))
    launcher = RayLauncher(secret)
    keys = {"n1": seal.Ephemeral(), "n2": seal.Ephemeral()}
    launcher.placed_nodes = [{"name": n} for n in keys]
    launcher.hellos = {n: {"event": "hello", "node": n, "key": k.public} for n, k in keys.items()}
    line = launcher.first_line({"OMP_NUM_THREADS": "1"})
    assert secret.hex() not in json.dumps(line) and "secret" not in line, line
    assert sorted(line["sealed_to"]) == ["n1", "n2"] and line["env"] == {"OMP_NUM_THREADS": "1"}
    assert init_secret(line, "n2", keys["n2"]) == secret, "the template (procs/ssh_template.py) opens its own"
    assert init_secret(line, "n1", keys["n2"]) != secret, "n2's key does not open n1's"
    with pytest.raises(ValueError, match="no secret sealed to n3"):
        init_secret(line, "n3", keys["n2"])
    with pytest.raises(ValueError, match="no secret sealed"):
        init_secret({"secret": secret.hex()}, "n2", keys["n2"]), "a template that made a key takes no clear secret"
    again = launcher.first_line({}, only="n2")
    assert list(again["sealed_to"]) == ["n2"], "a node placed again: its line alone"


def test_an_ssh_templates_secret_comes_as_it_is():
    assert init_secret({"secret": "ab" * 4}, "h1", None) == bytes.fromhex("ab" * 4)
