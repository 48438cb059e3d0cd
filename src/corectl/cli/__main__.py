"""`python -m corectl.cli`."""

from corectl.cli import main

main()
