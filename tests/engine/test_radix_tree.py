"""RadixTree against a brute-force model (a set of stored sequences), by hypothesis; and the routing policies."""

from hypothesis import given, settings
from hypothesis import strategies as st

from torchinferno.engine.radix_tree import RadixTree
from torchinferno.engine.route_policy import ReplicaState, make_policy

seqs = st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=12), min_size=1, max_size=12)


def _lcp(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _prefixes(stored) -> set:
    return {tuple(s[:k]) for s in stored for k in range(1, len(s) + 1)}


def _check_structure(t: RadixTree) -> None:
    stack = [t.root]
    total = 0
    while stack:
        n = stack.pop()
        total += len(n.edge)
        assert n is t.root or n.edge, "empty edge below the root"
        for k, c in n.children.items():
            assert c.edge[0] == k and c.parent is n
            assert c.last_used <= n.last_used or n is t.root
            stack.append(c)
    assert total == t.num_tokens


@settings(max_examples=150, deadline=None)
@given(seqs, st.lists(st.integers(0, 3), max_size=14))
def test_unbounded_tree_matches_brute_force(stored, query):
    t = RadixTree()
    for s in stored:
        t.insert(s)
        assert t.match(s) == len(s)
    _check_structure(t)
    assert t.num_tokens == len(_prefixes(stored))
    assert t.match(query) == max(_lcp(query, s) for s in stored)
    assert set(t.sequences()) <= {tuple(s) for s in stored}


@settings(max_examples=150, deadline=None)
@given(seqs, st.integers(0, 20), st.lists(st.integers(0, 3), max_size=14))
def test_bounded_tree_never_exceeds_its_bound_and_keeps_the_newest(stored, bound, query):
    t = RadixTree(max_tokens=bound)
    for s in stored:
        t.insert(s)
        assert t.num_tokens <= bound
        if len(s) <= bound:  # the newest path is the most recently used: evicted last
            assert t.match(s) == len(s)
        _check_structure(t)
    assert t.match(query) <= max(_lcp(query, s) for s in stored)  # never invents a prefix


@settings(max_examples=150, deadline=None)
@given(seqs, st.data())
def test_trim_drops_exactly_the_continuation(stored, data):
    t = RadixTree()
    for s in stored:
        t.insert(s)
    target = data.draw(st.sampled_from(stored))
    keep = data.draw(st.integers(0, len(target)))
    before = t.num_tokens
    dropped = t.trim(target, keep)
    _check_structure(t)
    assert t.num_tokens == before - dropped
    assert t.match(target) == min(keep, len(target))
    # what remains is exactly the stored prefixes that do not extend target[:keep + 1]
    cut = tuple(target[:keep + 1]) if keep < len(target) else None
    expected = {p for p in _prefixes(stored) if cut is None or p[:len(cut)] != cut}
    got = _prefixes([list(x) for x in t.sequences()])
    assert got == expected


def test_eviction_is_least_recently_used():
    t = RadixTree(max_tokens=8)
    t.insert([1, 1, 1, 1])
    t.insert([2, 2, 2, 2])
    t.match([1, 1, 1, 1], touch=True)  # 1s now newer than 2s
    t.insert([3, 3, 3, 3])
    assert t.match([1, 1, 1, 1]) == 4 and t.match([3, 3, 3, 3]) == 4 and t.match([2, 2, 2, 2]) == 0
    assert t.num_evicted_tokens == 4


def _states(*loads, dead=()):
    return [ReplicaState(load=x, alive=i not in dead) for i, x in enumerate(loads)]


def test_round_robin_skips_dead_replicas():
    p = make_policy("round-robin", 3)
    picks = [p.route([1], _states(0, 0, 0, dead=(1,))).replica for _ in range(4)]
    assert picks == [0, 2, 0, 2]


def test_least_loaded_picks_fewest_in_flight():
    p = make_policy("least-loaded", 3)
    assert p.route([1], _states(5, 2, 3)).replica == 1
    assert p.route([1], _states(1, 2, 0, dead=(2,))).replica == 0


def test_cache_aware_follows_the_prefix_until_unbalanced():
    p = make_policy("cache-aware", 2, min_match_tokens=4, balance_abs=4, balance_rel=1.5)
    sys_a, sys_b = list(range(100, 120)), list(range(200, 220))
    assert p.route(sys_a + [1], _states(0, 0)).replica == 0  # nothing cached: least loaded (index 0)
    assert p.route(sys_b + [1], _states(1, 0)).replica == 1
    r = p.route(sys_a + [2], _states(1, 1))
    assert (r.replica, r.reason, r.matched_tokens) == (0, "cache", 20)
    assert p.route(sys_b + [2], _states(2, 1)).replica == 1
    # replica 0 overloaded beyond both thresholds: the balance rule sends A's prefix to replica 1
    r = p.route(sys_a + [3], _states(9, 1))
    assert (r.replica, r.reason) == (1, "balance")
    assert p.stats.routed == 5 and 0 < p.stats.hit_rate < 1
    p.replica_died(0)
    assert p.route(sys_a + [4], _states(0, 5, dead=(0,))).replica == 1


def test_cache_aware_learns_generated_tokens():
    p = make_policy("cache-aware", 2, min_match_tokens=4)
    turn1 = list(range(10))
    i = p.route(turn1, _states(0, 0)).replica
    p.finished(i, turn1 + [50, 51, 52, 53])
    r = p.route(turn1 + [50, 51, 52, 53, 60], _states(3, 0))
    assert r.replica == i and r.matched_tokens == 14


def test_unknown_policy_is_one_line_error():
    import pytest

    from torchinferno.errors import ConfigError

    with pytest.raises(ConfigError, match="valid: round-robin, least-loaded, cache-aware"):
        make_policy("random", 2)
