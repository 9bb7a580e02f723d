"""StopChecker: stop strings on streamed text, including stop strings split across deltas."""

from __future__ import annotations

import random

import pytest

from torchinferno.text import StopChecker


def run(stops, deltas):
    checker = StopChecker(stops)
    out, hit = [], False
    for d in deltas:
        text, hit = checker.feed(d)
        out.append(text)
        if hit:
            break
    out.append(checker.flush())
    return "".join(out), hit, out


def reference(stops, text):
    """Cut before the occurrence that completes first (earliest end, then earliest start)."""
    best = None
    for s in stops:
        i = text.find(s)
        if i != -1 and (best is None or (i + len(s), i) < best):
            best = (i + len(s), i)
    return (text, False) if best is None else (text[: best[1]], True)


def test_no_stop_strings_passes_through():
    assert run([], ["ab", "c"]) == ("abc", False, ["ab", "c", ""])


def test_stop_split_across_deltas():
    text, hit, parts = run(["</answer>"], ["The answer is 42</an", "swer> and more"])
    assert (text, hit) == ("The answer is 42", True)
    # the partial "</an" was held back, not emitted with the first delta
    assert parts[0] == "The answer is 42"


def test_stop_split_into_single_chars():
    text, hit, _ = run(["STOP"], list("go go goSTOPnope"))
    assert (text, hit) == ("go go go", True)


def test_false_start_is_released():
    checker = StopChecker(["abc"])
    assert checker.feed("xxab") == ("xx", False)
    assert checker.feed("d") == ("abd", False)
    assert checker.feed("ab") == ("", False)
    assert checker.flush() == "ab"


def test_nothing_after_stop():
    checker = StopChecker(["\n\n"])
    assert checker.feed("line one\n") == ("line one", False)
    assert checker.feed("\nline two") == ("", True)
    assert checker.feed("more") == ("", True)
    assert checker.flush() == ""
    assert checker.matched == "\n\n"


def test_first_completed_stop_wins():
    # "c" completes before "abcd" could, so the cut is before "c".
    assert run(["abcd", "c"], ["ab", "cd"])[:2] == ("ab", True)
    # same end position: the longer (earlier-starting) string wins
    assert run(["bc", "abc"], ["xabcz"])[:2] == ("x", True)


def test_stop_at_very_start_and_in_single_delta():
    assert run(["<|end|>"], ["<|end|>hello"])[:2] == ("", True)
    assert run(["END", "STOP"], ["a STOP b END"])[:2] == ("a ", True)


def test_holdback_is_bounded():
    checker = StopChecker(["abcdef"])
    text, hit = checker.feed("x" * 100 + "abcde")
    assert (text, hit) == ("x" * 100, False)
    text, hit = checker.feed("abcde")  # previous tail is not a prefix any more, new one is
    assert (text, hit) == ("abcde", False)


@pytest.mark.parametrize("seed", range(5))
def test_random_splits_match_reference(seed):
    rng = random.Random(seed)
    alphabet = "ab \n<>/é世"
    for _ in range(200):
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 6))))
        deltas = [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)])]
        got, hit, _ = run(stops, deltas)
        assert (got, hit) == reference(stops, text), (stops, deltas)
