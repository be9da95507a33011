import sys

from cuco_kit.cli import main

sys.exit(main())
