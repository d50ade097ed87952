"""`data.backend: openai`: the same conversations answered by an OpenAI-compatible server (vLLM, SGLang, TGI).

The server answers /v1/chat/completions; each returned assistant text is tokenized with the
target's own tokenizer and chat template (data/chat.py) into input_ids and loss_mask,
ending in the template's end-of-turn token when the server says the turn finished.
Conversations run concurrently (data.concurrency); failed requests are retried with backoff.
A request the server rejects (4xx) skips that conversation, counted; a server that stays
unreachable after data.max_retries is a one-line error (finished shards stay on disk).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed

from transformers import AutoTokenizer

from draftheads.core.errors import DraftheadsError
from draftheads.core.sampling import fold_seed
from draftheads.core.targets import locate_target
from draftheads.data.chat import SENTINEL, add_reply, encode, end_of_turn_id, render_text, stop_token_ids
from draftheads.data.target import attach_chat_template, from_hub

BACKOFF_SECONDS = 1.0  # first retry waits this long, then doubles
TIMEOUT_SECONDS = 600.0
RETRY_STATUS = {408, 409, 425, 429}  # plus every 5xx


class Rejected(Exception):
    """The server refused this request (a 4xx other than rate limiting): skip the conversation."""


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
            for future in as_completed(futures):
                tokens = future.result()  # a DraftheadsError from a dead server stops the run here
                if on_batch is not None:
                    on_batch([futures[future]], tokens)

    def _answer_chat(self, chat, seed: int) -> int:
        """Replay one conversation; the number of reply tokens it added."""
        added = 0
        while not chat.done:
            budget = min(self.data.max_new_tokens, self.data.max_length - len(chat.input_ids))
            try:
                text, finish = self.chat_completion(chat.messages, budget, seed + 7919 * chat.prompt_id + chat.answered)
            except Rejected as e:
                chat.done, chat.stopped = True, f"openai: request rejected ({e})"
                break
            ids = encode(self.tokenizer, text)
            # The server enforced max_new_tokens in its own tokens; we only keep the row within max_length.
            room = self.data.max_length - len(chat.input_ids)
            ids = ids + [self.end_id] if finish == "stop" and len(ids) < room else ids[:room]
            add_reply(self.tokenizer, chat, ids, self.stop_ids, self.data.max_length)
            added += len(ids)
        return added

    def chat_completion(self, messages: list[dict], max_tokens: int, seed: int,
                        temperature: float | None = None) -> tuple[str, str]:
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens,
                "temperature": self.data.temperature if temperature is None else temperature, "top_p": self.data.top_p,
                "seed": fold_seed(seed)}
        if self.data.chat_template_kwargs:   # the server renders the template: vLLM and SGLang take these per request
            body["chat_template_kwargs"] = dict(self.data.chat_template_kwargs)
        choice = self.post("/chat/completions", body)["choices"][0]
        return choice["message"].get("content") or "", choice.get("finish_reason") or "stop"

    def reply(self, messages: list[str], max_tokens: int, temperature: float, seed: int) -> list[tuple[str, bool]]:
        """The target's answer to each user message (a one-turn chat with the recipe's system prompt): [(text,
        finished)]."""
        system = [{"role": "system", "content": self.data.system_prompt}] if self.data.system_prompt else []

        def one(k: int) -> tuple[str, bool]:
            try:
                text, finish = self.chat_completion(system + [{"role": "user", "content": messages[k]}], max_tokens,
                                                    seed * 100_003 + k, temperature)
            except Rejected:
                return "", False
            return text, finish == "stop"

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
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                last = str(getattr(e, "reason", e))
            except json.JSONDecodeError:
                last = "the reply was not JSON"
        raise DraftheadsError(f"openai backend: {self.url}{path} failed {self.data.max_retries + 1} times ({last}); "
                              "check data.openai_url and that the server is up, then rerun to resume")
