"""`python -m needlepoint`: the `needlepoint` console script."""

import sys

from .command import main

sys.exit(main())
