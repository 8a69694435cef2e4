"""`python -m argusdiff`: the same command line as `argusdiff`."""

import sys

from argusdiff.cli import main

sys.exit(main())
