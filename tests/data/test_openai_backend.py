"""backend: openai, against a local OpenAI-compatible server that runs a tiny target through our own generation code."""

import copy
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from draftheads.core.errors import DraftheadsError
from draftheads.data import datagen, openai_backend
from draftheads.data.batch_generate import generate_batch
from draftheads.data.chat import build_row, encode, render_ids, render_text, stop_token_ids
from tests.data.test_chat import QWEN3_THINKING
from tests.data.test_datagen import load, make_recipe, prompt_file
from tests.fixtures import make_target, make_tokenizer


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    monkeypatch.setattr(openai_backend, "BACKOFF_SECONDS", 0.01)


class TinyServer:
    """/v1/chat/completions and /v1/completions served by a tiny target; records requests, can fail on cue.

    `reasoning`: every chat reply also carries this thinking, apart, as a reasoning parser returns it (the field named
    `reasoning_field`); `report_ids(ids)`: the token ids the reply reports (vLLM's `token_ids`)."""

    def __init__(self, model, tokenizer, fail_first=0, delay=0.0, reasoning=None, reasoning_field="reasoning_content",
                 report_ids=None):
        self.model, self.tok, self.fail_left, self.delay = model, tokenizer, fail_first, delay
        self.reasoning, self.reasoning_field, self.report_ids = reasoning, reasoning_field, report_ids
        self.stops = stop_token_ids(tokenizer)
        self.requests, self.replies, self.in_flight, self.max_in_flight = [], [], 0, 0
        self.lock, self.model_lock = threading.Lock(), threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, reply = server.handle(self.path, body)
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    def handle(self, path, body):
        with self.lock:
            self.requests.append((path, body))
            if self.fail_left > 0:
                self.fail_left -= 1
                return 503, {"error": "warming up"}
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            time.sleep(self.delay)
            if path.endswith("/chat/completions"):
                if "REJECT" in body["messages"][-1]["content"]:
                    return 400, {"error": "prompt not allowed"}
                text, finish, ids = self.generate(render_ids(self.tok, body["messages"], True), body)
                with self.lock:
                    self.replies.append((body["messages"], text, finish))
                message = {"role": "assistant", "content": text}
                if self.reasoning is not None:
                    message[self.reasoning_field] = self.reasoning
                choice = {"message": message, "finish_reason": finish}
                if self.report_ids is not None:
                    choice["token_ids"] = self.report_ids(ids)
                return 200, {"choices": [choice]}
            text, finish, _ = self.generate(encode(self.tok, body["prompt"]), body)
            return 200, {"choices": [{"text": text, "finish_reason": finish}]}
        finally:
            with self.lock:
                self.in_flight -= 1

    def generate(self, ids, body):
        generator = torch.Generator().manual_seed(body.get("seed", 0))
        with self.model_lock:
            out = generate_batch(self.model, [ids], max_new_tokens=body["max_tokens"], stop_ids=self.stops,
                                 pad_id=self.tok.pad_token_id, temperature=body.get("temperature", 0.0),
                                 top_p=body.get("top_p", 1.0), generator=generator)[0]
        body_ids = out.tokens[:-1] if out.finished else out.tokens
        return self.tok.decode(body_ids, skip_special_tokens=True), "stop" if out.finished else "length", body_ids

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture(scope="module")
def target():
    tok = make_tokenizer("chatml")
    return make_target("llama", tok), tok


def openai_recipe(tmp_path, url, source, **data):
    return make_recipe(tmp_path / "out", source, backend="openai", openai_url=url, **data)


def trained_text(tok, ids, mask):
    return tok.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=True)


def test_single_turn_rows_match_the_local_backend(tmp_path, target):
    """Same prompts, greedy: the server's answers, re-tokenized, carry the same text as local generation."""
    model, tok = target
    rows = [{"prompt": u} for u in ["def add(a, b):", "Hello! How can I help you today?", "class Stack:",
                                    "for i in range(10):"]]
    source = prompt_file(tmp_path, rows)
    local = load(datagen.run_data(make_recipe(tmp_path / "local", source, num_prompts=4), target=target))
    with TinyServer(model, tok) as server:
        remote = load(datagen.run_data(openai_recipe(tmp_path, server.url, source, num_prompts=4), target=target))
    assert remote["prompt_id"] == local["prompt_id"]
    for a_ids, a_mask, b_ids, b_mask in zip(local["input_ids"], local["loss_mask"], remote["input_ids"],
                                            remote["loss_mask"]):
        head = a_mask.index(1)
        assert b_ids[:head] == a_ids[:head] and b_mask[:head] == [0] * head  # the same rendered prompt
        assert trained_text(tok, a_ids, a_mask) == trained_text(tok, b_ids, b_mask)


