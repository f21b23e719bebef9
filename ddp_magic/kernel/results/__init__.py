"""What the ranks return, in the kernel: unpacking and gathering values, DTensor pieces, metrics rows, merged profiles."""
