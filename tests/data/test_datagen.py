"""`draftheads data`: batched generation, rows and masks, resume after a kill, folder identity, bad inputs."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from draftheads.core.errors import DraftheadsError
from draftheads.data import batch_generate, datagen, datastore
from draftheads.data.batch_generate import generate_batch
from draftheads.data.chat import render_ids, stop_token_ids
from draftheads.recipe import recipe_from_dict
from tests.fixtures import make_base_tokenizer, make_target, make_tokenizer

REPO = Path(__file__).resolve().parents[2]
USERS = ["Write a function that adds two numbers", "Hello! How can I help you today?", "def add(a, b):",
         "The quick brown fox jumps over the lazy dog.", "import numpy as np", "for i in range(10):",
         "Speculative decoding drafts tokens cheaply", "class Stack:", "Write a function that returns the sum"]


@pytest.fixture(scope="module")
def target():
    tok = make_tokenizer("chatml")
    return make_target("llama", tok), tok


def prompt_file(tmp_path, rows=None):
    path = tmp_path / "prompts.jsonl"
    rows = rows or [{"turns": [u, "Now explain it."]} if i % 3 == 0 else {"prompt": u} for i, u in enumerate(USERS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def make_recipe(out, source, **data):
    settings = dict(prompts=[{"source": str(source)}], num_prompts=9, max_new_tokens=10, max_length=64,
                    batch_size=3, shard_size=4, output=str(out))
    settings.update(data)
    return recipe_from_dict({"name": "test", "head": {"type": "medusa"}, "data": settings})


def load(out):
    import datasets

    return datasets.load_from_disk(str(out))[:]


def stopping_at(model, tok, prompts, steps=12):
    """A stop token that some rows emit early and others never: exercises per-row stops and pruning."""
    free = generate_batch(model, prompts, max_new_tokens=steps, stop_ids=[], pad_id=tok.pad_token_id)
    firsts = {}
    for out in free:
        for pos, token in enumerate(out.tokens):
            firsts.setdefault(token, []).append(pos) if token not in out.tokens[:pos] else None
    best = max(firsts, key=lambda t: (len(firsts[t]) < len(prompts), len(set(firsts[t])), len(firsts[t])))
    return free, best


# ------------------------------------------------------------------ batched generation


def assert_greedy(model, prompt, tokens):
    """Every generated token is the argmax of one plain, unpadded, cache-free forward (ties within 1e-4)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1: len(prompt) + len(tokens) - 1]
    chosen = logits.gather(-1, torch.tensor(tokens)[:, None])[:, 0]
    assert torch.all(chosen >= logits.max(-1).values - 1e-4 * logits.abs().max()), (tokens, logits.argmax(-1).tolist())


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "qwen3"])
def test_batched_greedy_equals_one_by_one_and_plain_decoding(family):
    tok = make_tokenizer("chatml")
    model = make_target(family, tok)
    prompts = [render_ids(tok, [{"role": "user", "content": u}], True) for u in USERS[:5]]
    free, stop = stopping_at(model, tok, prompts)
    batch = generate_batch(model, prompts, max_new_tokens=12, stop_ids=[stop], pad_id=tok.pad_token_id)
    for prompt, out, full in zip(prompts, batch, free):
        alone = generate_batch(model, [prompt], max_new_tokens=12, stop_ids=[stop], pad_id=tok.pad_token_id)[0]
        expected = full.tokens[: full.tokens.index(stop) + 1] if stop in full.tokens else full.tokens
        assert out.tokens == alone.tokens == expected and out.finished == (stop in full.tokens)
        assert_greedy(model, prompt, full.tokens)
    assert len({len(o.tokens) for o in batch}) > 1  # rows really stopped at different steps


def test_per_row_budgets(target):
    model, tok = target
    prompts = [render_ids(tok, [{"role": "user", "content": u}], True) for u in USERS[:3]]
    outs = generate_batch(model, prompts, max_new_tokens=[2, 0, 5], stop_ids=[], pad_id=tok.pad_token_id)
    assert [len(o.tokens) for o in outs] == [2, 0, 5] and not any(o.finished for o in outs)


