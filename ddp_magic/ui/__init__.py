"""What the user sees in the notebook: views of the pool, never decisions about it.

- status.py: the entry point of a cell's status view (``show_status``, ``choose_mode``);
- status_view.py: ``StatusView``, the pool Listener that presents (throttling, ticker, display ids);
- status_display.py: where the view goes, one strategy per front end (widget, html, text, off);
- status_render.py: what the view says, pure functions from a snapshot to text and HTML;
- report.py: what ``%ddp_env`` shows (the env each rank gets, the checks) and the shared table helpers;
- output.py: rank-prefixed output in the cell's own streams;
- results.py: ``RankResults``, the value a ``%%ddp`` cell returns;
- labcomm.py: the comm to the JupyterLab extension (labextension/).

Importing ddp_magic.ui imports nothing else: ipywidgets is imported when a widget is shown.
"""
