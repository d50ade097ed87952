"""backend: openai, against a local OpenAI-compatible server that runs a tiny target through our own generation code."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from draftheads.core.errors import DraftheadsError
from draftheads.data import datagen, openai_backend
from draftheads.data.batch_generate import generate_batch
from draftheads.data.chat import build_row, encode, render_ids, stop_token_ids
from tests.data.test_datagen import load, make_recipe, prompt_file
from tests.fixtures import make_target, make_tokenizer


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    monkeypatch.setattr(openai_backend, "BACKOFF_SECONDS", 0.01)


class TinyServer:
    """/v1/chat/completions and /v1/completions served by a tiny target; records requests, can fail on cue."""

    def __init__(self, model, tokenizer, fail_first=0, delay=0.0):
        self.model, self.tok, self.fail_left, self.delay = model, tokenizer, fail_first, delay
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
                text, finish = self.generate(render_ids(self.tok, body["messages"], True), body)
                with self.lock:
                    self.replies.append((body["messages"], text, finish))
                return 200, {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": finish}]}
            text, finish = self.generate(encode(self.tok, body["prompt"]), body)
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
        return self.tok.decode(body_ids, skip_special_tokens=True), "stop" if out.finished else "length"

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
