import sys

from argusdiff.cli import main

sys.exit(main())
