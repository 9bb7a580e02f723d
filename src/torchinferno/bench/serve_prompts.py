"""Random prompts of a target token length for online benchmarks.

Two ways, picked automatically:

* **token ids** (``/v1/completions`` against a server with ``POST /tokenize``): a long random-word
  text is tokenized once by the server; each prompt is a random window of exactly ``input_len``
  ids, sent as a token-id prompt, so the server sees exactly the requested length (vLLM's
  ``random`` dataset also draws token ids).
* **text** (chat, or a server without ``/tokenize``): random words, their count tuned with the
  server's tokenizer when it has one (chat templates add their own tokens on top), else estimated
  at ``WORDS_PER_TOKEN``.

The reported ``input_lens`` are the server's ``usage.prompt_tokens`` when it returns usage.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Prompt", "random_words", "WORDS"]

# Short common English words: ~1 token each in BPE vocabularies, a few bytes each for byte models.
WORDS = (
    "the of and to in is was for on that with as by at from his her they this have are not but "
    "had one all were when we there can an which their said if do will each about how up out them "
    "then she many some so these would other into has more two time could no make than first been "
    "its who now people my made over did down only way find use may water long little very after "
    "words called just where most know get through back much before go good new write our used me "
    "man too any day same right look think also around another came come work three word must "
    "because does part even place well such here take why things help put years different away "
    "again off went old number great tell men say small every found still between name should home "
    "big give air line set own under read last never us left end along while might next sound below "
    "saw something thought both few those always looked show large often together asked house world "
    "going want school important until form food keep children feet land side without boy once "
    "animals life enough took sometimes four head above kind began almost live page got earth need "
    "far hand high year mother light parts country father let night following picture being study "
    "second eyes soon times story boys since white days ever paper hard near sentence better best "
    "across during today others however sure means knew its try told young miles sun ways thing whole "
    "hear example heard several change answer room sea against top turned learn point city play "
    "toward five using himself usually"
).split()

WORDS_PER_TOKEN = 0.75  # rough English BPE ratio, used only when the server cannot tokenize


@dataclass
class Prompt:
    """One request's prompt: ``value`` is a string or a list of token ids."""

    value: str | list[int]
    expected_len: int  # tokens we aimed for (the server's usage count wins when reported)


def random_words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n)))


async def _tokenize(client, base_url: str, model: str | None, text: str) -> list[int] | None:
    """Token ids of ``text`` via ``POST /tokenize`` (vLLM and TorchInferno both have it), else None."""
    body = {"prompt": text, "add_special_tokens": False}
    if model:
        body["model"] = model
    try:
        r = await client.post(f"{base_url}/tokenize", json=body)
    except Exception:
        return None
    if r.status_code != 200:
        return None
    try:
        toks = r.json().get("tokens")
    except ValueError:
        return None
    return [int(t) for t in toks] if isinstance(toks, list) else None


async def _detokenize(client, base_url: str, model: str | None, ids: list[int]) -> str | None:
    body = {"tokens": ids}
    if model:
        body["model"] = model
    try:
        r = await client.post(f"{base_url}/detokenize", json=body)
        return r.json().get("prompt") if r.status_code == 200 else None
    except Exception:
        return None


def _distinct_starts(rng: random.Random, n_starts: int, num: int) -> list[int]:
    """``num`` window offsets in ``[0, n_starts)``, drawn one after another and distinct while there are enough
    (so the first ``k`` of ``num`` do not depend on ``num``)."""
    used: set[int] = set()
    out = []
    for _ in range(num):
        s = rng.randrange(0, n_starts)
        while s in used and len(used) < n_starts:
            s = rng.randrange(0, n_starts)
        used.add(s)
        out.append(s)
    return out


async def make_prompts(client, base_url: str, model: str | None, num: int, input_len: int, seed: int,
                       as_tokens: bool) -> tuple[list[Prompt], str]:
    """``num`` prompts of ~``input_len`` tokens; returns (prompts, how they were made)."""
    rng = random.Random(seed)
    # Enough words for every window to be long enough and to start at its own offset, whatever the tokenizer (a word
    # is at least one token): two windows from one offset share every block, so the second request's prefill would
    # be a prefix-cache hit that a random-prompt benchmark does not mean to measure (512 prompts of 128 tokens drawn
    # with replacement from the ~500 offsets of the old 512-word pool repeat an estimated third of them: a birthday
    # count, not measured)
    pool_words = max(4 * input_len, 256, num + input_len)
    pool_text = random_words(rng, pool_words)
    ids = await _tokenize(client, base_url, model, pool_text)
    if ids is not None and len(ids) >= input_len:
        starts = _distinct_starts(rng, len(ids) - input_len + 1, num)
        if as_tokens:
            return [Prompt(ids[s:s + input_len], input_len) for s in starts], "token-ids (server tokenizer)"
        # Text for chat: a window of ids, turned back into text by the server's own tokenizer.
        out = []
        for start in starts:
            text = await _detokenize(client, base_url, model, ids[start:start + input_len])
            if text is None:
                break
            out.append(Prompt(text, input_len))
        if len(out) == num:
            return out, "text (server tokenizer)"
    n_words = max(1, round(input_len * WORDS_PER_TOKEN))
    return [Prompt(random_words(rng, n_words), input_len) for _ in range(num)], "random words (estimated length)"
