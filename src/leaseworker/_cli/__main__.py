"""``python -m leaseworker._cli``: the ``leaseworker`` command."""

import sys

from ._main import main

sys.exit(main())
