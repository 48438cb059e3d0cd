"""python3 -m corectl_backup: the program, from its package (the role ships it as one zipapp)."""

import sys

from .cli import main

sys.exit(main())
