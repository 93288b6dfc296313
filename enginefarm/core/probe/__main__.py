"""``python -m enginefarm.core.probe``: the probe as JSON, then the report."""

import sys

from enginefarm.core.probe.report import main

sys.exit(main())
