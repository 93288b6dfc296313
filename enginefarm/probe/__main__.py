"""``python -m enginefarm.probe``: the probe as JSON, then the report."""

import sys

from enginefarm.probe.report import main

sys.exit(main())
