"""The dashboard's sign-in limit per client address (``AddressLimiter``, api/ui/session.py), without a farm: its
table stays at its bound and an attempt's cost flat however many addresses come, an IPv6 client is its /64, and
once the table is full, new addresses share one budget a minute, so rotating addresses buys neither unlimited
attempts nor a forgotten count. The limit's 429 over HTTP: tests/e2e/api/test_admission.py."""

from __future__ import annotations

import gc
import statistics
import time

import pytest

from api.ui.session import AddressLimiter
from enginefarm.core.errors import SignInsTooFast

BATCH = 10_000
CHUNK = 500
TOTAL = 100_000
# A batch that spends this many times the first one's CPU is growth: the test stops there rather than wait out a
# table rebuilt on every attempt (the limiter before this bound took about 4 ms an attempt at 10,000-20,000 live
# addresses, against 3-5 µs: the second batch alone would have taken most of a minute).
GIVE_UP = 20
# The app's limiter: the clients it tracks, and the new ones a minute it admits past them.
MAX_KEYS, OVERFLOW_PER_MINUTE = 10_000, 600


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ipv4(i: int) -> str:
    return f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"


def admitted(limiter: AddressLimiter, address: str, per_minute: int) -> bool:
    try:
        limiter.attempt(address, per_minute)
    except SignInsTooFast:
        return False
    return True


