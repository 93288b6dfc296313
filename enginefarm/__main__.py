"""``python -m enginefarm``: the ``enginefarm`` command."""

from enginefarm.client.cli import main

main()
