"""`data.backend: openai`: the same conversations answered by an OpenAI-compatible server (vLLM, SGLang, TGI).

The server answers /v1/chat/completions; each returned assistant text is tokenized with the
target's own tokenizer and chat template (data/chat.py) into input_ids and loss_mask,
ending in the template's end-of-turn token when the server says the turn finished.
Where the server reports the token ids it generated (llama.cpp's logprobs, vLLM's return_token_ids) and they spell
that very text, the row keeps them: re-encoding text can split it otherwise than the target did ("\n\n" as two
tokens where the target wrote one).
A server with a reasoning parser (vLLM, SGLang, llama.cpp) returns the thinking apart, in `reasoning_content` (newer
vLLM: `reasoning`); data.reasoning says what the row does with it: `keep` renders it where the target's template puts
thinking (Qwen3: '<think>\n...\n</think>\n\n' before the answer, trained like the answer), `inline` writes it in
<think> tags before the answer for templates with no place for it, `drop` trains on the answer alone.
Conversations run concurrently (data.concurrency); failed requests are retried with backoff.
A request the server rejects (4xx) skips that conversation, counted; a server that stays
unreachable after data.max_retries is a one-line error (finished shards stay on disk).
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

from transformers import AutoTokenizer

from draftheads.core.errors import DraftheadsError
from draftheads.core.sampling import fold_seed
from draftheads.core.targets import locate_target
from draftheads.data.chat import (SENTINEL, add_reply, encode, end_of_turn_id, inline_thinking, render_text,
                                  stop_token_ids, thinking_turn)
from draftheads.data.target import attach_chat_template, from_hub

BACKOFF_SECONDS = 1.0  # first retry waits this long, then doubles
TIMEOUT_SECONDS = 600.0
RETRY_STATUS = {408, 409, 425, 429}  # plus every 5xx


class Rejected(Exception):
    """The server refused this request (a 4xx other than rate limiting): skip the conversation."""


@dataclass
class Reply:
    """One chat completion: the answer, the thinking a reasoning parser split off, why it ended, and the generated
    token ids where the server reports them."""

    content: str
    reasoning: str
    finish: str
    ids: list[int] | None = None

    @classmethod
    def from_choice(cls, choice: dict) -> "Reply":
        message = choice.get("message") or {}
        reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
        return cls(message.get("content") or "", reasoning, choice.get("finish_reason") or "stop", reported_ids(choice))


def reported_ids(choice: dict) -> list[int] | None:
    """The generated token ids in a chat completion choice: vLLM's `token_ids` (return_token_ids) or llama.cpp's
    logprobs entries, which carry each token's `id`; None from servers that report neither."""
    ids = choice.get("token_ids")
    if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
        return ids
    entries = (choice.get("logprobs") or {}).get("content") or []
    if entries and all(isinstance(e, dict) and isinstance(e.get("id"), int) for e in entries):
        return [e["id"] for e in entries]
    return None


def load_tokenizer(target_cfg, template_kwargs: dict | None = None):
    """The target's tokenizer alone (the weights live on the server), with a chat template."""
    where, extra = locate_target(target_cfg.name)
    tokenizer = from_hub(AutoTokenizer.from_pretrained, target_cfg.name, where, revision=target_cfg.revision,
                          trust_remote_code=target_cfg.trust_remote_code, **extra)
    attach_chat_template(tokenizer, target_cfg.chat_template, target_cfg.name, template_kwargs)
    return tokenizer


