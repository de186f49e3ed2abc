"""`python -m clagd.cli`: the `clagd` command."""

from clagd.cli import main

main()
