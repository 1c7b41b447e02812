"""Helpers shared by the test modules (no tests here: pytest collects only ``test_*.py``).

Imported as ``from drafters.harness import ...``: ``tests/`` is on ``sys.path`` through the
rootdir ``conftest.py``, as for ``from conftest import ...``."""