class OpenAIBackend:
    """Answers chats and writes self prompts through an OpenAI-compatible HTTP server."""

    def __init__(self, tokenizer, data, model: str):
        self.tokenizer, self.data, self.model = tokenizer, data, model
        self.url = data.openai_url.rstrip("/")
        self.stop_ids = stop_token_ids(tokenizer)
        end = end_of_turn_id(tokenizer)
        self.end_id = end if end is not None else tokenizer.eos_token_id

    def answer(self, chats: list, seed: int, on_batch=None) -> None:
        """Answer every open chat (each one turn after another; chats side by side)."""
        todo = [c for c in chats if not c.done]
        with ThreadPoolExecutor(max_workers=self.data.concurrency) as pool:
            futures = {pool.submit(self._answer_chat, chat, seed): chat for chat in todo}
            try:
                for future in as_completed(futures):
                    tokens = future.result()  # a DraftheadsError from a dead server stops the run here
                    if on_batch is not None:
                        on_batch([futures[future]], tokens)
            except BaseException:
                for future in futures:  # queued conversations would each retry the dead server in turn first
                    future.cancel()
                raise

    def _answer_chat(self, chat, seed: int) -> int:
        """Replay one conversation; the number of reply tokens it added."""
        added = 0
        while not chat.done:
            budget = min(self.data.max_new_tokens, self.data.max_length - len(chat.input_ids))
            try:
                reply = self.chat_completion(chat.messages, budget,
                                             seed + 7919 * chat.prompt_id + 104_729 * chat.sample + chat.answered,
                                             chat.temperature)
            except Rejected as e:
                chat.done, chat.stopped = True, f"openai: request rejected ({e})"
                break
            text, message = self.turn(chat.messages, reply)
            ids = self.token_ids(text, reply.ids)
            # The server enforced max_new_tokens in its own tokens; we only keep the row within max_length.
            room = self.data.max_length - len(chat.input_ids)
            ids = ids + [self.end_id] if reply.finish == "stop" and len(ids) < room else ids[:room]
            add_reply(self.tokenizer, chat, ids, self.stop_ids, self.data.max_length, message)
            added += len(ids)
        return added

    def turn(self, messages: list[dict], reply: Reply) -> tuple[str, dict]:
        """(the text the target generated in this turn, the assistant message the history records), its thinking
        kept, written inline or dropped as data.reasoning says."""
        reasoning = reply.reasoning if reply.reasoning.strip() and self.data.reasoning != "drop" else ""
        if not reasoning or "</think>" in reply.content:  # llama.cpp's deepseek-legacy: the content holds it already
            return reply.content, {"role": "assistant", "content": reply.content}
        cut = reply.finish == "length" and not reply.content.strip()  # out of tokens before the answer began
        if self.data.reasoning == "inline":
            text, content = inline_thinking(self.tokenizer, messages, reply.content, reasoning, cut)
            return text, {"role": "assistant", "content": content}
        text = thinking_turn(self.tokenizer, messages, reply.content, reasoning, cut)
        if text is None:
            raise DraftheadsError("the server returned the target's thinking (reasoning_content) but its chat template "
                                  "has no place for it; set data.reasoning=inline to train on it in <think> tags "
                                  "before the answer, or data.reasoning=drop to train on answers alone")
        return text, {"role": "assistant", "content": reply.content, "reasoning_content": reasoning}

    def token_ids(self, text: str, reported: list[int] | None) -> list[int]:
        """`text` as token ids: the ids the server says it generated where they spell exactly this text, else the
        text encoded."""
        if reported:
            while reported and reported[-1] in self.stop_ids:  # the row adds the end-of-turn itself
                reported = reported[:-1]
            if self.tokenizer.decode(reported) == text:
                return reported
        return encode(self.tokenizer, text)

    def chat_completion(self, messages: list[dict], max_tokens: int, seed: int,
                        temperature: float | None = None) -> Reply:
        # logprobs: llama.cpp's name each token's id; return_token_ids: vLLM's ids; servers ignore what they lack
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens,
                "temperature": self.data.temperature if temperature is None else temperature, "top_p": self.data.top_p,
                "seed": fold_seed(seed), "logprobs": True, "top_logprobs": 1, "return_token_ids": True}
        if self.data.chat_template_kwargs:   # the server renders the template: vLLM and SGLang take these per request
            body["chat_template_kwargs"] = dict(self.data.chat_template_kwargs)
        return Reply.from_choice(self.post("/chat/completions", body)["choices"][0])

    def reply(self, messages: list[str], max_tokens: int, temperature: float, seed: int) -> list[tuple[str, bool]]:
        """The target's answer to each user message (a one-turn chat with the recipe's system prompt): [(text,
        finished)]."""
        system = [{"role": "system", "content": self.data.system_prompt}] if self.data.system_prompt else []

        def one(k: int) -> tuple[str, bool]:
            try:
                reply = self.chat_completion(system + [{"role": "user", "content": messages[k]}], max_tokens,
                                             seed * 100_003 + k, temperature)
            except Rejected:
                return "", False
            return reply.content, reply.finish == "stop"  # a passage or question: the thinking is not part of it

        with ThreadPoolExecutor(max_workers=self.data.concurrency) as pool:
            return list(pool.map(one, range(len(messages))))

    def write(self, count: int, max_tokens: int, temperature: float, seed: int,
              lead: str = "") -> list[tuple[str, bool]]:
        """Magpie through /v1/completions: the raw template up to a user's words (and `lead`), continued by the
        target."""
        messages = ([{"role": "system", "content": self.data.system_prompt}] if self.data.system_prompt else [])
        text = render_text(self.tokenizer, messages + [{"role": "user", "content": SENTINEL}],
                           add_generation_prompt=False)
        prefix = text[: text.index(SENTINEL)] + lead
        stop = [self.tokenizer.decode([i]) for i in self.stop_ids]

        def one(k: int) -> tuple[str, bool]:
            body = {"model": self.model, "prompt": prefix, "max_tokens": max_tokens, "temperature": temperature,
                    "top_p": 1.0, "seed": fold_seed(seed * 100_003 + k), "stop": stop}
            try:
                choice = self.post("/completions", body)["choices"][0]
            except Rejected:
                return "", False
            return lead + (choice.get("text") or ""), choice.get("finish_reason") == "stop"

        with ThreadPoolExecutor(max_workers=self.data.concurrency) as pool:
            return list(pool.map(one, range(count)))

    def post(self, path: str, body: dict) -> dict:
        """POST JSON with retries on connection errors, timeouts, 429 and 5xx."""
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        last = ""
        for attempt in range(self.data.max_retries + 1):
            if attempt:
                time.sleep(BACKOFF_SECONDS * 2 ** (attempt - 1))
            try:
                with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as e:
                detail = e.read().decode(errors="replace")[:120].replace("\n", " ")
                if e.code < 500 and e.code not in RETRY_STATUS:
                    raise Rejected(f"HTTP {e.code}: {detail}") from None
                last = f"HTTP {e.code}: {detail}"
            except (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException) as e:
                last = str(getattr(e, "reason", e)) or type(e).__name__  # HTTPException: a server killed mid-reply
            except json.JSONDecodeError:
                last = "the reply was not JSON"
        raise DraftheadsError(f"openai backend: {self.url}{path} failed {self.data.max_retries + 1} times ({last}); "
                              "check data.openai_url and that the server is up, then rerun to resume")
