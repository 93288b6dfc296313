"""An API process's resolve caches hold what is live, within stated bounds, however long the farm runs.

A farm whose model gets a new version every few seconds, asked the same questions, makes a new ETag per question
each time: the caches must keep one body per question, not one per version ever seen, and rows only for the
questions of their stated time.
"""

from __future__ import annotations

import time
from collections import namedtuple

from api.services.answers import Answers, Known, etag_of
from api.services.versions import Versions

Row = namedtuple("Row", "id generation")


def test_a_question_keeps_one_body_however_often_its_versions_change():
    answers = Answers(entries=4096, max_bytes=1 << 20)
    questions = [(bytes([q]) * 16, "default") for q in range(5)]
    for version in range(300):  # a new version every 30 s for 2.5 hours
        models = [Row(version + 1, 0)]
        for q in questions:
            tag = etag_of(q[0], q[1], models)
            answers.put(tag, b"x" * 2000, "exact", q)
    assert len(answers) == len(questions), "bodies under superseded tags are kept"
    assert answers.bytes == 2000 * len(questions)
    # the current answers are the ones kept
    for q in questions:
        assert answers.get(etag_of(q[0], q[1], [Row(300, 0)])) is not None


def test_bodies_are_bounded_by_their_bytes_as_well_as_their_number():
    answers = Answers(entries=4096, max_bytes=100_000)
    for q in range(200):
        answers.put(f'"{q}"', b"y" * 3000, "exact", (bytes([q]) * 16, None))
    assert answers.bytes <= 100_000
    assert len(answers) == 100_000 // 3000
    assert answers.get('"199"') is not None and answers.get('"0"') is None  # least recently used out
    answers.put('"big"', b"z" * 200_000, "exact", (b"b" * 16, None))  # over the whole bound: not kept at all
    assert answers.get('"big"') is None and answers.bytes <= 100_000


def test_the_same_tag_put_twice_counts_its_bytes_once():
    answers = Answers(entries=8, max_bytes=1 << 20)
    q = (b"q" * 16, None)
    answers.put('"a"', b"1" * 500, "exact", q)
    answers.put('"a"', b"1" * 500, "exact", q)
    assert answers.bytes == 500 and len(answers) == 1


def test_version_rows_past_their_time_are_dropped_when_others_are_kept():
    versions = Versions(0.05, entries=4096)
    versions.changes.current = lambda: (1,)  # a feed that stands still
    for n in range(50):
        versions.put((f"model-{n}", None, None), [], versions.stamp())
    time.sleep(0.1)
    versions.put(("model-new", None, None), [], versions.stamp())
    assert list(versions._kept) == [("model-new", None, None)]


def test_known_questions_stay_within_their_bound():
    answers = Answers(entries=16)
    for n in range(100):
        answers.remember(f"model=m&n={n}".encode(), None, Known("m", None, bytes(16)))
    assert len(answers._queries) == 16
