"""``bench-serve``: an online serving benchmark client, result-compatible with ``vllm bench serve``.

Requests arrive as a Poisson process (``burstiness == 1``) or with gamma-distributed gaps (shape
``burstiness``, mean ``1 / request_rate``), or all at t=0 when the rate is ``inf``; a semaphore
caps in-flight requests at ``max_concurrency``. Each request streams (SSE) and the client
records, per request:

* TTFT: send -> first chunk carrying generated text;
* ITLs: gaps between successive text-carrying chunks;
* e2e latency: send -> last chunk carrying choices (vLLM's ``most_recent_timestamp``);
* output length: the server's ``usage.completion_tokens`` (``stream_options.include_usage``),
  else the number of text chunks.

Aggregates follow vLLM's ``calculate_metrics``: TPOT of a request is
``(e2e - TTFT) / (output_len - 1)`` for ``output_len > 1``; throughputs divide by the wall time
of the whole run; mean/median/std/percentiles use numpy on successful requests only.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass, field

from torchinferno.bench.serve_prompts import Prompt, make_prompts
from torchinferno.bench.serve_result import compute_result, format_serve_result, result_path
from torchinferno.bench.sse_stream import BadStatus, as_streamer, open_streamer, resolve_http_client
from torchinferno.errors import ConfigError

__all__ = ["ServeBenchConfig", "RequestResult", "run_serve_bench", "compute_result", "result_path",
           "check_server", "ServerUnreachable", "format_serve_result"]

ENDPOINTS = ("/v1/completions", "/v1/chat/completions")


class ServerUnreachable(ConfigError):
    """The base URL does not answer (nothing listening, wrong host, TLS mismatch, timeout)."""


@dataclass
class ServeBenchConfig:
    base_url: str
    num_prompts: int = 100
    input_len: int = 128
    output_len: int = 128
    model: str | None = None
    endpoint: str = "/v1/completions"
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0
    ignore_eos: bool = False
    temperature: float | None = 0.0
    num_warmups: int = 0
    percentiles: list[float] = field(default_factory=lambda: [50.0, 90.0, 99.0])
    api_key: str | None = None
    label: str | None = None
    disable_tqdm: bool = False
    request_timeout_s: float = 600.0
    prompt_format: str = "auto"  # auto | tokens | text
    same_prompt: bool = False  # every request sends the first prompt (prefix-cache / self-consistency runs)
    http_client: str = "auto"  # the streams' client library: auto (aiohttp if installed) | aiohttp | httpx

    def validate(self) -> "ServeBenchConfig":
        if self.endpoint not in ENDPOINTS:
            raise ConfigError(f"unknown endpoint {self.endpoint!r} (valid: {', '.join(ENDPOINTS)})")
        if self.num_prompts < 1:
            raise ConfigError(f"--num-prompts must be >= 1, got {self.num_prompts}")
        if self.input_len < 1 or self.output_len < 1:
            raise ConfigError(f"--input-len and --output-len must be >= 1, got {self.input_len}, {self.output_len}")
        if not (self.request_rate > 0):
            raise ConfigError(f"--request-rate must be > 0 or inf, got {self.request_rate}")
        if not (self.burstiness > 0):
            raise ConfigError(f"--burstiness must be > 0, got {self.burstiness}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ConfigError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")
        if self.prompt_format not in ("auto", "tokens", "text"):
            raise ConfigError(f"unknown prompt format {self.prompt_format!r} (valid: auto, tokens, text)")
        resolve_http_client(self.http_client)
        self.base_url = self.base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(f"--base-url must start with http:// or https://, got {self.base_url!r}")
        return self

    @property
    def chat(self) -> bool:
        return self.endpoint == "/v1/chat/completions"

    @property
    def backend(self) -> str:
        """vLLM's name for the request protocol (``--backend`` of ``vllm bench serve``)."""
        return "openai-chat" if self.chat else "openai"


@dataclass
class RequestResult:
    prompt_len: int
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0
    generated_text: str = ""
    success: bool = False
    error: str = ""


def _headers(cfg: ServeBenchConfig) -> dict:
    h = {"Content-Type": "application/json"}
    if cfg.api_key:
        h["Authorization"] = f"Bearer {cfg.api_key}"
    return h


