"""Who drives the pool and when: one cell at a time, a background job's peeks and stdin beside it; a kept pool's lease is next door, in keep/."""
