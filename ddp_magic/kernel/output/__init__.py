"""The ranks' output in the kernel: reading their raw streams, folding the same line from many ranks, the log on disk."""
