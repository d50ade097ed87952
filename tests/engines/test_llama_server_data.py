"""`draftheads data` through a real OpenAI-compatible server: llama-server, 4 slots, answering 4 requests at a time.

The server runs the embedded target's own weights (the dequantized SmolLM2-135M checkpoint the local backend loads,
converted to an f32 GGUF once per module), so greedy rows from the server and from the local backend differ only
where the two engines' kernels round differently. A server killed while requests are in flight fails the run in one
line; a restarted server finishes it, every prompt answered once.
"""

from __future__ import annotations

import json
import threading

import pytest

pytestmark = pytest.mark.slow

PROMPTS = ["Write a Python function that returns the sum of a list of numbers.",
           "Write a Python function that checks whether a word is a palindrome.",
           "Explain in two sentences what a hash table is.",
           "Write a Python function that counts the vowels in a string.",
           "What is the capital of France?",
           "Give three tips for writing clean code.",
           "Write a Python function that reverses a string.",
           "What does a compiler do?"]
MAX_NEW_TOKENS = 24


@pytest.fixture(scope="module")
def served(engine, tmp_path_factory):
    """(the target in fp32, its weights as an f32 GGUF, the prompts file, its greedy rows from the local backend)."""
    from draftheads import load_target
    from draftheads.core.targets import embedded_checkpoint
    from draftheads.data.datagen import run_data
    from draftheads.interop.gguf_targets import convert_to_gguf

    where = tmp_path_factory.mktemp("llama-server-data")
    prompts = where / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    # The embedded GGUF is Q4_1: llama.cpp multiplies its blocks with 8-bit quantized activations, another computation
    # than the dequantized fp32 weights; on these prompts one greedy answer differed from its first token on.
    gguf = convert_to_gguf(embedded_checkpoint("smollm2-135m"), where / "smollm2-135m-f32.gguf", "f32")
    target = load_target("smollm2-135m", dtype="fp32", device="cpu")
    local = rows(run_data(data_recipe(where / "local", prompts), target=target))
    return target, gguf, prompts, local


def data_recipe(out, prompts, **openai):
    from draftheads.recipe import load_recipe

    overrides = [f"data.output={out}", f"data.prompts=[{{source: {prompts}}}]", f"data.num_prompts={len(PROMPTS)}",
                 f"data.max_new_tokens={MAX_NEW_TOKENS}", "data.batch_size=8", "data.shard_size=4"]
    if openai:
        overrides += ["data.backend=openai", "data.concurrency=4", *(f"data.{k}={v}" for k, v in openai.items())]
    return load_recipe("demo-smollm2", overrides)


def rows(folder) -> dict[int, tuple[list[int], list[int]]]:
    import datasets

    data = datasets.load_from_disk(str(folder))[:]
    assert len(data["prompt_id"]) == len(set(data["prompt_id"]))  # one row per prompt: nothing repeated
    return {p: (ids, mask) for p, ids, mask in zip(data["prompt_id"], data["input_ids"], data["loss_mask"])}


def serve(engine, gguf, log):
    from draftheads.interop.llama_server import LlamaServer

    return LlamaServer(engine.server, gguf, [], log, threads=2, context=512, slots=4)


@pytest.fixture(scope="module")
def straight(engine, served, tmp_path_factory):
    """The rows of an uninterrupted run through llama-server."""
    from draftheads.data.datagen import run_data

    target, gguf, prompts, _ = served
    where = tmp_path_factory.mktemp("straight")
    with serve(engine, gguf, where / "server.log") as server:
        return rows(run_data(data_recipe(where / "data", prompts, openai_url=f"{server.url}/v1"), target=target))


def test_greedy_rows_from_llama_server_are_the_local_backends(served, straight):
    _, _, _, local = served
    remote = straight
    assert sorted(remote) == sorted(local) == list(range(len(PROMPTS)))
    agreed = {}  # prompt -> generated tokens equal before the first difference, for rows that differ
    for p, (ids, mask) in local.items():
        head = mask.index(1)
        other, other_mask = remote[p]
        assert other[:head] == ids[:head] and other_mask[:head] == [0] * head  # the server read the prompt we render
        assert other_mask[head:] == [1] * (len(other) - head)
        if other != ids:
            agreed[p] = next((i for i, (a, b) in enumerate(zip(ids[head:], other[head:])) if a != b),
                             min(len(ids), len(other)) - head)
    print(f"identical rows: {len(PROMPTS) - len(agreed)}/{len(PROMPTS)}; the others agree for {agreed} tokens")
    # llama.cpp's f32 kernels add in another order than torch's: where the two best next tokens are a near tie, the
    # last bit picks one or the other and the answers part there. Measured over runs: 7 or 8 of 8 identical; the
    # hash-table answer flips at its 23rd token with how the server happens to batch its 4 slots. The row ids are the
    # server's own (logprobs), not the text encoded again, which would split '\n\n' otherwise in another answer.
    assert len(agreed) <= 2 and all(n >= MAX_NEW_TOKENS // 2 for n in agreed.values())


def test_a_server_killed_mid_run_fails_in_one_line_and_a_restarted_one_resumes(engine, served, straight, tmp_path,
                                                                               monkeypatch):
    from draftheads.core.errors import DraftheadsError
    from draftheads.data import datastore, openai_backend
    from draftheads.data.datagen import run_data

    target, gguf, prompts, _ = served
    monkeypatch.setattr(openai_backend, "BACKOFF_SECONDS", 0.05)
    out = tmp_path / "data"
    server = serve(engine, gguf, tmp_path / "killed.log")
    posted, lock, post, kill_at = [], threading.Lock(), openai_backend.OpenAIBackend.post, [6]

    def post_then_kill(self, path, body):
        with lock:
            posted.append(path)
            if len(posted) == kill_at[0]:  # the second shard's second request; its first is in flight
                server.process.kill()
                server.process.wait()
        return post(self, path, body)

    monkeypatch.setattr(openai_backend.OpenAIBackend, "post", post_then_kill)
    server.start()
    try:
        with pytest.raises(DraftheadsError, match=r"failed 2 times .*rerun to resume") as err:
            run_data(data_recipe(out, prompts, openai_url=f"{server.url}/v1", max_retries=1), target=target)
    finally:
        server.stop()
    assert "\n" not in str(err.value)
    assert datastore.shard_done(out, 0) and not datastore.shard_done(out, 1)
    finished = rows(datastore.shard_path(out, 0))
    posted.clear()
    kill_at[0] = None
    with serve(engine, gguf, tmp_path / "restarted.log") as again:  # another port: the address is not in the hash
        resumed = rows(run_data(data_recipe(out, prompts, openai_url=f"{again.url}/v1"), target=target))
    assert sorted(resumed) == list(range(len(PROMPTS)))  # every prompt once, none lost, none twice
    assert len(posted) == len(PROMPTS) - len(finished)  # only the unfinished shard's prompts asked again
    assert all(resumed[p] == row for p, row in finished.items())
    # the rest as the run that was never stopped answered them, but for a near tie (see the test above)
    assert sum(resumed[p] == straight[p] for p in resumed) >= len(PROMPTS) - 2