def test_sampling_is_seeded_and_top_p_near_zero_is_greedy(target):
    model, tok = target
    prompts = [render_ids(tok, [{"role": "user", "content": u}], True) for u in USERS[:4]]
    kw = dict(max_new_tokens=8, stop_ids=[], pad_id=tok.pad_token_id)
    draw = lambda seed, **k: [o.tokens for o in generate_batch(
        model, prompts, generator=torch.Generator().manual_seed(seed), **kw, **k)]
    assert draw(1, temperature=1.5) == draw(1, temperature=1.5)
    assert draw(1, temperature=1.5) != draw(2, temperature=1.5)
    greedy = [o.tokens for o in generate_batch(model, prompts, **kw)]
    assert draw(3, temperature=1.0, top_p=1e-6) == greedy


# ------------------------------------------------------------------ the dataset


def test_rows_are_the_targets_own_answers(tmp_path, target, capsys):
    model, tok = target
    recipe = make_recipe(tmp_path / "out", prompt_file(tmp_path), max_new_tokens=6)
    out = datagen.run_data(recipe, target=target)
    rows = load(out)
    prompts = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    assert rows["prompt_id"] == sorted(rows["prompt_id"]) and len(rows["prompt_id"]) == 9
    stops = stop_token_ids(tok)
    for ids, mask, pid in zip(rows["input_ids"], rows["loss_mask"], rows["prompt_id"]):
        head = render_ids(tok, [{"role": "user", "content": prompts[pid]["turns"][0]}], True)
        assert ids[: len(head)] == head and mask[: len(head)] == [0] * len(head)
        reply = generate_batch(model, [head], max_new_tokens=6, stop_ids=stops, pad_id=tok.pad_token_id)[0].tokens
        assert (ids[len(head): len(head) + len(reply)] == reply
                and mask[len(head): len(head) + len(reply)] == [1] * len(reply))
    meta = json.loads((out / "draftheads_data.json").read_text())
    assert meta["complete"] and meta["recipe_hash"] == datastore.recipe_hash(recipe)
    assert meta["data"]["max_new_tokens"] == 6 and meta["summary"]["rows"] == 9
    assert meta["summary"]["generated_tokens"] == sum(map(sum, rows["loss_mask"]))
    printed = capsys.readouterr().out
    assert "9 rows" in printed and "tokens/s" in printed and "mean response" in printed
    assert not (out / "shards").exists()


def test_multi_turn_rows_replay_each_turn(tmp_path):
    """The target answers turn 2 after its own turn-1 answer; the mask has two trained spans."""
    tok = make_tokenizer("chatml")
    model = make_target("llama", tok)
    prompts = [render_ids(tok, [{"role": "user", "content": u}], True) for u in USERS]
    free, stop = stopping_at(model, tok, prompts, steps=10)
    # a random model never says <|im_end|>; make a token it does say end turns
    model.generation_config.eos_token_id = [stop]
    stops = set(stop_token_ids(tok, model.generation_config))
    finishing = [u for u, f in zip(USERS, free) if stop in f.tokens][:2]
    rows = [{"turns": [u, "Now explain it."]} for u in finishing]
    out = datagen.run_data(make_recipe(tmp_path / "o", prompt_file(tmp_path, rows), num_prompts=2, max_new_tokens=10,
                                       max_length=128), target=(model, tok))
    data = load(out)
    assert len(data["input_ids"]) == 2
    for ids, mask in zip(data["input_ids"], data["loss_mask"]):
        spans = [i for i in range(1, len(mask)) if mask[i] == 1 and mask[i - 1] == 0]
        assert len(spans) == 2
        first_end = next(i for i in range(spans[0], len(mask)) if mask[i] == 0)
        assert ids[first_end - 1] == stop
        assert (tok.decode(ids[first_end: spans[1]])
                == "\n<|im_start|>user\nNow explain it.<|im_end|>\n<|im_start|>assistant\n")
        again = generate_batch(model, [ids[: spans[1]]], max_new_tokens=10, stop_ids=stops, pad_id=tok.pad_token_id)
        assert ids[spans[1]:] == again[0].tokens


