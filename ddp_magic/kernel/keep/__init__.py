"""A pool that outlives its kernel (``%ddp keep``, ``%%ddp --keep``) and the next kernel's ``%ddp attach``: the kernel's side.

``terms.py``: the lease's two timers and how they are said; ``keeping.py``: keep and unkeep a running pool;
``attach.py``: find a kept pool and join its ranks; ``resume.py``: a cell that ran while no kernel was
attached, driven to its end by the kernel that attached; ``launcher.py``: the kept template, reached on its
lease socket. The template's side is procs/lease.py, the ranks' procs/rank_keep.py, the files wire/kept.py.
"""