async def check_server(client, cfg: ServeBenchConfig) -> dict:
    """GET /v1/models: proves the server answers and names the model (first one if not given).

    Returns ``{"model": id, "engine": owned_by}``; raises ``ServerUnreachable`` in one line.
    """
    import httpx

    url = f"{cfg.base_url}/v1/models"
    try:
        r = await client.get(url, headers=_headers(cfg), timeout=10.0)
    except httpx.TimeoutException:
        raise ServerUnreachable(f"server at {cfg.base_url} did not answer GET /v1/models within 10 s") from None
    except httpx.HTTPError as e:
        reason = type(e).__name__
        raise ServerUnreachable(f"cannot reach server at {cfg.base_url} ({reason}: {str(e) or 'no answer'}); "
                                f"is it running? (start one with `torchinferno serve`)") from None
    if r.status_code == 401:
        raise ServerUnreachable(f"server at {cfg.base_url} rejected the API key (HTTP 401); pass --api-key")
    if r.status_code != 200:
        raise ServerUnreachable(f"server at {cfg.base_url} answered GET /v1/models with HTTP {r.status_code}")
    try:
        data = r.json().get("data") or []
    except (ValueError, AttributeError):
        raise ServerUnreachable(f"server at {cfg.base_url} returned a non-JSON /v1/models answer") from None
    models = [m.get("id") for m in data if isinstance(m, dict)]
    if cfg.model is None:
        if not models:
            raise ServerUnreachable(f"server at {cfg.base_url} lists no models; pass --model")
        name = models[0]
    else:
        name = cfg.model
    owner = next((m.get("owned_by") for m in data if isinstance(m, dict) and m.get("id") == name), None)
    return {"model": name, "engine": owner or "unknown"}


def _payload(cfg: ServeBenchConfig, model: str, prompt: Prompt) -> dict:
    body: dict = {"model": model, "stream": True, "stream_options": {"include_usage": True}}
    if cfg.chat:
        text = prompt.value if isinstance(prompt.value, str) else " ".join(map(str, prompt.value))
        body["messages"] = [{"role": "user", "content": text}]
        body["max_completion_tokens"] = cfg.output_len
    else:
        body["prompt"] = prompt.value
        body["max_tokens"] = cfg.output_len
    if cfg.temperature is not None:
        body["temperature"] = cfg.temperature
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    return body


async def send_request(client, cfg: ServeBenchConfig, model: str, prompt: Prompt) -> RequestResult:
    """One streaming request over ``client`` (an ``SSEStreamer`` or an httpx.AsyncClient); never raises (errors
    land in ``RequestResult.error``)."""
    out = RequestResult(prompt_len=prompt.expected_len)
    url = cfg.base_url + cfg.endpoint
    st = time.perf_counter()
    out.start_time = st
    last_choice = first_text = last_text = None
    n_text_chunks = 0
    usage_tokens = usage_prompt = None
    text_parts: list[str] = []
    try:
        async with as_streamer(client).lines(url, _payload(cfg, model, prompt), _headers(cfg),
                                             cfg.request_timeout_s) as lines:
            async for line in lines:
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                try:
                    chunk = json.loads(data)
                except ValueError:
                    out.error = f"malformed SSE chunk: {data[:120]!r}"
                    break
                if isinstance(chunk, dict) and "error" in chunk and not chunk.get("choices"):
                    err = chunk["error"]
                    out.error = f"server error: {err.get('message') if isinstance(err, dict) else err}"
                    break
                choices = chunk.get("choices") or []
                if choices:
                    c0 = choices[0]
                    piece = (c0.get("delta") or {}).get("content") if cfg.chat else c0.get("text")
                    if piece:
                        if first_text is None:
                            first_text = now
                        else:
                            out.itl.append(now - last_text)
                        last_text = now
                        n_text_chunks += 1
                        text_parts.append(piece)
                    last_choice = now
                usage = chunk.get("usage")
                if usage:
                    usage_tokens = usage.get("completion_tokens", usage_tokens)
                    usage_prompt = usage.get("prompt_tokens", usage_prompt)
    except BadStatus as e:
        try:
            msg = json.loads(e.body).get("error", {}).get("message") or e.body
        except (ValueError, AttributeError):
            msg = e.body
        out.error = f"HTTP {e.status}: {str(msg).strip()[:300]}"
        out.latency = time.perf_counter() - st
        return out
    except Exception as e:  # connection reset, timeout, ... -> a failed request, not a crashed run
        out.error = f"{type(e).__name__}: {str(e) or 'request failed'}"
        out.latency = time.perf_counter() - st
        return out
    out.generated_text = "".join(text_parts)
    if usage_prompt is not None:
        out.prompt_len = int(usage_prompt)
    out.output_tokens = int(usage_tokens) if usage_tokens is not None else n_text_chunks
    if out.error:
        out.latency = time.perf_counter() - st
        return out
    if first_text is None:
        out.error = "Never received a valid chunk to calculate TTFT."
        out.latency = (last_choice or time.perf_counter()) - st
        return out
    out.ttft = first_text - st
    out.latency = max(last_choice, last_text) - st
    out.success = True
    return out