def test_resume_after_interrupt_between_and_within_shards(tmp_path, target, monkeypatch):
    source = prompt_file(tmp_path)
    reference = load(datagen.run_data(make_recipe(tmp_path / "ref", source, temperature=0.8, top_p=0.9), target=target))

    recipe = make_recipe(tmp_path / "out", source, temperature=0.8, top_p=0.9)
    real_write = datastore.write_shard
    calls = {"n": 0}

    def write_then_die(*args, **kw):
        real_write(*args, **kw)
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt  # killed between shards

    monkeypatch.setattr(datastore, "write_shard", write_then_die)
    with pytest.raises(KeyboardInterrupt):
        datagen.run_data(recipe, target=target)
    assert len(list((tmp_path / "out" / "shards").glob("shard_*"))) == 1

    real_generate = batch_generate.generate_batch
    batches = {"n": 0}

    def generate_then_die(*args, **kw):
        batches["n"] += 1
        if batches["n"] == 2:
            raise KeyboardInterrupt  # killed mid-shard, after one batch of it
        return real_generate(*args, **kw)

    monkeypatch.setattr(datastore, "write_shard", real_write)
    monkeypatch.setattr(batch_generate, "generate_batch", generate_then_die)
    with pytest.raises(KeyboardInterrupt):
        datagen.run_data(recipe, target=target)
    monkeypatch.setattr(batch_generate, "generate_batch", real_generate)
    assert load(datagen.run_data(recipe, target=target)) == reference


def test_half_written_shard_is_discarded(tmp_path, target, monkeypatch):
    source = prompt_file(tmp_path)
    reference = load(datagen.run_data(make_recipe(tmp_path / "ref", source), target=target))
    recipe = make_recipe(tmp_path / "out", source)

    real_replace = os.replace

    def die_before_rename(src, dst):
        if Path(src).name.startswith(".tmp-shard"):
            raise KeyboardInterrupt  # the shard's files are written but it was never renamed into place
        real_replace(src, dst)

    monkeypatch.setattr(datastore.os, "replace", die_before_rename)
    with pytest.raises(KeyboardInterrupt):
        datagen.run_data(recipe, target=target)
    monkeypatch.undo()
    assert (list((tmp_path / "out" / "shards").glob(".tmp-*"))
            and not list((tmp_path / "out" / "shards").glob("shard_*")))
    assert load(datagen.run_data(recipe, target=target)) == reference
    assert not (tmp_path / "out" / "shards").exists()


KILL_SCRIPT = """
import sys, time, torch
torch.set_num_threads(1)
from draftheads.recipe import recipe_from_dict
from draftheads.data import datagen, datastore
write = datastore.write_shard
datastore.write_shard = lambda *a, **k: (write(*a, **k), time.sleep(0.5))  # a window to kill it in, on any machine
from tests.fixtures import make_base_tokenizer, make_target, make_tokenizer
tok = make_tokenizer("chatml")
recipe = recipe_from_dict({"name": "k", "head": {"type": "medusa"}, "data": dict(
    prompts=[{"source": sys.argv[1]}], num_prompts=9, max_new_tokens=40, max_length=96, batch_size=1, shard_size=2,
    output=sys.argv[2])})
datagen.run_data(recipe, target=(make_target("llama", tok), tok))
"""


def test_killed_process_resumes_to_the_same_rows(tmp_path, target):
    """SIGKILL a real run once a shard is on disk; the rerun finishes with the uninterrupted rows."""
    source, out = prompt_file(tmp_path), tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(source), str(out)], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not list((out / "shards").glob("shard_*")) and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = sorted(p.name for p in (out / "shards").glob("shard_*"))
    assert 1 <= len(done) < 5 and not datastore.is_complete(out)
    recipe = make_recipe(out, source, max_new_tokens=40, max_length=96, batch_size=1, shard_size=2)
    resumed = load(datagen.run_data(recipe, target=target))
    recipe = make_recipe(tmp_path / "ref", source, max_new_tokens=40, max_length=96, batch_size=1, shard_size=2)
    assert resumed == load(datagen.run_data(recipe, target=target))


