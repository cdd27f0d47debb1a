import sys

from fleetpulse.cli import main

sys.exit(main())
