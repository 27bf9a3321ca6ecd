"""The ``quantgate`` command line: a contract, since CI, the fleet and reviewers script it.

One module per command (``build``, ``evaluate`` for ``eval``, ``gate``, ``report``, ``publish``,
``pull``, ``seed``, ``release``, ``repair``, ``replay``, ``run``), each a thin wrapper that parses options,
calls its stage's library function and prints; the options they share are declared once
(``options``), so an option means the same in every command. ``commands`` assembles them, loads
every installed plugin under a guard before any work (a plugin that cannot load is exit 2), and
maps errors to exit codes. A command
imports its stage when it runs, so ``quantgate pull`` loads the registry client and nothing else.
"""

from quantgate.cli.commands import app, main

__all__ = ["app", "main"]
