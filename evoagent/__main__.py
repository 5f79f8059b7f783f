"""``python -m evoagent`` is the ``evoagent`` command."""

from evoagent.cli import main

main()