def test_multi_turn_rows_are_built_from_the_server_replies(tmp_path, target):
    """Turn 2 is asked with the server's turn-1 text; the row is the replay of exactly those replies."""
    model, tok = target
    prompt = render_ids(tok, [{"role": "user", "content": "def add(a, b):"}], True)
    free = generate_batch(model, [prompt], max_new_tokens=8, stop_ids=[], pad_id=tok.pad_token_id)[0]
    source = prompt_file(tmp_path, [{"turns": ["def add(a, b):", "Now explain it."]}])
    with TinyServer(model, tok) as server:
        # a random model never says <|im_end|>: end turn 1 early
        server.stops = sorted(set(server.stops) | {free.tokens[3]})
        out = datagen.run_data(openai_recipe(tmp_path, server.url, source, num_prompts=1, max_new_tokens=8,
                                             max_length=200), target=target)
        replies = list(server.replies)
    assert [r[0][-1]["content"] for r in replies] == ["def add(a, b):", "Now explain it."]
    assert replies[0][2] == "stop" and replies[1][0][1] == {"role": "assistant", "content": replies[0][1]}
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    expected = build_row(tok, ["def add(a, b):", "Now explain it."],
                         [encode(tok, text) + ([eot] if finish == "stop" else []) for _, text, finish in replies])
    row = load(out)
    assert (row["input_ids"][0], row["loss_mask"][0]) == (expected.input_ids, expected.loss_mask)
    assert sum(a != b for a, b in zip(row["loss_mask"][0], row["loss_mask"][0][1:])) >= 3  # two trained spans


def test_retries_then_succeeds(tmp_path, target):
    model, tok = target
    source = prompt_file(tmp_path, [{"prompt": "def add(a, b):"}, {"prompt": "class Stack:"}])
    with TinyServer(model, tok, fail_first=2) as server:
        out = datagen.run_data(openai_recipe(tmp_path, server.url, source, num_prompts=2, max_retries=3), target=target)
        assert len(server.requests) == 2 + 2 and len(load(out)["prompt_id"]) == 2


def test_rejected_request_is_a_counted_skip(tmp_path, target):
    model, tok = target
    source = prompt_file(tmp_path, [{"prompt": "REJECT me please"}, {"prompt": "class Stack:"}])
    with TinyServer(model, tok) as server:
        out = datagen.run_data(openai_recipe(tmp_path, server.url, source, num_prompts=2), target=target)
    meta = json.loads((out / "draftheads_data.json").read_text())
    assert len(load(out)["prompt_id"]) == 1
    assert any(k.startswith("openai: request rejected (HTTP 400") for k in meta["summary"]["dropped"])


def test_dead_server_is_a_one_line_error_and_the_rerun_resumes(tmp_path, target):
    model, tok = target
    source = prompt_file(tmp_path, [{"prompt": "def add(a, b):"}])
    with TinyServer(model, tok) as server:
        url = server.url  # the port is closed once the server stops
    with pytest.raises(DraftheadsError, match=r"failed 2 times.*check data.openai_url") as err:
        datagen.run_data(openai_recipe(tmp_path, url, source, num_prompts=1, max_retries=1), target=target)
    assert "\n" not in str(err.value)
    with TinyServer(model, tok) as server:
        out = datagen.run_data(openai_recipe(tmp_path, server.url, source, num_prompts=1), target=target)
    assert len(load(out)["prompt_id"]) == 1  # the server address is not part of the recipe hash


def test_requests_run_concurrently_up_to_the_limit(tmp_path, target):
    model, tok = target
    source = prompt_file(tmp_path, [{"prompt": f"Task {i}: def add(a, b):"} for i in range(8)])
    with TinyServer(model, tok, delay=0.1) as server:
        datagen.run_data(openai_recipe(tmp_path, server.url, source, num_prompts=8, concurrency=3), target=target)
    assert server.max_in_flight == 3


def test_self_prompts_through_completions(tmp_path, target):
    model, tok = target
    data = make_recipe(tmp_path / "o", "self", backend="openai", openai_url="http://unused").data
    with TinyServer(model, tok) as server:
        data.openai_url = server.url
        backend = openai_backend.OpenAIBackend(tok, data, model="tiny")
        texts = backend.write(3, max_tokens=5, temperature=1.0, seed=0)
        sent = [body for path, body in server.requests]
    assert len(texts) == 3 and all(path.endswith("/completions") for path, _ in server.requests)
    assert all(b["prompt"] == "<|im_start|>user\n" and b["max_tokens"] == 5 and "<|im_end|>" in b["stop"] for b in sent)
    assert len({b["seed"] for b in sent}) == 3
    with TinyServer(model, tok) as server:
        data.openai_url = server.url
        led = openai_backend.OpenAIBackend(tok, data, model="tiny").write(2, max_tokens=5, temperature=1.0, seed=0,
                                                                          lead="Write a")
        assert all(body["prompt"] == "<|im_start|>user\nWrite a" for _, body in server.requests)
    assert all(text.startswith("Write a") for text, _ in led)


