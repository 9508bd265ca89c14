import sys

from .process import main

sys.exit(main())
