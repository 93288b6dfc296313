"""``enginefarm up``'s children's logs stay bounded: the supervisor cuts a log past its size to NAME.log.1 while
the child goes on writing, at the new end of its file (it appends), so a farm that runs for months keeps at most
twice the bound per child, and nothing is lost but lines written between the copy and the cut."""

from __future__ import annotations

import re
import sys
import time

from server.embedded import Farm

BOUND = 64 * 1024
LINES = 6000
WRITER = f"""
import time
for i in range({LINES}):
    print(f"line {{i:05d}} " + "x" * 40, flush=True)
    if i % 50 == 0:
        time.sleep(0.005)
print("done", flush=True)
time.sleep(60)
"""


def test_a_childs_log_is_cut_at_its_bound_and_the_child_writes_on(tmp_path):
    farm = Farm({}, log_dir=tmp_path, log_max_bytes=BOUND)
    log, old = tmp_path / "worker-w.log", tmp_path / "worker-w.log.1"
    with farm:
        farm.workers["w"] = farm._spawn("worker-w", [sys.executable, "-c", WRITER])
        deadline, biggest = time.monotonic() + 60, 0
        # "done" may be cut into the old file by the pass after it was written, before this loop reads it.
        while (
            time.monotonic() < deadline
            and b"done" not in (old.read_bytes() if old.exists() else b"") + log.read_bytes()
        ):
            farm.supervise()
            biggest = max(biggest, log.stat().st_size)
            time.sleep(0.05)
        text, before = log.read_bytes(), old.read_bytes()  # before another pass could cut the log again
    assert b"done" in before + text
    # 6,000 lines of 52 bytes (312 KB) went through a 64 KiB bound: cut several times, never far past it.
    assert biggest < 2 * BOUND and len(text) < 2 * BOUND and 0 < len(before) < 2 * BOUND
    assert b"\0" not in text  # no hole: the child appends, so it writes on at the start of the emptied file
    numbers = [int(n) for n in re.findall(rb"line (\d{5})", before + text)]
    assert numbers == sorted(numbers) and numbers[-1] == LINES - 1
