"""The separate programs ddp_magic starts, each run as ``python -m ddp_magic.procs.<name>``.

- ``worker``: one rank (connect, serve loop, run cells); ``rank_torch`` holds its torch.distributed set-up.
- ``forkserver``: the template that imports torch once and forks ranks.
- ``rendezvous``: the c10d store for pools that span nodes.
- ``parent``: the parent-death signal all three use.

Rank-side code imports only procs/, wire/ and logs (tests/unit/test_structure.py).
"""
