"""Test support: real servers, synthetic checkpoints and artifact builders for tests and benchmarks.

Kept out of the product on purpose (it starts servers with test credentials and writes random
models): ``src/quantgate`` never imports it, and ``tests/unit/test_layout.py`` fails if it does.
pytest puts ``tests/`` on ``sys.path`` (``pythonpath`` in pyproject.toml), so tests import
``support.servers``, ``support.models`` and ``support.artifacts``; bench scripts add ``tests/``
to ``sys.path`` themselves.
"""