@pytest.mark.parametrize(
    ("overflow", "refused", "ratio"),
    [
        # As the app makes it: past the table's 10,000 and the 600 a minute admitted beyond it, every new address is
        # refused. A refusal raises, about twice an insert's CPU: flat, but not the first batch's cost.
        (None, TOTAL - MAX_KEYS - OVERFLOW_PER_MINUTE, 5),
        # Every new address admitted, each evicting the oldest entry.
        (TOTAL, 0, 3),
    ],
    ids=["default", "evicting"],
)
def test_100000_addresses_keep_the_table_at_its_bound_and_each_attempt_as_cheap_as_the_first(overflow, refused, ratio):
    limiter = AddressLimiter() if overflow is None else AddressLimiter(overflow_per_minute=overflow)
    refusals = 0
    per_attempt: list[float] = []  # median CPU µs an attempt, in chunks of 500, of each batch of 10,000
    first_batch_cpu = None
    gc.disable()  # a collection's pause goes with the test process's heap, not with the limiter
    try:
        for batch in range(TOTAL // BATCH):
            chunks: list[float] = []
            for chunk in range(BATCH // CHUNK):
                begin = batch * BATCH + chunk * CHUNK
                start = time.thread_time()
                for i in range(begin, begin + CHUNK):
                    try:
                        limiter.attempt(ipv4(i), 30)
                    except SignInsTooFast:
                        refusals += 1
                chunks.append(time.thread_time() - start)
                if first_batch_cpu is not None and sum(chunks) > GIVE_UP * first_batch_cpu:
                    pytest.fail(
                        f"attempts {batch * BATCH:,} to {begin + CHUNK:,} took {sum(chunks):.2f} s of CPU, over "
                        f"{GIVE_UP} times the first 10,000's {first_batch_cpu:.3f} s, with "
                        f"{len(limiter._seen):,} addresses in the table: an attempt's cost grows with them"
                    )
            if first_batch_cpu is None:
                first_batch_cpu = sum(chunks)
            per_attempt.append(statistics.median(chunks) / CHUNK * 1e6)
            assert len(limiter._seen) <= MAX_KEYS
    finally:
        gc.enable()
    assert len(limiter._seen) == MAX_KEYS
    assert max(len(times) for times in limiter._seen.values()) == 1
    assert refusals == refused
    shown = ", ".join(f"{us:.1f}" for us in per_attempt)
    assert per_attempt[-1] <= ratio * per_attempt[0], f"µs an attempt, each batch of 10,000: {shown}"


def test_ipv6_addresses_in_one_64_share_a_count_and_ipv4_addresses_do_not():
    clock = Clock()
    limiter = AddressLimiter(clock=clock)
    for address in ("2001:db8:1:2::1", "2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:DB8:1:2:abcd:0:0:9"):
        limiter.attempt(address, 3)
    with pytest.raises(SignInsTooFast) as refused:
        limiter.attempt("2001:db8:1:2:5:6:7:8", 3)
    assert "3 sign-ins from 2001:db8:1:2::/64 in the last minute" in refused.value.message
    assert "ENGINEFARM_SIGNIN_PER_MINUTE_PER_ADDRESS" in refused.value.message
    assert refused.value.retry_after == 60
    assert admitted(limiter, "2001:db8:1:3::1", 3)  # the next /64 is another client

    # One machine rotating through its /64's 2**64 addresses is one entry with one count.
    rotated = [admitted(limiter, f"2001:db8:aaaa:bbbb:{i:x}:{i * 7 % 65536:x}:1:{i % 9}", 3) for i in range(5000)]
    assert rotated.count(True) == 3
    assert len(limiter._seen) == 3

    # IPv4 stays per address; an IPv4-mapped IPv6 address counts as its IPv4 one; a zone is not part of the key.
    for _ in range(3):
        limiter.attempt("192.0.2.1", 3)
    assert not admitted(limiter, "::ffff:192.0.2.1", 3)
    assert admitted(limiter, "192.0.2.2", 3)
    assert AddressLimiter.key("fe80::1%eth0") == AddressLimiter.key("fe80::2%eth1") == "fe80::/64"
    assert AddressLimiter.key("unknown") == "unknown"

    clock.now += 60.001  # a minute later the /64 may try again
    assert admitted(limiter, "2001:db8:1:2::77", 3)


def test_past_a_full_table_new_addresses_share_one_budget_and_tracked_ones_keep_their_own():
    clock = Clock()
    limiter = AddressLimiter(max_keys=100, overflow_per_minute=10, clock=clock)
    per_minute = 5
    # A victim spends its count; then 99 other addresses fill the table.
    for _ in range(per_minute):
        limiter.attempt("198.51.100.7", per_minute)
    assert not admitted(limiter, "198.51.100.7", per_minute)
    clock.now += 1
    for i in range(99):
        limiter.attempt(ipv4(i), per_minute)
    assert len(limiter._seen) == 100

    # Someone rotates through 1,000 new addresses: 10 get in, each evicting the oldest entry (the victim's first),
    # the rest get a 429 that names the budget, and the table stays at 100.
    clock.now += 1
    rotated = [admitted(limiter, ipv4(10_000 + i), per_minute) for i in range(1000)]
    assert rotated.count(True) == 10
    assert len(limiter._seen) == 100
    assert "198.51.100.7" not in limiter._seen
    with pytest.raises(SignInsTooFast) as refused:
        limiter.attempt(ipv4(20_000), per_minute)
    assert "over 100 client addresses tried to sign in within the last minute" in refused.value.message
    assert refused.value.retry_after == 60

    # The victim's evicted count is not a fresh start: as an address the table does not hold, it needs the budget.
    clock.now += 28
    with pytest.raises(SignInsTooFast) as again:
        limiter.attempt("198.51.100.7", per_minute)
    assert again.value.retry_after == 32  # when the first of the 10 leaves the minute
    # An address still in the table is not charged to the spent budget: it has its own 4 attempts left.
    assert [admitted(limiter, ipv4(98), per_minute) for _ in range(5)] == [True] * 4 + [False]

    # Once the oldest entries have been quiet for a minute, new addresses take their room without the budget
    # (still spent: its 10 were at +2 s).
    clock.now = 1000.0 + 1 + 60.5
    assert admitted(limiter, ipv4(30_000), per_minute)
    assert len(limiter._seen) <= 100


def test_rotating_addresses_buys_a_bounded_number_of_attempts():
    """However many addresses try within a minute, at most (table + budget) of them get their per-minute count."""
    clock = Clock()
    limiter = AddressLimiter(max_keys=100, overflow_per_minute=10, clock=clock)
    per_minute = 5
    successes = 0
    for i in range(2000):  # 2,000 addresses, each trying until refused, within one minute
        clock.now = 1000.0 + i * 0.02
        successes += sum(admitted(limiter, ipv4(i), per_minute) for _ in range(per_minute + 1))
    assert successes == (100 + 10) * per_minute
    assert len(limiter._seen) == 100
