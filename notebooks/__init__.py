# Makes notebooks/conftest.py import as `notebooks.conftest`, so it never shadows tests/conftest.py
# (tests do `from conftest import ...`). Nothing here is meant to be imported.
