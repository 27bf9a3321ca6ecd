"""``python -m quantgate.cli``: how the orchestrator starts a step, and the tests the command line."""

from quantgate.cli.commands import main

main()
