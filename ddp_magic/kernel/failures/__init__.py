"""Failures while a cell runs: who failed first, when to stop waiting, the root cause, why a rank died,
an unreachable node, hang forensics and recovery in place."""