def test_chat_template_kwargs_reach_the_server_with_every_request(tmp_path, target):
    model, tok = target
    source = prompt_file(tmp_path, [{"prompt": "def add(a, b):"}, {"prompt": "class Stack:"}])
    with TinyServer(model, tok) as server:
        datagen.run_data(openai_recipe(tmp_path, server.url, source, num_prompts=2,
                                       chat_template_kwargs={"enable_thinking": False}), target=target)
        chats = [body for path, body in server.requests if path.endswith("/chat/completions")]
    assert len(chats) == 2 and all(body["chat_template_kwargs"] == {"enable_thinking": False} for body in chats)


def free_tokens(model, tok, user, steps=8):
    prompt = render_ids(tok, [{"role": "user", "content": user}], True)
    return generate_batch(model, [prompt], max_new_tokens=steps, stop_ids=[], pad_id=tok.pad_token_id)[0].tokens


def test_thinking_is_trained_where_the_template_renders_it(tmp_path, target):
    """A reasoning parser's reasoning_content: each row's answered turn is the template's own rendering of the turn
    with its thinking, all of it after the generation prompt trained; the next turn is asked with that thinking
    (the template drops it from the context, so the turn has a row of its own)."""
    model, plain = target
    tok = copy.copy(plain)
    tok.chat_template = QWEN3_THINKING
    users = ["def add(a, b):", "Now explain it."]
    thinking = "\nThe user wants a sum.\nReturn a + b.\n"  # as vLLM splits '<think>\n...\n</think>': newlines kept
    source = prompt_file(tmp_path, [{"turns": users}])
    with TinyServer(model, tok, reasoning=thinking) as server:
        server.stops = sorted(set(server.stops) | {free_tokens(model, tok, users[0])[3]})  # end turn 1 early
        out = datagen.run_data(openai_recipe(tmp_path, server.url, source, num_prompts=1, max_new_tokens=8,
                                             max_length=300), target=(model, tok))
        (_, answer1, finish1), (asked2, answer2, finish2) = server.replies
    assert finish1 == "stop" and asked2[1] == {"role": "assistant", "content": answer1, "reasoning_content": thinking}
    rows = load(out)
    (row1, row2), (mask1, mask2) = rows["input_ids"], rows["loss_mask"]
    closed = render_text(tok, asked2[:2], add_generation_prompt=False)
    assert tok.decode(row1) + "\n" == closed and "<think>\nThe user wants a sum.\nReturn a + b.\n</think>\n\n" in closed
    head = len(render_ids(tok, asked2[:1], True))
    assert mask1 == [0] * head + [1] * (len(row1) - head)  # the thinking is trained like the answer
    context = render_ids(tok, asked2, True)
    assert "The user wants" not in tok.decode(context) and row2[:len(context)] == context
    assert mask2 == [0] * len(context) + [1] * (len(row2) - len(context))
    end = "<|im_end|>" if finish2 == "stop" else ""
    thought = "<think>\nThe user wants a sum.\nReturn a + b.\n</think>\n\n"
    assert tok.decode(row2[len(context):]) == thought + answer2 + end


@pytest.mark.parametrize("mode", ["keep", "inline", "drop"])
def test_thinking_for_a_template_with_no_place_for_it(tmp_path, target, mode):
    """ChatML (SmolLM2's) renders no reasoning: keep is a one-line error naming the settings that work, inline trains
    the thinking in <think> tags before the answer, drop the answer alone."""
    model, tok = target
    source = prompt_file(tmp_path, [{"prompt": "def add(a, b):"}])
    with TinyServer(model, tok, reasoning="Return a + b.", reasoning_field="reasoning") as server:  # newer vLLM's name
        recipe = openai_recipe(tmp_path, server.url, source, num_prompts=1, max_length=200, reasoning=mode)
        if mode == "keep":
            with pytest.raises(DraftheadsError, match="no place for it; set data.reasoning=inline.*=drop") as e:
                datagen.run_data(recipe, target=target)
            assert "\n" not in str(e.value)
            return
        row = load(datagen.run_data(recipe, target=target))
        ((_, answer, _),) = server.replies
    thinking = "<think>\nReturn a + b.\n</think>\n\n" if mode == "inline" else ""
    assert trained_text(tok, row["input_ids"][0], row["loss_mask"][0]) == thinking + answer


