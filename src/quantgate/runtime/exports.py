"""A stage's public names, each imported from its module when first used (PEP 562).

Every stage names its public API in its ``__init__`` and the other stages import only that
(``from quantgate.evaluate import evaluate``), which the layer contracts check
(tests/unit/test_layers.py). Importing a package must stay as cheap as its lightest name:
``quantgate gate`` reads the suite kinds' metric declarations and must not load torch with the
evaluation runner. So an ``__init__`` lists its names for type checkers under ``TYPE_CHECKING``
and in ``__all__``, and resolves them here at run time, from the module that defines them, on
each access (a test that patches the defining module is seen by every importer).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_exports(package: str, names: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: ``name`` from ``package.<names[name]>`` on use
    (``"module:attr"`` where the public name differs from the one the module defines)."""

    def __getattr__(name: str) -> object:
        where = names.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = where.partition(":")
        return getattr(importlib.import_module(f"{package}.{module}"), attr or name)

    return __getattr__
