"""A pool's secret across a wire that is not encrypted: masked by a key only the two ends hold (srun's stdin, Ray's RPC).

Two ways to hold that key:
- a key both ends had already (``seal``/``unseal``): a Slurm template's step secret, which MUNGE brought (wire/slurm_env.py),
  masks a later pool's secret on srun's stdin;
- a key agreed over the wire itself (``Ephemeral``, ``sealed_for``, ``opened``): a Ray node's template is started by its actor,
  and everything the kernel tells it crosses Ray's RPC, which is clear unless the cluster turned on Ray's TLS. The template
  makes a Diffie-Hellman key (RFC 3526 group 14, the 2048-bit group SSH uses) and says its public half in its hello; the
  kernel seals the pool's secret to it with a key of its own for that line. Someone who reads the wire (the hello, the
  line) cannot open it. Someone who can also rewrite Ray's RPC in flight could pose as both ends: against that, Ray's TLS
  (docs/ray.md). Python's own ``pow`` does the arithmetic: no dependency, about 5 ms a key.

The pad is HMAC-SHA256 in counter mode over a nonce never used twice with one key; a wrong key opens to other bytes,
which no peer accepts (protocol.py's HMAC proves the secret both ways).
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from typing import Dict

# RFC 3526, section 3: the 2048-bit MODP group (generator 2)
P = int(
    "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A08798E3404DD"
    "EF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7ED"
    "EE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3DC2007CB8A163BF0598DA48361C55D39A69163FA8FD24CF5F"
    "83655D23DCA3AD961C62F356208552BB9ED529077096966D670C354E4ABC9804F1746C08CA18217C32905E462E36CE3B"
    "E39E772C180E86039B2783A2EC07A28FB5C55DF06F4C52C9DE2BCBF6955817183995497CEA956AE515D2261898FA0510"
    "15728E5A8AACAA68FFFFFFFFFFFFFFFF", 16)
G = 2
EXPONENT_BITS = 512  # twice the group's ~112-bit strength, and more: RFC 3526 section 8 asks for at least 2x
CONTEXT = b"ddp_magic sealed secret v1"


def _pad(key: bytes, nonce: bytes, size: int) -> bytes:
    out, block = b"", 0
    while len(out) < size:
        out += hmac.new(key, nonce + block.to_bytes(4, "big"), hashlib.sha256).digest()
        block += 1
    return out[:size]


def seal(key: bytes, secret: bytes, nonce: bytes) -> str:
    """``secret`` masked by a pad only ``key`` makes (hex). Never the same ``nonce`` twice for one key."""
    return bytes(a ^ b for a, b in zip(secret, _pad(key, nonce, len(secret)))).hex()


def unseal(key: bytes, sealed: str, nonce: bytes) -> bytes:
    """``seal``'s inverse."""
    data = bytes.fromhex(sealed)
    return bytes(a ^ b for a, b in zip(data, _pad(key, nonce, len(data))))


class Ephemeral:
    """One Diffie-Hellman key, made for one exchange and never stored: its public half goes over the wire (hex)."""

    def __init__(self) -> None:
        self._x = secrets.randbits(EXPONENT_BITS) | (1 << (EXPONENT_BITS - 1))
        self.public = format(pow(G, self._x, P), "x")

    def shared(self, their_public: str) -> bytes:
        """The key both ends compute from the other's public half; ValueError for a value no honest peer sends."""
        try:
            y = int(their_public, 16)
        except (TypeError, ValueError):
            raise ValueError("the peer's key is not a hex number") from None
        if not 1 < y < P - 1:  # 0, 1 and P-1 would fix the shared value whatever our key
            raise ValueError("the peer's key is outside the group")
        z = pow(y, self._x, P)
        return hashlib.sha256(CONTEXT + z.to_bytes(256, "big")).digest()


def sealed_for(their_public: str, secret: bytes) -> Dict[str, str]:
    """``secret`` for the holder of the key whose public half is ``their_public``: a key of our own for this line alone,
    its public half, and the secret sealed with what both compute (``opened`` reads it)."""
    ours, nonce = Ephemeral(), os.urandom(16)
    return {"key": ours.public, "nonce": nonce.hex(), "sealed": seal(ours.shared(their_public), secret, nonce)}


def opened(mine: Ephemeral, entry: Dict[str, str]) -> bytes:
    """The secret ``sealed_for`` sealed to ``mine``'s public half; ValueError when ``entry`` is not such a thing."""
    try:
        key, nonce, sealed = entry["key"], bytes.fromhex(entry["nonce"]), entry["sealed"]
    except (KeyError, TypeError, ValueError):
        raise ValueError("the sealed secret is malformed") from None
    return unseal(mine.shared(key), sealed, nonce)
