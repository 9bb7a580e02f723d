"""Chat and text completions: prompt building, limits, fan-out over ``n``, SSE streaming.

Each choice is one engine request (``{id}-{k}``). Streaming merges the choices' deltas into
OpenAI chunks; the usage chunk (``choices: []``) comes last when ``stream_options.include_usage``;
``data: [DONE]`` ends the stream. Leaving the stream (client disconnect) aborts every choice.
Logprobs: every generated token has one entry, streamed or not (``server.logprobs``); a token without
text of its own rides on the next chunk that has text, or on the final chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from torchinferno.core.generation_defaults import SamplingDefaults
from torchinferno.server.logprobs import LogprobFormatter, entries_of_output, prompt_entries, shifted
from torchinferno.server.protocol import (
    BadRequest,
    ChatCompletionRequest,
    CompletionRequest,
    as_openai_error,
    check_text,
    sampling_params,
)


MAX_CHOICES = 256  # default cap on prompts x n of one request (--max-choices-per-request)


def check_token_ids(ids: list[int], vocab_size: int, param: str) -> None:
    bad = [t for t in ids if t < 0 or t >= vocab_size]
    if bad:
        raise BadRequest(f"token id {bad[0]} in '{param}' is outside the vocabulary [0, {vocab_size})", param)


@dataclass
class _Choice:
    """Progress of one choice (one engine request)."""

    index: int
    prompt_index: int
    request_id: str
    prompt_ids: list[int]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    logprobs: list = field(default_factory=list)  # LogprobEntry per generated token, in order
    sent_logprobs: int = 0  # a stream has sent logprobs[:sent_logprobs]
    prompt_logprobs: list | None = None  # TokenLogprob of prompt tokens 1.. (echo + logprobs)
    echo_sent: bool = False
    t_start: float = 0.0
    t_first: float | None = None
    t_last: float | None = None
    itls: list[float] = field(default_factory=list)


class Context:
    def __init__(self, engine, tokenizer, model_name: str, max_model_len: int, metrics, max_choices: int = MAX_CHOICES,
                 defaults: SamplingDefaults = SamplingDefaults()):
        self.engine, self.tok, self.model_name, self.max_model_len, self.metrics = engine, tokenizer, model_name, max_model_len, metrics
        self.max_choices = max_choices
        self.defaults = defaults  # what a request that leaves a sampling field out gets (generation_config.json)
        self.fmt = LogprobFormatter(tokenizer)

    # ---- prompt building and limits -------------------------------------------------------
    def _limits(self, prompt_ids: list[int], max_tokens: int | None) -> int:
        n = len(prompt_ids)
        if n == 0:
            raise BadRequest("the prompt is empty", "prompt")
        if n >= self.max_model_len:
            raise BadRequest(f"the prompt is {n} tokens but the model's context length is {self.max_model_len} tokens", "prompt")
        if max_tokens is None:
            return self.max_model_len - n
        if n + max_tokens > self.max_model_len:
            raise BadRequest(
                f"this model's maximum context length is {self.max_model_len} tokens; you requested {n + max_tokens} "
                f"({n} in the prompt, {max_tokens} for the completion)", "max_tokens")
        return max_tokens

    def _chat_prompt(self, req: ChatCompletionRequest) -> list[int]:
        if not req.messages:
            raise BadRequest("'messages' must be a non-empty list", "messages")
        msgs = [{"role": m.role, "content": m.text()} for m in req.messages]
        check_text([m["content"] for m in msgs], "messages")
        return self.tok.encode_chat(msgs, add_generation_prompt=req.add_generation_prompt)

    def _completion_prompts(self, req: CompletionRequest) -> list[list[int]]:
        p = req.prompt
        if isinstance(p, str):
            p = [p]
        if not p:
            raise BadRequest("'prompt' must not be empty", "prompt")
        if isinstance(p[0], int):
            p = [p]
        out = []
        for item in p:
            if isinstance(item, str):
                check_text(item, "prompt")
                if item == "":
                    raise BadRequest("'prompt' must not be empty", "prompt")
                out.append(self.tok.encode(item))
            else:
                check_token_ids(item, self.tok.vocab_size, "prompt")
                out.append(list(item))
        return out

    # ---- running choices --------------------------------------------------------------------
    def _start(self, base_id: str, prompts: list[list[int]], params, n: int) -> list[tuple[_Choice, object]]:
        if len(prompts) * n > self.max_choices:
            raise BadRequest(f"{len(prompts)} prompts x n={n} is {len(prompts) * n} choices; at most {self.max_choices} "
                             "per request (--max-choices-per-request)", "n")
        runs = []
        for pi, ids in enumerate(prompts):
            for k in range(n):
                # The engine runs one sequence per request; distinct seeds keep seeded choices distinct.
                seed = params.seed if params.seed is None or n == 1 else params.seed + k
                p = dataclasses.replace(params, n=1, seed=seed)
                ch = _Choice(index=pi * n + k, prompt_index=pi, request_id=f"{base_id}-{pi * n + k}", prompt_ids=ids, t_start=time.perf_counter())
                runs.append((ch, p))
        return runs

    def _record(self, ch: _Choice, out) -> None:
        now = time.perf_counter()
        if out.new_token_ids:
            if ch.t_first is None:
                ch.t_first = now
            elif ch.t_last is not None:
                ch.itls.append(now - ch.t_last)
            ch.t_last = now
        if out.prompt_logprobs is not None:
            ch.prompt_logprobs = out.prompt_logprobs
        if out.logprobs:
            ch.logprobs.extend(entries_of_output(out.new_token_ids, out.logprobs, len(ch.text), out.text_delta,
                                                 self.fmt.piece))
        ch.text += out.text_delta
        ch.token_ids = out.token_ids  # already a snapshot (RequestTextState.make_output)
        if out.finished:
            ch.finish_reason = out.finish_reason
            self.metrics.observe_request(None if ch.t_first is None else ch.t_first - ch.t_start, ch.itls,
                                         now - ch.t_start, len(ch.prompt_ids), len(ch.token_ids), ch.finish_reason)

    async def _abort_all(self, runs) -> None:
        """Abort every unfinished choice; each is counted as finished with reason ``abort``."""
        now = time.perf_counter()
        for ch, _ in runs:
            if ch.finish_reason is None:
                ch.finish_reason = "abort"
                self.metrics.observe_request(None if ch.t_first is None else ch.t_first - ch.t_start, ch.itls,
                                             now - ch.t_start, len(ch.prompt_ids), len(ch.token_ids), "abort")
                try:
                    await self.engine.abort(ch.request_id)
                except Exception:  # pragma: no cover - abort is best effort on teardown
                    pass

    async def _events(self, runs):
        """Yield (choice, RequestOutput) from all choices as they arrive."""
        if len(runs) == 1:  # the common case: read the one stream directly (no pump task, no second queue)
            ch, params = runs[0]
            try:
                async with contextlib.aclosing(self.engine.generate(ch.request_id, ch.prompt_ids, params)) as outs:
                    async for out in outs:
                        self._record(ch, out)
                        yield ch, out
            finally:
                await self._abort_all(runs)
            return
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(ch, params):
            try:
                async for out in self.engine.generate(ch.request_id, ch.prompt_ids, params):
                    await queue.put((ch, out))
            except BaseException as e:  # surfaced to the consumer
                await queue.put((ch, e))
            finally:
                await queue.put((ch, None))

        tasks = [asyncio.create_task(pump(ch, p)) for ch, p in runs]
        live = len(tasks)
        try:
            while live:
                ch, item = await queue.get()
                if item is None:
                    live -= 1
                    continue
                if isinstance(item, BaseException):
                    raise item
                self._record(ch, item)
                yield ch, item
        finally:
            for t in tasks:
                t.cancel()
            await self._abort_all(runs)

    async def _collect(self, runs, request: Request) -> None:
        async def consume():
            async for _ in self._events(runs):
                pass

        task = asyncio.create_task(consume())
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=0.05)
                if done:
                    task.result()
                    return
                if await request.is_disconnected():
                    task.cancel()
                    await self._abort_all(runs)
                    raise BadRequest("client disconnected", status=499)
        finally:
            if not task.done():
                task.cancel()

    # ---- formatting -----------------------------------------------------------------------
    def _usage(self, runs) -> dict:
        prompt = sum(len(ids) for ids in {ch.prompt_index: ch.prompt_ids for ch, _ in runs}.values())
        completion = sum(len(ch.token_ids) for ch, _ in runs)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    # ---- endpoints --------------------------------------------------------------------------
    async def chat(self, req: ChatCompletionRequest, request: Request, rid: str):
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = sampling_params(req, max_tokens, 16, logprobs, self.defaults)
        ids = self._chat_prompt(req)
        params.max_tokens = self._limits(ids, max_tokens)
        if max_tokens is None and self.defaults.max_tokens is not None:  # the model's max_new_tokens, within context
            params.max_tokens = min(params.max_tokens, self.defaults.max_tokens)
        runs = self._start(rid, [ids], params, req.n)
        created = int(time.time())
        if req.stream:
            return self._stream(runs, rid, created, req.include_usage(), chat=True, want_logprobs=logprobs is not None)
        await self._collect(runs, request)
        choices = [{
            "index": ch.index,
            "message": {"role": "assistant", "content": ch.text},
            "logprobs": self.fmt.chat(ch.logprobs) if logprobs is not None else None,
            "finish_reason": ch.finish_reason,
        } for ch, _ in runs]
        return JSONResponse({"id": rid, "object": "chat.completion", "created": created, "model": self.model_name,
                             "choices": choices, "usage": self._usage(runs)})

    async def completion(self, req: CompletionRequest, request: Request, rid: str):
        params = sampling_params(req, req.max_tokens, 16, req.logprobs, self.defaults)
        prompts = self._completion_prompts(req)
        limits = [self._limits(p, req.max_tokens) for p in prompts]
        # OpenAI's completions default is 16 new tokens, or the model's max_new_tokens (clamped to the context left).
        default = self.defaults.max_tokens if self.defaults.max_tokens is not None else 16
        params.max_tokens = req.max_tokens if req.max_tokens is not None else min(default, min(limits))
        if req.echo and req.logprobs is not None:
            params.prompt_logprobs = req.logprobs
        runs = self._start(rid, prompts, params, req.n)
        created = int(time.time())
        if req.stream:
            return self._stream(runs, rid, created, req.include_usage(), chat=False, want_logprobs=req.logprobs is not None,
                                echo=[self.tok.decode(p) for p in prompts] if req.echo else None)
        await self._collect(runs, request)
        choices = []
        for ch, _ in runs:
            echo = self.tok.decode(ch.prompt_ids) if req.echo else ""
            lp = None
            if req.logprobs is not None:
                lp = self.fmt.completion(self._echo_entries(ch, echo) + shifted(ch.logprobs, len(echo)) if req.echo
                                         else ch.logprobs)
            choices.append({"index": ch.index, "text": echo + ch.text, "logprobs": lp, "finish_reason": ch.finish_reason})
        return JSONResponse({"id": rid, "object": "text_completion", "created": created, "model": self.model_name,
                             "choices": choices, "usage": self._usage(runs)})

    def _echo_entries(self, ch: _Choice, echo: str) -> list:
        return prompt_entries(ch.prompt_ids, ch.prompt_logprobs, self.tok, len(echo))

    def _stream(self, runs, rid: str, created: int, include_usage: bool, chat: bool, want_logprobs: bool, echo=None):
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices: list, usage=None) -> str:
            body = {"id": rid, "object": obj, "created": created, "model": self.model_name, "choices": choices}
            if include_usage:
                body["usage"] = usage
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        async def gen():
            if chat:
                yield chunk([{"index": ch.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None} for ch, _ in runs])
            elif echo is not None and not want_logprobs:  # with logprobs, the echo rides on the first chunk
                yield chunk([{"index": ch.index, "text": echo[ch.prompt_index], "logprobs": None, "finish_reason": None}
                             for ch, _ in runs])
            try:
                async for ch, out in self._events(runs):
                    # An output without text holds its logprob entries back for the next chunk (module docstring).
                    if not out.text_delta and not out.finished:
                        continue
                    entries, ch.sent_logprobs = ch.logprobs[ch.sent_logprobs:], len(ch.logprobs)
                    if chat:
                        c = {"index": ch.index, "delta": {"content": out.text_delta} if out.text_delta else {},
                             "logprobs": self.fmt.chat(entries) if want_logprobs else None,
                             "finish_reason": out.finish_reason if out.finished else None}
                    else:
                        text = out.text_delta
                        if echo is not None and want_logprobs:
                            e = echo[ch.prompt_index]
                            entries = shifted(entries, len(e))
                            if not ch.echo_sent:
                                ch.echo_sent, text, entries = True, e + text, self._echo_entries(ch, e) + entries
                        c = {"index": ch.index, "text": text,
                             "logprobs": self.fmt.completion(entries) if want_logprobs else None,
                             "finish_reason": out.finish_reason if out.finished else None}
                    yield chunk([c])
            except Exception as e:  # the 200 is already sent: end the stream with an OpenAI error event
                err = as_openai_error(e)
                self.metrics.bad_requests.labels(self.model_name, str(err.status)).inc()
                yield f"data: {json.dumps(err.body())}\n\n"
                yield "data: [DONE]\n\n"
                return
            if include_usage:
                yield chunk([], self._usage(runs))
            yield "data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
