"""An API process is limited to a few malloc arenas (worker/process/malloc.py, ``limit_arenas``), set through glibc."""

from __future__ import annotations

import ctypes

from worker.process import malloc


def test_the_arena_limit_is_set_through_mallopt(monkeypatch):
    calls = []

    class Libc:
        @staticmethod
        def mallopt(option, value):
            calls.append((option, value))
            return 1

    monkeypatch.setattr(ctypes, "CDLL", lambda name: Libc)
    assert malloc.limit_arenas(2) is True
    assert calls == [(malloc.M_ARENA_MAX, 2)]
    assert malloc.limit_arenas(0) is False and calls == [(malloc.M_ARENA_MAX, 2)]  # 0: glibc's own, nothing set


def test_without_glibcs_mallopt_nothing_is_set(monkeypatch):
    def no_libc(name):
        raise OSError("no such library")

    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    assert malloc.limit_arenas(2) is False
    assert malloc.keep_freed_memory(256) is False
