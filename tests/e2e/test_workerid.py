"""A worker's id is NAME@HOST/INSTANCE whoever started it: ``enginefarm worker`` sets one for its processes, and
a process started otherwise (a Celery worker run by hand, a forked pool process) makes one of its own."""

from __future__ import annotations

import os
import re

from enginefarm.core.workerid import WORKER_ID_ENV, current_worker_id, worker_name

ID = re.compile(r"^[^@/]+@[^@/]+/[0-9a-f]{8}$")


def test_the_id_enginefarm_worker_set_is_the_id(monkeypatch):
    monkeypatch.setenv(WORKER_ID_ENV, "gpu-a@host1/0badcafe")
    assert current_worker_id() == "gpu-a@host1/0badcafe"


def test_without_one_a_process_has_an_id_of_the_same_form_and_a_forked_one_another(monkeypatch):
    monkeypatch.delenv(WORKER_ID_ENV, raising=False)
    mine = current_worker_id()
    assert ID.match(mine), mine
    assert worker_name(mine) == "worker" and current_worker_id() == mine
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a pool process
        os.write(write, current_worker_id().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 200).decode()
    assert ID.match(child) and child != mine
