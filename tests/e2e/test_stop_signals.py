"""``enginefarm up`` and ``demo --serve`` stop on SIGTERM as on Ctrl-C (``embedded.stop_on_sigterm``), and exit 0:
also when the signal lands inside code run by ``exec()`` of a string, which leaves CPython set to end the process
by SIGINT even though the KeyboardInterrupt was caught (systemd would read the clean stop as a crash)."""

from __future__ import annotations

import subprocess
import sys

STOPPED_INSIDE_EXEC = """
from server.embedded import stop_on_sigterm
try:
    with stop_on_sigterm():
        exec("import os, signal, time\\nos.kill(os.getpid(), signal.SIGTERM)\\ntime.sleep(5)")
except KeyboardInterrupt:
    print("stopped in order")
"""


def test_a_sigterm_inside_exec_still_ends_the_block_and_the_process_cleanly():
    done = subprocess.run([sys.executable, "-c", STOPPED_INSIDE_EXEC], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    assert "stopped in order" in done.stdout
