"""``python -m perfdoctor`` runs the CLI."""

from perfdoctor.cli import main

main()
