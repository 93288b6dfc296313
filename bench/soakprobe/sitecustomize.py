"""A diagnostic probe for the soak's API process: on PYTHONPATH with ENGINEFARM_SOAK_TRACE_DIR set, the API
(``python -m enginefarm api``) traces its Python allocations and, every ENGINEFARM_SOAK_TRACE_SECONDS, writes what
grew since a baseline taken after the warm-up: by line, by traceback, and the object count by type."""

import os
import sys

_DIR = os.environ.get("ENGINEFARM_SOAK_TRACE_DIR")
_ARGV = getattr(sys, "orig_argv", sys.argv)
if _DIR and "enginefarm" in _ARGV and "api" in _ARGV:
    import collections
    import gc
    import threading
    import time
    import tracemalloc

    tracemalloc.start(10)
    _EVERY = float(os.environ.get("ENGINEFARM_SOAK_TRACE_SECONDS", "300"))
    _WARM = float(os.environ.get("ENGINEFARM_SOAK_TRACE_WARMUP", "600"))
    _FILTERS = [
        tracemalloc.Filter(False, tracemalloc.__file__),
        tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
    ]

    def _rss_kb() -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def _types() -> collections.Counter:
        return collections.Counter(type(o).__qualname__ for o in gc.get_objects())

    def _run() -> None:
        pid, t0 = os.getpid(), time.monotonic()
        time.sleep(_WARM)
        gc.collect()
        base, base_types, base_rss = tracemalloc.take_snapshot().filter_traces(_FILTERS), _types(), _rss_kb()
        n = 0
        while True:
            time.sleep(_EVERY)
            n += 1
            gc.collect()
            snap, types, rss = tracemalloc.take_snapshot().filter_traces(_FILTERS), _types(), _rss_kb()
            cur, peak = tracemalloc.get_traced_memory()
            lines = [
                f"t={time.monotonic() - t0:.0f} s pid={pid} rss={rss / 1024:.1f} MiB"
                f" (+{(rss - base_rss) / 1024:.1f} since baseline) traced={cur / 2**20:.1f} MiB"
                f" peak={peak / 2**20:.1f} MiB gc_counts={gc.get_count()} objects={sum(types.values())}",
                "",
                "== by line ==",
            ]
            for s in snap.compare_to(base, "lineno")[:40]:
                lines.append(str(s))
            lines += ["", "== by traceback =="]
            for s in snap.compare_to(base, "traceback")[:12]:
                lines.append(f"{s.size_diff / 1024:+.1f} KiB {s.count_diff:+d} blocks")
                lines += ["    " + x for x in s.traceback.format()[-10:]]
            lines += ["", "== object counts, growth =="]
            growth = {k: types[k] - base_types.get(k, 0) for k in types}
            for k, d in sorted(growth.items(), key=lambda kv: -kv[1])[:30]:
                lines.append(f"{d:+7d} {k} ({types[k]})")
            with open(os.path.join(_DIR, f"api-{pid}-{n:03d}.txt"), "w") as f:
                f.write("\n".join(lines) + "\n")

    threading.Thread(target=_run, name="soak-trace", daemon=True).start()
