"""`python -m needlepoint.cli`: the `needlepoint` console script."""

import sys

from .main import main

sys.exit(main())
