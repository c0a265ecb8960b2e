"""``python -m cli`` runs the tfm command line (as torchrun needs a module)."""

from cli.main import main

main()