async def _arrivals(n: int, rate: float, burstiness: float, rng: random.Random):
    """Yield request indices at Poisson/gamma arrival times (vLLM's ``get_request``); the gaps are the
    simulator's (``sim.traffic.arrival_gap``), so a simulated run replays the same arrivals for a seed."""
    from torchinferno.sim.traffic import arrival_gap

    for i in range(n):
        yield i
        if math.isinf(rate) or i == n - 1:
            continue
        await asyncio.sleep(arrival_gap(rng, rate, burstiness))


async def _run(cfg: ServeBenchConfig, log) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(limits=limits, timeout=cfg.request_timeout_s, trust_env=False) as client, \
            open_streamer(cfg.http_client, cfg.request_timeout_s) as streamer:
        info = await check_server(client, cfg)
        model = info["model"]
        as_tokens = cfg.prompt_format == "tokens" or (cfg.prompt_format == "auto" and not cfg.chat)
        # Warm-up prompts of their own, drawn after the measured ones (which stay what they were): a warm-up that sent
        # prompts[0] left it in the prefix cache, so the first measured request's prefill was a cache hit (run 72: the
        # C 1 p99 TTFT was that one request, 25-35 ms against 10)
        n_warm = 0 if cfg.same_prompt else cfg.num_warmups
        prompts, how = await make_prompts(client, cfg.base_url, model, cfg.num_prompts + n_warm, cfg.input_len,
                                          cfg.seed, as_tokens and not cfg.chat)
        warm = prompts[cfg.num_prompts:]
        prompts = prompts[:cfg.num_prompts]
        if cfg.same_prompt:
            prompts = [prompts[0]] * len(prompts)
            warm = prompts[:1]  # the point of --same-prompt: every request hits the cache
        log(f"bench-serve: {cfg.num_prompts} prompts ({how}), input {cfg.input_len} / output {cfg.output_len} tokens, "
            f"rate {cfg.request_rate} req/s, burstiness {cfg.burstiness}, max concurrency {cfg.max_concurrency}, "
            f"{cfg.endpoint} on {cfg.base_url} (model '{model}', engine '{info['engine']}', client {streamer.kind})")
        for i in range(cfg.num_warmups):
            w = await send_request(streamer, cfg, model, warm[i % len(warm)])
            if not w.success:
                raise ConfigError(f"warm-up request failed: {w.error}")

        sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
        pbar = None
        if not cfg.disable_tqdm:
            from tqdm import tqdm

            pbar = tqdm(total=cfg.num_prompts, desc="requests", unit="req", leave=False)

        async def one(i: int) -> RequestResult:
            if sem is None:
                r = await send_request(streamer, cfg, model, prompts[i])
            else:
                async with sem:
                    r = await send_request(streamer, cfg, model, prompts[i])
            if pbar is not None:
                pbar.update(1)
            return r

        rng = random.Random(cfg.seed)
        t0 = time.perf_counter()
        tasks = []
        async for i in _arrivals(cfg.num_prompts, cfg.request_rate, cfg.burstiness, rng):
            tasks.append(asyncio.create_task(one(i)))
        outputs = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
        if pbar is not None:
            pbar.close()
    result = compute_result(cfg, model, outputs, duration)
    result["engine"] = info["engine"]
    result["http_client"] = streamer.kind
    result["prompt_source"] = how
    return result


def run_serve_bench(cfg: ServeBenchConfig, log=print) -> dict:
    """Run the benchmark (blocking) and return the result dict."""
    cfg.validate()
    return asyncio.run(_run(cfg, log))