def test_split_across_processes_then_merged(tmp_path, target):
    """Two processes answer alternate shards; the merged rows equal one process doing all of them."""
    source = prompt_file(tmp_path)
    reference = load(datagen.run_data(make_recipe(tmp_path / "ref", source), target=target))
    recipe = make_recipe(tmp_path / "out", source)
    datastore.prepare_folder(recipe.data_dir, recipe, datastore.folder_plan(recipe.data_dir, recipe, overwrite=False))
    backend, tok = datagen.make_backend(recipe, target, datagen.Processes())
    for index in (0, 1):  # the main process writes prompts.jsonl; the other reads it
        procs = datagen.Processes(index=index, count=2)
        prompts, skipped = datagen.ensure_prompts(recipe.data_dir, recipe.data, backend, procs)
        chats, _ = datagen.plan_chats(prompts, tok, recipe.data)
        shards = datastore.split_shards(chats, recipe.data.shard_size)
        datagen.generate_shards(recipe.data_dir, shards, backend, recipe.data, procs)
        assert ([datastore.shard_done(recipe.data_dir, i) for i in range(len(shards))]
                == [i % 2 <= index for i in range(len(shards))])
    datastore.merge(recipe.data_dir, len(shards), recipe, skipped, len(prompts))
    assert load(recipe.data_dir) == reference


# ------------------------------------------------------------------ the output folder


def test_complete_folder_is_reused_and_overwrite_starts_again(tmp_path, target, monkeypatch):
    recipe = make_recipe(tmp_path / "out", prompt_file(tmp_path))
    first = load(datagen.run_data(recipe, target=target))
    monkeypatch.setattr(datagen, "make_backend", lambda *a: pytest.fail("a complete folder must not generate again"))
    assert load(datagen.run_data(recipe, target=target)) == first
    monkeypatch.undo()
    (recipe.data_dir / "marker").write_text("x")
    assert load(datagen.run_data(recipe, target=target, overwrite=True)) == first
    assert not (recipe.data_dir / "marker").exists()


def test_folder_of_another_recipe_is_refused_unless_overwrite(tmp_path, target):
    source = prompt_file(tmp_path)
    datagen.run_data(make_recipe(tmp_path / "out", source), target=target)
    changed = make_recipe(tmp_path / "out", source, max_new_tokens=5)
    with pytest.raises(DraftheadsError, match="different recipe.*--overwrite"):
        datagen.run_data(changed, target=target)
    rows = load(datagen.run_data(changed, target=target, overwrite=True))
    assert max(map(sum, rows["loss_mask"])) <= 5 * 2
    same_rows = make_recipe(tmp_path / "out", source, max_new_tokens=5, batch_size=2)  # batch size changes no row
    assert datastore.recipe_hash(same_rows) == datastore.recipe_hash(changed)


