import sys

from argus.cli.main import main

sys.exit(main())