def test_thinking_the_content_holds_already_is_not_written_twice(tmp_path, target):
    """llama-server's --reasoning-format deepseek-legacy returns the thinking in both fields."""
    _, tok = target
    data = make_recipe(tmp_path, "self", backend="openai", openai_url="http://127.0.0.1:1/v1", reasoning="inline").data
    backend = openai_backend.OpenAIBackend(tok, data, model="tiny")
    content = "<think>\nAdd.\n</think>\n\nSum."
    text, message = backend.turn([{"role": "user", "content": "a"}], openai_backend.Reply(content, "Add.", "stop"))
    assert text == content and message == {"role": "assistant", "content": content}


def test_reported_token_ids_are_kept_where_they_spell_the_answer(tmp_path, target):
    """The target may write a text in other tokens than encoding it gives: the row keeps the ids the server reports,
    unless they spell another text."""
    model, tok = target
    source = prompt_file(tmp_path, [{"prompt": "def add(a, b):"}])
    answer = "def add(a, b):\n    return a + b\n"
    canonical = encode(tok, answer)
    k = next(i for i, t in enumerate(canonical) if len(tok.convert_ids_to_tokens(t)) > 1)
    as_bytes = tok.convert_tokens_to_ids(list(tok.convert_ids_to_tokens(canonical[k])))
    written = canonical[:k] + as_bytes + canonical[k + 1:]
    assert tok.decode(written) == answer and written != canonical  # the same text, one token written byte by byte
    generated = {}
    for name, report in (("split", lambda ids: ids), ("wrong", lambda ids: ids[1:])):
        with TinyServer(model, tok, report_ids=report) as server:
            server.generate = lambda ids, body: (answer, "length", written)
            row = load(datagen.run_data(openai_recipe(tmp_path / name, server.url, source, num_prompts=1),
                                        target=target))
        generated[name] = [t for t, m in zip(row["input_ids"][0], row["loss_mask"][0]) if m]
    assert generated == {"split": written, "wrong": canonical}


def test_token_ids_are_read_from_vllm_and_llama_cpp_replies():
    assert openai_backend.reported_ids({"token_ids": [5, 6]}) == [5, 6]  # vLLM, return_token_ids
    llama_cpp = {"logprobs": {"content": [{"id": 5, "token": "a", "logprob": -0.1}, {"id": 6, "token": "b"}]}}
    assert openai_backend.reported_ids(llama_cpp) == [5, 6]
    assert openai_backend.reported_ids({"logprobs": {"content": [{"token": "a"}]}}) is None  # tokens as text only
    assert openai_backend.reported_ids({"message": {"content": "ab"}}) is None


def test_a_dead_server_fails_the_run_without_retrying_every_queued_conversation(tmp_path, target):
    model, tok = target
    source = prompt_file(tmp_path, [{"prompt": f"Task {i}: def add(a, b):"} for i in range(8)])
    with TinyServer(model, tok, fail_first=1000) as server:
        with pytest.raises(DraftheadsError, match="failed 2 times"):
            datagen.run_data(openai_recipe(tmp_path, server.url, source, num_prompts=8, shard_size=8, concurrency=2,
                                           max_retries=1), target=target)
        assert len(server.requests) <= 4 * 2  # the conversations started before the first failure, not all 8


def test_the_reasoning_setting_is_checked_and_hashed_only_when_set(tmp_path):
    from draftheads.core.config import to_dict
    from draftheads.data.datastore import recipe_hash, settings_hash

    server = dict(backend="openai", openai_url="http://127.0.0.1:1/v1")
    with pytest.raises(DraftheadsError, match="data.reasoning: 'think' is not one of 'keep', 'inline', 'drop'"):
        make_recipe(tmp_path, "self", reasoning="think", **server)
    with pytest.raises(DraftheadsError, match="reasoning=drop applies to data.backend: openai.*enable_thinking: false"):
        make_recipe(tmp_path, "self", reasoning="drop")
    keep = make_recipe(tmp_path, "self", **server)
    before = {k: v for k, v in to_dict(keep.data).items() if k != "reasoning"}  # a folder written before the setting
    assert settings_hash(to_dict(keep.target), before) == recipe_hash(keep)
    assert recipe_hash(make_recipe(tmp_path, "self", reasoning="drop", **server)) != recipe_hash(keep)
