"""Multi-turn chat workloads with shared system prompts, and token-level trace files (routing / cache research).

``shared_system_prompt``: ``system_prompts`` system prompts, ``users`` conversations on each, ``turns`` turns per
conversation. Turn k's prompt is the conversation so far: ``system + user_1 + reply_1 + ... + user_k``; it generates
``len(reply_k)`` tokens (EOS ignored). Replies are fixed in the trace (the next turn quotes the trace's reply, not what
the model generated): every policy sees the same prompts, and what a replica can reuse is the system prompt and the
earlier turns' prompts (its own generated blocks differ from the trace's reply). Conversations start as a Poisson
process of ``rate`` per second in a random order of system prompts; a conversation's turns are ``think_s`` apart
(exponential, mean ``think_s``). Deterministic for ``seed``.

``load_token_trace``: JSONL, one request per line: ``{"arrival_s", "prompt_token_ids", "output_len"}`` (optional
``"priority"``, lower first); a file without ``prompt_token_ids`` falls back to ``sim.traffic.load_trace`` (lengths
only: random tokens, so no shared prefixes). ``save_token_trace`` writes the same format.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from torchinferno.errors import ConfigError
from torchinferno.sim.traffic import LengthDist, SimRequest, arrival_times, load_trace

__all__ = ["SYNTHETIC", "ChatTraceSpec", "load_token_trace", "save_token_trace", "shared_system_prompt", "synthetic"]

SYNTHETIC = ("shared-system-prompt",)


@dataclass
class ChatTraceSpec:
    system_prompts: int = 8
    users: int = 64  # conversations per system prompt
    turns: int = 3
    system_len: int = 256
    user_len: str = "uniform:16:48"
    reply_len: str = "uniform:16:48"
    rate: float = 8.0  # new conversations per second
    think_s: float = 2.0  # mean gap between the end of a turn's arrival and the next turn's arrival
    vocab_size: int = 32000
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("system_prompts", "users", "turns", "system_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"chat trace {name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not self.rate > 0 or self.think_s < 0:
            raise ConfigError(f"chat trace needs rate > 0 and think_s >= 0 (got {self.rate}, {self.think_s})")


def shared_system_prompt(spec: ChatTraceSpec) -> list[SimRequest]:
    """The workload of ``spec`` (module docstring), sorted by arrival. ``prefix_group`` = system prompt index."""
    rng = random.Random(spec.seed)
    ulen, rlen = LengthDist.parse(spec.user_len), LengthDist.parse(spec.reply_len)
    tok = lambda n: [rng.randrange(spec.vocab_size) for _ in range(n)]
    systems = [tok(spec.system_len) for _ in range(spec.system_prompts)]
    convs = [g for g in range(spec.system_prompts) for _ in range(spec.users)]
    rng.shuffle(convs)
    starts = arrival_times(len(convs), spec.rate, 1.0, spec.seed)
    out: list[SimRequest] = []
    for c, (g, t) in enumerate(zip(convs, starts)):
        history = list(systems[g])
        for k in range(spec.turns):
            history += tok(ulen.sample(rng))
            reply = tok(rlen.sample(rng))
            out.append(SimRequest(f"c{c}-t{k}", t, list(history), len(reply), g))
            history += reply
            t += rng.expovariate(1.0 / spec.think_s) if spec.think_s > 0 else 0.0
    out.sort(key=lambda r: (r.arrival_s, r.request_id))
    return out


def synthetic(name: str, **overrides) -> list[SimRequest]:
    if name != "shared-system-prompt":
        raise ConfigError(f"unknown synthetic trace {name!r} (valid: {', '.join(SYNTHETIC)})")
    return shared_system_prompt(ChatTraceSpec(**overrides))


def load_token_trace(path: str | Path, vocab_size: int = 32000, seed: int = 0) -> list[SimRequest]:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"trace file not found: {p}")
    lines = [ln for ln in p.read_text().splitlines() if ln.strip()]
    try:
        first = json.loads(lines[0]) if lines else None
    except json.JSONDecodeError:
        first = None
    if not isinstance(first, dict) or "prompt_token_ids" not in first:
        return load_trace(p, seed=seed, vocab_size=vocab_size)
    out = []
    for n, line in enumerate(lines, 1):
        try:
            d = json.loads(line)
            ids = [int(x) for x in d["prompt_token_ids"]]
            r = SimRequest(str(d.get("request_id", f"req-{n - 1}")), float(d.get("arrival_s", 0.0)), ids,
                           int(d["output_len"]), int(d.get("prefix_group", -1)))
        except (json.JSONDecodeError, TypeError, KeyError, ValueError):
            raise ConfigError(f"{p}:{n}: expected a JSON object with arrival_s, prompt_token_ids and output_len") from None
        if not ids or r.output_len < 1 or not math.isfinite(r.arrival_s):
            raise ConfigError(f"{p}:{n}: prompt_token_ids must be non-empty, output_len >= 1, arrival_s finite")
        if max(ids) >= vocab_size or min(ids) < 0:
            raise ConfigError(f"{p}:{n}: prompt_token_ids must be in [0, {vocab_size}) for this model")
        out.append(r)
    out.sort(key=lambda r: r.arrival_s)
    return out


def save_token_trace(requests: list[SimRequest], path: str | Path) -> Path:
    p = Path(path)
    with p.open("w") as f:
        for r in requests:
            f.write(json.dumps({"request_id": r.request_id, "arrival_s": r.arrival_s, "prompt_token_ids":
                                r.prompt_token_ids, "output_len": r.output_len, "prefix_group": r.prefix_group}) + "\n")
    return p
