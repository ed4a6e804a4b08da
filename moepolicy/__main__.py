import sys

from moepolicy.cli.main import main

sys.exit(main())
