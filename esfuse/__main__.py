"""`python -m esfuse` is the `esfuse` command."""

from esfuse.cli import main

main()
