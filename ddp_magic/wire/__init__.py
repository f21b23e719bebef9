"""Both ends of each cross-process mechanism, used by the kernel and by the ranks alike.

- ``protocol``: the control channel's framing, HMAC handshake and message kinds.
- ``transfer``: values between processes (cloudpickle, tensors out of band through /dev/shm).
- ``shm``: the pool's files in /dev/shm: names by pool, mode 0600, removal on every path.
- ``capture``: a rank's fds 1/2 as sockets to the kernel, and the sync markers the kernel scans for.
- ``namespace``: which notebook names a cell needs, and rebinding them on the rank.
- ``execution``: running a cell's source as IPython would, and the user's traceback.

Imports only wire/ and logs (tests/unit/test_structure.py).
"""
