import sys

from .matrix import main

sys.exit(main())