def test_raising_num_prompts_grows_the_folder_and_keeps_its_rows(tmp_path, target, monkeypatch):
    source = prompt_file(tmp_path)
    small = make_recipe(tmp_path / "out", source, num_prompts=5)
    before = load(datagen.run_data(small, target=target))
    features = small.data_dir / "features"
    for name, manifest in [("unfinished", None), ("undigested", {"shards": 1}), ("digested", {"shard_digests": ["x"]})]:
        (features / name).mkdir(parents=True)
        if manifest:
            (features / name / "manifest.json").write_text(json.dumps(manifest))
    old_meta = datastore.read_meta(small.data_dir)

    big = make_recipe(tmp_path / "out", source, num_prompts=9)
    real_write = datastore.write_shard

    def die_after_first_new_shard(*args, **kw):
        real_write(*args, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(datastore, "write_shard", die_after_first_new_shard)
    with pytest.raises(KeyboardInterrupt):
        datagen.run_data(big, target=target)
    monkeypatch.undo()
    # only a complete cache with shard digests can lend the kept rows' shards to the next one
    assert sorted(p.name for p in features.iterdir()) == ["digested"] and (small.data_dir / "shards" / "base").is_dir()
    after = load(datagen.run_data(big, target=target))

    prompts = [json.loads(line)["turns"] for line in (small.data_dir / "prompts.jsonl").read_text().splitlines()]
    assert len(prompts) == 9 and len({json.dumps(t) for t in prompts}) == 9  # the 4 new prompts repeat none of the 5
    kept = [i for i, pid in enumerate(after["prompt_id"]) if pid < 5]
    assert {k: [after[k][i] for i in kept] for k in after} == before  # the rows it had, unchanged and first
    assert sorted(after["prompt_id"]) == after["prompt_id"] and len(after["prompt_id"]) == 9
    meta = datastore.read_meta(small.data_dir)
    assert meta["complete"] and meta["recipe_hash"] == datastore.recipe_hash(big) and meta["summary"]["prompts"] == 9
    assert meta["summary"]["rows"] == 9 and meta["summary"]["generated_tokens"] == sum(map(sum, after["loss_mask"]))
    assert meta["summary"]["generation_seconds"] > old_meta["summary"]["generation_seconds"]
    assert [(g["from"], g["to"]) for g in meta["grown"]] == [(5, 9)]
    assert not (small.data_dir / "shards").exists()

    with pytest.raises(DraftheadsError, match="different recipe.*--overwrite"):  # fewer prompts cannot be grown into
        datagen.run_data(make_recipe(tmp_path / "out", source, num_prompts=3), target=target)


def test_growing_self_prompts_writes_new_ones(tmp_path, target, monkeypatch):
    from draftheads.data import self_prompts as prompts_mod

    monkeypatch.setattr(prompts_mod, "check_self_prompt", lambda text, finished: None if text.strip() else "empty")
    recipe = make_recipe(tmp_path / "out", "self", num_prompts=3)
    recipe.data.prompts[0].max_tokens = 6
    datagen.run_data(recipe, target=target)
    recipe.data.num_prompts = 6
    out = datagen.run_data(recipe, target=target)
    written = [json.loads(line)["turns"][0] for line in (out / "prompts.jsonl").read_text().splitlines()]
    assert len(written) == 6 and len({prompts_mod.normalise(t) for t in written}) == 6


def test_foreign_folder_is_refused_even_with_overwrite(tmp_path, target):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    for overwrite in (False, True):
        with pytest.raises(DraftheadsError, match="not written by draftheads data"):
            datagen.run_data(make_recipe(out, prompt_file(tmp_path)), target=target, overwrite=overwrite)
    assert (out / "thesis.tex").exists()


# ------------------------------------------------------------------ bad inputs


def test_too_long_prompts_are_skipped_and_counted(tmp_path, target, capsys):
    rows = [{"prompt": "Write a function that returns the sum of a list of numbers. " * 12},
            {"prompt": "def add(a, b):"}]
    out = datagen.run_data(make_recipe(tmp_path / "out", prompt_file(tmp_path, rows), num_prompts=2), target=target)
    assert len(load(out)["prompt_id"]) == 1
    assert (json.loads((out / "draftheads_data.json").read_text())["summary"]["dropped"]
            ["prompt longer than max_length"] == 1)
    assert "1 prompt longer than max_length" in capsys.readouterr().out


def test_too_long_prompts_are_truncated_when_asked(tmp_path, target):
    rows = [{"prompt": "Write a function that returns the sum of a list of numbers. " * 12}]
    out = datagen.run_data(make_recipe(tmp_path / "out", prompt_file(tmp_path, rows), num_prompts=1, truncate=True),
                           target=target)
    ids = load(out)["input_ids"][0]
    assert len(ids) <= 64
    assert (json.loads((out / "draftheads_data.json").read_text())["summary"]["dropped"]
            ["prompts truncated to fit max_length (kept)"] == 1)


def test_rows_without_user_turn_are_counted(tmp_path, target):
    rows = [{"messages": [{"role": "assistant", "content": "hi"}]},
            {"messages": [{"role": "user", "content": "Hello there"}]}]
    out = datagen.run_data(make_recipe(tmp_path / "out", prompt_file(tmp_path, rows), num_prompts=2), target=target)
    dropped = json.loads((out / "draftheads_data.json").read_text())["summary"]["dropped"]
    assert dropped == ({f"{tmp_path / 'prompts.jsonl'}: row with no user turn": 1}
                       | {k: v for k, v in dropped.items() if "cut" in k})
    assert len(load(out)["prompt_id"]) == 1


@pytest.mark.parametrize("rows,match", [([], "is empty"),
                                        ([{"question": "q", "answer": "a"}], "cannot tell the chat format")])
def test_bad_sources_fail_before_generating(tmp_path, target, rows, match):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DraftheadsError, match=match):
        datagen.run_data(make_recipe(tmp_path / "out", path), target=target)


