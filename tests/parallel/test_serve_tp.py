"""``serve --tensor-parallel-size 2``: the engine core drives two gloo worker ranks; answers equal TP=1."""

import time

import httpx
import psutil

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.config import EngineConfig
from torchinferno.engine.llm_engine import LLMEngine
from torchinferno.server.live import LiveServer
from torchinferno.testing import tiny_model, wide_byte_tokenizer


def test_serve_tp2_answers_like_tp1():
    tok = wide_byte_tokenizer(259)
    ref = LLMEngine(tiny_model("llama3"), tok, EngineConfig(max_model_len=64))
    ref.add_request("r", tok.encode("hello"), SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    want = ref.run_to_completion()["r"].text
    s = LiveServer(["--model-kind", "llama3", "--dtype", "float32", "--max-model-len", "64", "--tensor-parallel-size", "2"],
                   start_timeout=180)
    try:
        assert "tensor-parallel 2 ranks (gloo)" in s.engine.describe()
        body = {"prompt": "hello", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
        r = httpx.post(s.base + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == want
        # a worker killed: the request fails (no hang), then the server answers 503 (the core has died)
        workers = psutil.Process(s.engine.core.proc.pid).children()
        assert len(workers) == 2
        workers[1].kill()
        r = httpx.post(s.base + "/v1/completions", json=body, timeout=60)
        assert r.status_code >= 500
        proc = s.engine.core.proc
        proc.join(30)
        # join() returns when the child's end of its sentinel pipe closes, which the kernel does a moment before the
        # process becomes reapable: poll until it is, instead of reading is_alive() once (flaky under load)
        deadline = time.monotonic() + 10
        while proc.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not proc.is_alive() and proc.exitcode != 0
        assert httpx.get(s.base + "/health", timeout=10).status_code == 503
        psutil.wait_procs(workers, timeout=30)
        assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
    finally:
        s.stop()
