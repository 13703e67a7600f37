"""The reservation ledger clears reservations and releases each in its safe direction."""

from __future__ import annotations

from marin_assets.cluster.ledger import ReservationLedger


def test_delta_sums_reservations_minus_releases_per_domain():
    led = ReservationLedger()
    led.reserve("a", "p", [0], [8], at=10)
    led.reserve("b", "p", [0, 1], [72, 72], at=11)
    led.release("c", "p", [1], [4], at=12)
    assert led.delta("p", 3) == [80, 68, 0]
    assert led.delta("other", 2) == [0, 0]


def test_reservation_kept_until_a_heartbeat_could_show_it():
    led = ReservationLedger()
    led.reserve("a", "p", [0], [8], at=10)
    led.on_heartbeat("p", as_of=5, running=frozenset())  # snapshot older than the placement
    assert led.delta("p", 1) == [8]
    led.on_heartbeat("p", as_of=10, running=frozenset())  # same instant: maybe not in it, keep
    assert led.delta("p", 1) == [8]
    led.on_heartbeat("p", as_of=10, running=frozenset({"a"}))  # the snapshot shows it: drop
    assert led.delta("p", 1) == [0]


def test_release_dropped_unless_the_snapshot_surely_still_shows_the_victim():
    led = ReservationLedger()
    led.release("v", "p", [0], [8], at=10)
    led.on_heartbeat("p", as_of=5, running=frozenset({"v"}))  # older snapshot, victim in it: keep
    assert led.delta("p", 1) == [-8]
    led.on_heartbeat("p", as_of=20, running=frozenset({"v"}))  # newer snapshot is authoritative
    assert led.delta("p", 1) == [0]
    led.release("w", "p", [0], [8], at=30)
    led.on_heartbeat("p", as_of=25, running=frozenset())  # victim already gone from it: drop
    assert led.delta("p", 1) == [0]
