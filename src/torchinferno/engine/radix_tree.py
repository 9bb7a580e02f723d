"""An approximate radix tree of the token prefixes one replica has cached (the router's view of it).

The router never asks a replica what it holds: it remembers what it sent there (``insert`` on admit, and the whole
sequence again when it finishes, since a replica caches generated tokens too) and forgets by an LRU bound
(``max_tokens``, e.g. the replica's KV pool size in tokens) or when told (``trim``: the replica reported that only
the first ``keep`` tokens of a sequence are still cached). So it is *approximate*: it may believe in a prefix
that was evicted, or miss one a different path put there; a wrong guess only costs a cache miss.

Structure: a compressed trie. Each node holds the edge (a run of tokens) leading to it, its children keyed by
their edge's first token, and a logical ``last_used`` clock value. Invariants (checked by tests/engine
/test_radix_tree.py's hypothesis properties):

* ``num_tokens`` is the number of distinct non-empty prefixes stored (the sum of edge lengths);
* ``match(seq)`` is the longest common prefix of ``seq`` with any stored sequence;
* every non-root node has a non-empty edge; children of one node start with different tokens;
* a node's ``last_used`` is >= each of its children's (a path is touched whole), so evicting the least recently
  used *leaf* first never cuts a more recently used path;
* after any call, ``num_tokens <= max_tokens`` (when bounded).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

__all__ = ["RadixTree"]


class _Node:
    __slots__ = ("children", "edge", "last_used", "parent")

    def __init__(self, edge: tuple[int, ...], parent: _Node | None, last_used: int):
        self.edge = edge
        self.children: dict[int, _Node] = {}
        self.parent = parent
        self.last_used = last_used


def _common(a: Sequence[int], a0: int, b: tuple[int, ...]) -> int:
    """Length of the common prefix of ``a[a0:]`` and ``b``."""
    n = min(len(a) - a0, len(b))
    i = 0
    while i < n and a[a0 + i] == b[i]:
        i += 1
    return i


class RadixTree:
    """Token prefixes of one replica (module docstring). ``max_tokens=None``: unbounded."""

    def __init__(self, max_tokens: int | None = None):
        if max_tokens is not None and max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        self.max_tokens = max_tokens
        self.root = _Node((), None, 0)
        self.num_tokens = 0
        self.num_evicted_tokens = 0
        self._clock = itertools.count(1)

    # ------------------------------------------------------------------ queries
    def match(self, tokens: Sequence[int], touch: bool = False) -> int:
        """Length of the longest stored prefix of ``tokens``; ``touch`` marks the matched path as just used."""
        node, i = self.root, 0
        now = next(self._clock) if touch else 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            k = _common(tokens, i, child.edge)
            i += k
            if touch:
                child.last_used = now
            if k < len(child.edge):
                break
            node = child
        if touch:
            self._touch_up(node, now)
        return i

    def sequences(self) -> list[tuple[int, ...]]:
        """Every stored root-to-leaf sequence (for tests and debugging)."""
        out: list[tuple[int, ...]] = []
        stack = [(self.root, ())]
        while stack:
            node, pre = stack.pop()
            seq = pre + node.edge
            if not node.children and node is not self.root:
                out.append(seq)
            stack.extend((c, seq) for c in node.children.values())
        return out

    # ------------------------------------------------------------------ changes
    def insert(self, tokens: Sequence[int]) -> int:
        """Store ``tokens`` (touching the whole path); returns how many tokens were new. Evicts to the bound."""
        now = next(self._clock)
        node, i, added = self.root, 0, 0
        tokens = tuple(int(t) for t in tokens)
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                leaf = _Node(tokens[i:], node, now)
                node.children[tokens[i]] = leaf
                added += len(leaf.edge)
                node = leaf
                break
            k = _common(tokens, i, child.edge)
            if k < len(child.edge):  # split the edge at k: node -> mid -> child
                mid = _Node(child.edge[:k], node, child.last_used)
                node.children[tokens[i]] = mid
                child.edge = child.edge[k:]
                child.parent = mid
                mid.children[child.edge[0]] = child
                child = mid
            child.last_used = now
            node = child
            i += k
        self._touch_up(node, now)
        self.num_tokens += added
        if self.max_tokens is not None and self.num_tokens > self.max_tokens:
            self.evict(self.num_tokens - self.max_tokens)
        return added

    def evict(self, num_tokens: int) -> int:
        """Drop least-recently-used leaves until ``num_tokens`` tokens are gone (or the tree is empty)."""
        heap = [(n.last_used, id(n), n) for n in self._leaves()]
        heapq.heapify(heap)
        gone = 0
        while gone < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.edge[0]]
            gone += len(leaf.edge)
            if parent is not self.root and not parent.children:
                heapq.heappush(heap, (parent.last_used, id(parent), parent))
        self.num_tokens -= gone
        self.num_evicted_tokens += gone
        return gone

    def trim(self, tokens: Sequence[int], keep: int) -> int:
        """The replica holds only the first ``keep`` tokens of ``tokens`` now: drop what is stored beyond position
        ``keep`` on that path (the continuation starting with ``tokens[keep]``). Returns the tokens dropped."""
        if keep < 0 or keep >= len(tokens):
            return 0
        node, i = self.root, 0
        while i < keep:
            child = node.children.get(tokens[i])
            if child is None:
                return 0
            k = _common(tokens, i, child.edge)
            if i + len(child.edge) <= keep:
                if k < len(child.edge):
                    return 0  # the stored path leaves ``tokens`` before ``keep``
                node, i = child, i + k
                continue
            cut = keep - i  # inside this edge
            if k <= cut:
                return 0  # diverges at or before ``keep``: nothing of this continuation is stored
            dropped = self._subtree_tokens(child) - cut
            child.edge, child.children = child.edge[:cut], {}
            self.num_tokens -= dropped
            return dropped
        child = node.children.get(tokens[keep])
        if child is None:
            return 0
        del node.children[tokens[keep]]
        dropped = self._subtree_tokens(child)
        self.num_tokens -= dropped
        return dropped

    def clear(self) -> None:
        self.root.children = {}
        self.num_tokens = 0

    # ------------------------------------------------------------------ helpers
    def _touch_up(self, node: _Node, now: int) -> None:
        while node is not None and node.last_used < now:
            node.last_used = now
            node = node.parent

    def _leaves(self):
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            if n.children:
                stack.extend(n.children.values())
            else:
                yield n

    @staticmethod
    def _subtree_tokens(node: _Node) -> int:
        total, stack = 0, [node]
        while stack:
            n = stack.pop()
            total += len(n.edge)
            stack.extend(n.children.values())
        return total
