"""export/ (kernel): %ddp_export, the notebook's %%ddp cells as a torchrun / Slurm script.

record.py remembers the cells as they run (fed by the session and the magics),
select.py chooses what the script needs, script.py writes its text, write.py
the files, check.py runs it under torchrun and compares it with the cells.
No IPython here: the magic hands the history over as data.
"""
