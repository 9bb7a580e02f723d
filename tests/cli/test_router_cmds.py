"""bench-router and research: policy tables on a scaled-down shared-system-prompt chat trace (live tiny model and
simulator); a recorded token trace round-trips; bad input is one line."""

import json

from torchinferno.cli.main import main

SMALL = ["--system-prompts", "4", "--users", "3", "--turns", "2", "--system-len", "128", "--num-blocks", "40",
         "--rate", "16"]


def _last_json(out: str) -> dict:
    return json.loads(out)  # --json: the whole of stdout is one JSON document (the header goes to stderr)


def test_bench_router_cache_aware_beats_round_robin(capsys):
    assert main(["bench-router", *SMALL, "--sim", "--json"]) == 0
    doc = _last_json(capsys.readouterr().out)
    rows = {r["name"]: r["metrics"] for r in doc["results"]}
    assert set(rows) == {f"{m}:route/{p}" for m in ("live", "sim")
                         for p in ("round-robin", "least-loaded", "cache-aware")}
    for mode in ("live", "sim"):
        ca, rr = rows[f"{mode}:route/cache-aware"], rows[f"{mode}:route/round-robin"]
        assert ca["prefix_hit_rate"] > rr["prefix_hit_rate"] > 0
        assert rr["router_hit_rate"] == 0 < ca["router_hit_rate"]
        assert sum(int(x) for x in ca["per_replica"].split("/")) == 4 * 3 * 2
    assert set(doc["verdicts"]) == {"live", "sim"}


def test_research_on_synthetic_and_recorded_traces(tmp_path, capsys):
    assert main(["research", "--synthetic", "shared-system-prompt", *SMALL, "--modes", "sim", "--json"]) == 0
    rows = {r["name"]: r for r in _last_json(capsys.readouterr().out)["results"]}
    assert set(rows) == {"sim:route/round-robin", "sim:route/least-loaded", "sim:route/cache-aware", "sim:sched/fcfs",
                         "sim:sched/sjf", "sim:sched/priority", "sim:cache/lru", "sim:cache/fifo",
                         "sim:cache/off"}
    assert all(r["error"] is None for r in rows.values())
    assert rows["sim:cache/off"]["metrics"]["prefix_hit_rate"] == 0 < rows["sim:cache/lru"]["metrics"]["prefix_hit_rate"]

    from torchinferno.sim.chat_trace import (
        ChatTraceSpec,
        save_token_trace,
        shared_system_prompt,
    )

    path = save_token_trace(shared_system_prompt(ChatTraceSpec(2, 2, 2, 64, vocab_size=259)), tmp_path / "t.jsonl")
    assert main(["research", "--trace", str(path), "--groups", "route", "--modes", "live", "--num-blocks", "40"]) == 0
    out = capsys.readouterr().out
    assert "live:route/cache-aware" in out and "8 requests" in out


def test_bad_trace_is_one_line(tmp_path, capsys):
    assert main(["research", "--trace", str(tmp_path / "missing.jsonl"), "--modes", "sim"]) == 1
    assert capsys.readouterr().err.strip() == f"error: trace file not found: {tmp_path / 'missing.jsonl'}"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"arrival_s": 0, "prompt_token_ids": [1, 2], "output_len": 0}\n')
    assert main(["research", "--trace", str(bad), "--modes", "sim"]) == 1
    assert "output_len >= 1" in capsys.readouterr().err


def test_research_smoke_policy_experiments():
    from torchinferno.workbench.policy_research import policy_smoke_harness

    results = {r.name: r for r in policy_smoke_harness(live=False).run()}
    assert len(results) == 9 and all(r.error is None for r in results.values())
    m = {k: r.metrics for k, r in results.items()}
    assert m["sim:route/cache-aware"]["prefix_hit_rate"] > m["sim:route/round-robin"]["prefix_hit_rate"]
    assert m["sim:cache/off"]["prefix_hit_rate"] == 0
    assert m["sim:cache/off"]["ttft_p50_ms"] > m["sim:cache/lru"]["ttft_p50_ms"]
