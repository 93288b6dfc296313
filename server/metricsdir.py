"""prometheus-client's multiprocess folder for the farm's processes: the API's workers and the build workers of
one host write their metrics there, and the API's /metrics sums them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def metrics_dir(folder: Path) -> Path:
    """Where this process and its children keep prometheus-client's multiprocess files: ``folder``, emptied (a new
    set of processes counts from zero), unless the deployment named one (PROMETHEUS_MULTIPROC_DIR) or a parent
    (``enginefarm up``) did. Set before anything imports prometheus-client."""
    if given := os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return Path(given)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    return folder