def test_tokenizer_without_chat_template_is_refused(tmp_path, target):
    model, _ = target
    bare = make_tokenizer("chatml")
    bare.chat_template = None
    with pytest.raises(DraftheadsError, match="no chat template; set target.chat_template .*or data.mode: completion"):
        datagen.run_data(make_recipe(tmp_path / "out", prompt_file(tmp_path)), target=(model, bare))
    assert not (tmp_path / "out").exists()


def test_completion_rows_are_the_raw_prompt_then_every_token_the_target_continued_it_with(tmp_path):
    """A base model (no chat template): each row is the prompt as the tokenizer encodes it (BOS first), untrained,
    then the target's continuation, every token of it trained; the folder records the mode."""
    tok = make_base_tokenizer()
    model = make_target("llama", tok)
    rows = [{"prompt": u} for u in USERS[:4]]
    recipe = make_recipe(tmp_path / "out", prompt_file(tmp_path, rows), num_prompts=4, max_new_tokens=6,
                         mode="completion")
    out = datagen.run_data(recipe, target=(model, tok))
    data, stops = load(out), [tok.eos_token_id]   # a base model ends a text with EOS alone
    assert tok.chat_template is None and len(data["input_ids"]) == 4   # the caller's tokenizer is left as it was
    prompts = [json.loads(line)["turns"][0] for line in (out / "prompts.jsonl").read_text().splitlines()]
    for ids, mask, pid in zip(data["input_ids"], data["loss_mask"], data["prompt_id"]):
        head = tok(prompts[pid])["input_ids"]
        reply = generate_batch(model, [head], max_new_tokens=6, stop_ids=stops, pad_id=tok.pad_token_id)[0].tokens
        assert head[0] == tok.bos_token_id and ids == head + reply and mask == [0] * len(head) + [1] * len(reply)
    assert datastore.recorded_mode(out) == "completion" and datastore.read_meta(out)["data"]["mode"] == "completion"
    with pytest.raises(DraftheadsError, match="generated with data.mode: completion but the recipe says chat; set "
                                              "data.mode=completion"):
        datastore.check_mode(out, "chat")


def test_chat_mode_keeps_the_identity_of_folders_written_before_data_mode():
    target, data = {"name": "t"}, {"num_prompts": 4, "max_length": 64}
    assert datastore.settings_hash(target, {**data, "mode": "chat"}) == datastore.settings_hash(target, data)
    assert datastore.settings_hash(target, {**data, "mode": "completion"}) != datastore.settings_hash(target, data)


@pytest.mark.parametrize("data,match", [
    ({"chat_template_kwargs": {"enable_thinking": False}}, "chat_template_kwargs are variables of a chat template"),
    ({"backend": "openai", "openai_url": "http://localhost:1/v1"}, "runs on data.backend: local"),
    ({"prompts": [{"source": "self", "kinds": "general"}]}, "kinds have the target follow instructions"),
])
def test_completion_mode_refuses_what_needs_a_chat_template(tmp_path, data, match):
    with pytest.raises(DraftheadsError, match=match):
        make_recipe(tmp_path / "out", "self", mode="completion", **data)


def test_every_prompt_too_long_is_an_error(tmp_path, target):
    rows = [{"prompt": "Write a function that returns the sum of a list of numbers. " * 12}]
    with pytest.raises(DraftheadsError, match="no prompt left to answer.*max_length"):
        datagen.run_data(make_recipe(tmp_path / "out", prompt_file(tmp_path, rows), num_prompts=1), target=target)


# ------------------------------------------------------------------ dry run and self prompts


def test_dry_run_prints_three_bracketed_examples_and_writes_nothing(tmp_path, target, capsys):
    recipe = make_recipe(tmp_path / "out", prompt_file(tmp_path))
    datagen.run_data(recipe, target=target, dry_run=True)
    printed = capsys.readouterr().out
    assert (printed.count("--- example") == 3 and "[<|im_start|>user\n" in printed
            and "<|im_start|>assistant\n]" in printed)
    assert not recipe.data_dir.exists()


