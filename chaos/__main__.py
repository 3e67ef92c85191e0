"""`python -m chaos`: see `chaos.cli`."""

import sys

from chaos.cli import main

sys.exit(main())
