"""The routing policies, the affinity key and the pool of peers, as plain logic: no sockets, a seeded
random source."""
import math
import random
from collections import Counter

import pytest

from jevany_client.fleet import Fleet, Peer
from jevany_client.routing import (
    AFFINITY_PREFIX_BYTES,
    BALANCE_FACTOR,
    REPORT_HALF_LIFE_S,
    Affinity,
    LeastLoaded,
    RoundRobin,
    affinity_key,
    check_routing,
)

NOW = 100.0


def peers(n: int) -> list[Peer]:
    return [Peer(f"tcp://10.0.0.{i}:5555", f"tcp://10.0.0.{i}:5555") for i in range(n)]


def loaded(peer: Peer, n: int) -> Peer:
    peer.pending.update(f"{peer.key}-{k}" for k in range(n))
    return peer


def test_a_growing_transcript_keeps_its_key_once_past_the_head_and_key_order_does_not_matter():
    transcript = "user: my parcel is late. " * 60                   # past the head already
    turn = {"transcript": transcript, "agent": "support"}
    later = {"agent": "support", "transcript": transcript + " agent: sorry to hear that." * 20}
    assert len(transcript) > AFFINITY_PREFIX_BYTES
    assert affinity_key(turn) == affinity_key(later)
    assert affinity_key(turn) != affinity_key({"transcript": "user: another session. " * 60})
    assert affinity_key("short") != affinity_key("short, and then more")    # shorter than the head: all of it


def test_a_huge_state_is_keyed_by_its_head_alone():
    big = {"log": ["x" * 100] * 100_000}
    assert affinity_key(big) == affinity_key({"log": ["x" * 100] * 11})     # the same first kilobyte


def test_affinity_spreads_keys_evenly_and_a_peer_leaving_moves_only_its_own():
    ring, four = Affinity(random.Random(1)), peers(4)
    keys = [affinity_key(f"session {i}") for i in range(4000)]
    first = {k: ring.choose(four, k, NOW) for k in keys}
    shares = Counter(peer.key for peer in first.values())
    assert all(abs(n / len(keys) - 0.25) < 0.05 for n in shares.values()), shares
    gone = four[2]
    after = {k: ring.choose([p for p in four if p is not gone], k, NOW) for k in keys}
    moved = [k for k in keys if after[k] is not first[k]]
    assert moved and all(first[k] is gone for k in moved)        # only the keys it held move


def test_affinity_spills_a_key_whose_peer_is_over_the_bound_and_no_peer_passes_it():
    ring, four = Affinity(random.Random(1)), peers(4)
    key = affinity_key("hot session")
    home = ring.choose(four, key, NOW)
    loaded(home, 10)                                             # the others hold nothing
    spill = ring.choose(four, key, NOW)
    assert spill is not home
    # Every request of the hot key in turn: loads stay within ceil(c * (total + 1) / n).
    for _ in range(40):
        total = sum(p.load(NOW) for p in four)
        bound = math.ceil(BALANCE_FACTOR * (total + 1) / len(four))
        chosen = ring.choose(four, key, NOW)
        assert chosen.load(NOW) + 1 <= bound
        loaded(chosen, int(chosen.load(NOW)) + 1)


def test_affinity_keeps_a_key_home_while_its_peer_is_within_the_bound():
    ring, four = Affinity(random.Random(1)), peers(4)
    key = affinity_key("session 7")
    home = ring.choose(four, key, NOW)
    for p in four:
        loaded(p, 4)                                            # even loads: home is under the bound
    assert ring.choose(four, key, NOW) is home


def test_least_loaded_never_picks_the_most_loaded_of_several():
    policy, four = LeastLoaded(random.Random(3)), peers(4)
    busy = four[1]
    busy.note_load({"queue": 30, "inflight": 2}, NOW)           # other clients' work, reported
    picks = Counter(policy.choose(four, None, NOW).key for _ in range(400))
    assert busy.key not in picks and len(picks) == 3


def test_a_report_fades_with_its_age_until_the_daemon_is_tried_again():
    policy, two = LeastLoaded(random.Random(3)), peers(2)
    two[0].note_load({"queue": 32, "inflight": 0}, NOW)
    loaded(two[1], 3)
    assert two[0].load(NOW + REPORT_HALF_LIFE_S) == pytest.approx(16)
    assert {policy.choose(two, None, NOW + REPORT_HALF_LIFE_S).key for _ in range(50)} == {two[1].key}
    much_later = NOW + 5 * REPORT_HALF_LIFE_S                   # 32 / 32 = 1 < 3: its turn again
    assert {policy.choose(two, None, much_later).key for _ in range(50)} == {two[0].key}


def test_a_report_counts_the_others_work_not_ours_and_odd_fields_are_ignored():
    peer = loaded(peers(1)[0], 3)
    peer.note_load({"queue": 5, "inflight": 4}, NOW)
    assert (peer.others, peer.load(NOW)) == (6, 9)               # 9 at the daemon, 3 of them ours
    for odd in (None, [], {"queue": "5", "inflight": 1}, {"queue": -1, "inflight": 0}, {"queue": 1}):
        peer.note_load(odd, NOW + 1)
        assert (peer.others, peer.reported_at) == (6, NOW)      # ignored, never an error
    peer.note_load({"queue": 1, "inflight": 2, "workers": 8}, NOW + 1)     # unknown fields: ignored
    assert peer.others == 0


def test_round_robin_takes_each_in_turn():
    policy, three = RoundRobin(random.Random(0)), peers(3)
    assert Counter(policy.choose(three, "k", NOW).key for _ in range(300)) == {p.key: 100 for p in three}


def test_routing_names_are_checked_and_default_by_the_number_of_daemons():
    assert check_routing(None, several=True) == "least_loaded"
    assert check_routing(None, several=False) == "round_robin"
    with pytest.raises(ValueError, match="least_loaded, affinity, round_robin"):
        check_routing("random", several=True)


def test_the_pool_drops_a_peer_that_drops_or_drains_and_takes_it_back_on_a_new_connection():
    endpoints = ["tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555"]
    fleet = Fleet(endpoints, None, clock=lambda: NOW)
    added, _ = fleet.refresh()
    one, two = added
    assert fleet.candidates() == [one, two]
    two.draining = True                       # it answered shutting_down
    assert fleet.candidates() == [one]
    one.dropped = True                        # every peer out: the draining one still takes requests,
    assert fleet.candidates() == [two]        # its shutting_down an answer the caller's retries act on
    one.connected()
    two.connected()                           # both reconnected (restarted)
    assert fleet.candidates() == [one, two]


def test_a_peer_discovery_no_longer_lists_takes_nothing_new_and_closes_once_it_holds_nothing():
    endpoints = ["tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555"]
    fleet = Fleet(endpoints, None, clock=lambda: NOW)
    one, two = fleet.refresh()[0]
    two.pending.add("r1")                     # a request of ours it still holds
    assert fleet.apply({one.endpoint}) == ([], [])
    assert two.retiring and fleet.candidates() == [one] and two.endpoint in fleet.peers
    two.pending.clear()                       # answered
    assert fleet.apply(None) == ([], [two]) and two.endpoint not in fleet.peers