def test_self_prompts_end_to_end(tmp_path, target, monkeypatch):
    """With the 'self' source the target writes the prompts (stubbed filter: a random model writes noise)."""
    from draftheads.data import self_prompts as prompts_mod

    monkeypatch.setattr(prompts_mod, "check_self_prompt", lambda text, finished: None if text.strip() else "empty")
    recipe = make_recipe(tmp_path / "out", "self", num_prompts=5)
    recipe.data.prompts[0].max_tokens = 6
    out = datagen.run_data(recipe, target=target)
    written = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    assert len(written) == 5 and all(p["source"] == "self" for p in written)
    assert len({p["turns"][0] for p in written}) == 5 and len(load(out)["prompt_id"]) <= 5


def test_self_prompts_in_completion_mode_are_texts_the_target_began_after_bos(tmp_path, monkeypatch):
    from draftheads.data import self_prompts as prompts_mod

    monkeypatch.setattr(prompts_mod, "check_self_prompt", lambda text, finished: None if text.strip() else "empty")
    tok = make_base_tokenizer()
    recipe = make_recipe(tmp_path / "out", "self", num_prompts=3, mode="completion")
    recipe.data.prompts[0].max_tokens = 6
    out = datagen.run_data(recipe, target=(make_target("llama", tok), tok))
    written = [json.loads(line)["turns"][0] for line in (out / "prompts.jsonl").read_text().splitlines()]
    rows = load(out)
    assert len(set(written)) == 3 and len(rows["input_ids"]) == 3
    assert all(ids[0] == tok.bos_token_id and tok.decode(ids[1:mask.index(1)]) == written[pid]
               for ids, mask, pid in zip(rows["input_ids"], rows["loss_mask"], rows["prompt_id"]))


def test_self_prompt_writing_resumes_from_finished_chunks(tmp_path):
    from draftheads.data.datagen import resumable_writer

    calls = []

    def write(count, max_tokens, temperature, seed, lead):
        calls.append(seed)
        return [(f"prompt {seed} {i}", True) for i in range(count)]

    full = resumable_writer(tmp_path / "straight.jsonl", write, 4)(10, 16, 1.0, 3)
    assert len(full) == 10 and len(set(full)) == 10

    class Killed(Exception):
        pass

    def dies_on_third_chunk(count, max_tokens, temperature, seed, lead):
        if len(calls) == 5:  # 3 straight calls + 2 finished chunks of this run
            raise Killed
        return write(count, max_tokens, temperature, seed, lead)

    partial = tmp_path / "partial.jsonl"
    with pytest.raises(Killed):
        resumable_writer(partial, dies_on_third_chunk, 4)(10, 16, 1.0, 3)
    partial.write_text(partial.read_text() + '{"key": [3, 10')  # a line the kill cut short
    calls.clear()
    assert resumable_writer(partial, write, 4)(10, 16, 1.0, 3) == full
    assert len(calls) == 1  # only the unfinished chunk is written again


def test_several_answers_per_prompt_one_greedy_one_sampled(tmp_path, target):
    """data.samples_per_prompt 2 at temperatures [0, 1]: every prompt gets two rows under its prompt_id; the greedy
    one is the row a one-answer run writes, the sampled one differs from it somewhere; a second run writes the same
    rows (each shard is seeded, which resuming relies on)."""
    rows = [{"prompt": u} for u in USERS]  # single-turn: one row per answer
    source = prompt_file(tmp_path, rows)
    single = load(datagen.run_data(make_recipe(tmp_path / "one", source), target=target))
    recipe = make_recipe(tmp_path / "two", source, samples_per_prompt=2, temperatures=[0.0, 1.0])
    double = load(datagen.run_data(recipe, target=target))
    assert double["prompt_id"] == [pid for pid in single["prompt_id"] for _ in range(2)]
    greedy = [ids for i, ids in enumerate(double["input_ids"]) if i % 2 == 0]
    sampled = [ids for i, ids in enumerate(double["input_ids"]) if i % 2 == 1]
    assert greedy == single["input_ids"] and sampled != greedy
    again = load(datagen.run_data(make_recipe(tmp_path / "again", source, samples_per_prompt=2,
                                              temperatures=[0.0, 1.0]), target=target))
    assert again == double


def test_one_temperature_per_answer_is_required():
    with pytest.raises(DraftheadsError, match="lists 1 temperatures but data.samples_per_prompt is 3"):
        make_recipe("out", "p.jsonl", samples_per_prompt=3, temperatures=[0.7])
