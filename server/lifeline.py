"""Start commands that die with the process that started them, however that process dies.

A command started by ``spawn`` runs this module first: it asks Linux to send it SIGKILL when its parent dies
(``PR_SET_PDEATHSIG``, kept across ``execve``), then replaces itself with the command, which keeps the process
id. A supervisor killed with SIGKILL cannot stop its children itself, and children in their own session are
out of reach of a signal to its process group; this is what still stops them.

Linux takes the thread that started a child for its parent: the child would get the signal as soon as that
thread ended, even with the process alive. So every child is started on one thread that lasts as long as the
process, whichever thread asks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import cache

from billiard.util import set_pdeathsig


def tied(args: list[str]) -> list[str]:
    """``args`` as a command that gets SIGKILL when the thread that starts it, or this process, ends."""
    return [sys.executable, "-m", __name__, str(os.getpid()), "--", *args]


@cache
def _starter() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="enginefarm-lifeline")


def spawn(args: list[str], **popen_kwargs) -> subprocess.Popen:
    """``subprocess.Popen(args, **popen_kwargs)`` for a process that gets SIGKILL when this process dies."""
    proc: subprocess.Popen = _starter().submit(subprocess.Popen, tied(args), **popen_kwargs).result()  # type: ignore[arg-type]
    return proc


def main(argv: list[str]) -> None:
    parent, separator, *args = argv
    if separator != "--" or not args:
        sys.exit(f"usage: python -m {__name__} PARENT_PID -- COMMAND [ARG...]")
    set_pdeathsig(signal.SIGKILL)
    if os.getppid() != int(parent):  # the parent died before the signal was asked for: nobody is left to stop us
        sys.exit(1)
    os.execvp(args[0], args)


if __name__ == "__main__":
    main(sys.argv[1:])
