"""`draftheads data RECIPE`: prompts in, the frozen target's own responses out, as a `datasets` folder.

    run_data(recipe)                       # -> data/<name>/ (load_from_disk-able)
    run_data(recipe, target=(model, tok))  # tests pass a fixture target

The folder holds the dataset (input_ids, loss_mask, prompt_id), `prompts.jsonl`, and
`draftheads_data.json` (recipe hash, source and generation settings, summary). Work is
saved in shards of `data.shard_size` prompts, each written to a temp folder and renamed
when complete, so a run killed at any point resumes where it stopped and ends with the
rows an uninterrupted run gives. Under `accelerate launch`, process r answers shards
r, r+N, ... and the main process merges them. A finished folder whose recipe now asks for
more prompts grows: only the new prompts are answered (see datastore).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from accelerate import PartialState
from tqdm.auto import tqdm

from draftheads.core.config import check, doc
from draftheads.core.errors import DraftheadsError
from draftheads.core.writable import check_writable
from draftheads.data import datastore
from draftheads.data.batch_generate import LocalBackend
from draftheads.data.chat import show_mask, start_chat
from draftheads.data.hardware import check_cpu_launch
from draftheads.data.openai_backend import OpenAIBackend, load_tokenizer
from draftheads.data.prompt_source import PromptSource
from draftheads.data.prompts import collect_prompts, read_prompts, save_prompts
from draftheads.data.target import attach_chat_template, load_target

PROMPTS = "prompts.jsonl"
SECOND_ANSWER_TEMPERATURE = 0.8  # answers after a prompt's first, by default: inside the field's 0.7-1.0
SELF_PARTIAL = "self_prompts.partial.jsonl"


@dataclass
class DataConfig:
    """Target-generated training data (`draftheads data`)."""

    prompts: list[PromptSource] = doc([PromptSource()], "prompt sources, mixed by weight")
    output: str | None = doc(None, "dataset folder (default data/<name>)")
    num_prompts: int = doc(400, "total prompts to answer")
    mode: Literal["chat", "completion"] = doc(
        "chat", "'chat': prompts rendered with the target's chat template, its answers trained on; 'completion': for "
                "base models without one, each prompt as raw text (after BOS when the tokenizer adds one) that the "
                "target continues, every continuation token trained on; the turns of a multi-turn prompt joined "
                "into one text by blank lines. `draftheads eval` prompts drafters trained on this data the same way")
    system_prompt: str | None = doc(None, "system prompt for every conversation (completion mode: text before the "
                                          "prompt, after a blank line)")
    chat_template_kwargs: dict = doc({}, "variables for the chat template, e.g. {enable_thinking: false} (Qwen3); the "
                                         "same in data generation and in `draftheads eval` of drafters trained "
                                         "on this data")
    max_new_tokens: int = doc(256, "longest response per turn")
    max_length: int = doc(1024, "longest prompt+response in tokens")
    truncate: bool = doc(False, "truncate prompts longer than max_length instead of skipping them")
    temperature: float = doc(0.0, "0 = greedy")
    samples_per_prompt: int = doc(1, "answers the target gives each prompt (each its own training row, same prompt_id)")
    temperatures: list[float] | None = doc(None, "one sampling temperature per answer (default: data.temperature "
                                                 "for the first, 0.8 for the others)")
    top_p: float = doc(1.0, "nucleus sampling threshold")
    seed: int = doc(0, "sampling and mixing seed")
    batch_size: int = doc(16, "prompts generated together")
    shard_size: int = doc(256, "prompts per saved shard: the unit of resuming after a kill")
    backend: Literal["local", "openai"] = doc("local", "'local': this process runs the target; 'openai': an "
                                                       "OpenAI-compatible server")
    openai_url: str | None = doc(None, "base URL of the OpenAI-compatible server, e.g. http://host:8000/v1")
    openai_model: str | None = doc(None, "model name on that server (default target.name)")
    concurrency: int = doc(8, "openai backend: requests in flight")
    max_retries: int = doc(3, "openai backend: retries per request")
    reasoning: Literal["keep", "inline", "drop"] = doc(
        "keep", "openai backend: the thinking a server's reasoning parser returns apart (reasoning_content): 'keep' "
                "puts it where the target's chat template renders thinking (Qwen3: <think> before the answer; a "
                "template with no place for it is an error), 'inline' writes it in <think> tags before the answer, "
                "'drop' trains on the answer alone")

    def __post_init__(self):
        check(len(self.prompts) > 0, "data.prompts is empty; add at least one source, e.g. [{source: self}]")
        for name in ("num_prompts", "max_new_tokens", "max_length", "batch_size", "shard_size", "concurrency"):
            check(getattr(self, name) > 0, f"data.{name} must be positive, got {getattr(self, name)}")
        check(self.temperature >= 0, f"data.temperature must be >= 0, got {self.temperature}")
        check(self.samples_per_prompt >= 1, f"data.samples_per_prompt must be >= 1, got {self.samples_per_prompt}")
        check(self.temperatures is None or len(self.temperatures) == self.samples_per_prompt,
              f"data.temperatures lists {len(self.temperatures or [])} temperatures but data.samples_per_prompt is "
              f"{self.samples_per_prompt}; give one per answer")
        check(self.temperatures is None or min(self.temperatures) >= 0,
              f"data.temperatures must be >= 0, got {self.temperatures}")
        check(0 < self.top_p <= 1, f"data.top_p must be in (0, 1], got {self.top_p}")
        check(self.max_retries >= 0, "data.max_retries must be >= 0")
        check(self.backend != "openai" or bool(self.openai_url),
              "data.backend is 'openai' but data.openai_url is not set")
        check(self.reasoning in ("keep", "inline", "drop"),
              f"data.reasoning must be keep, inline or drop, got {self.reasoning!r}")
        if self.mode != "chat":
            self.check_completion()
        check(self.backend == "openai" or self.reasoning == "keep",
              f"data.reasoning={self.reasoning} applies to data.backend: openai; the local backend trains on the "
              "tokens the target generates, thinking included: remove data.reasoning, or set "
              "data.chat_template_kwargs={enable_thinking: false} for answers without thinking")

    def answer_temperatures(self) -> list[float]:
        """The temperature of each of a prompt's answers."""
        if self.temperatures is not None:
            return list(self.temperatures)
        return [self.temperature] + [SECOND_ANSWER_TEMPERATURE] * (self.samples_per_prompt - 1)

    def check_completion(self) -> None:
        """Completion mode: what needs a chat template (template variables, a chat server, prompts the target is
        asked to write by task kind) is refused in one line."""
        check(self.mode == "completion", f"data.mode must be chat or completion, got {self.mode!r}")
        check(not self.chat_template_kwargs, "data.chat_template_kwargs are variables of a chat template, which "
                                             "data.mode: completion does not use; remove them, or set data.mode: chat")
        check(self.backend == "local", "data.mode: completion runs on data.backend: local (an OpenAI-compatible "
                                       "server's chat endpoint applies its own template); set data.backend: local")
        check(all(src.kinds is None for src in self.prompts),
              "data.prompts: kinds have the target follow instructions through its chat template, which data.mode: "
              "completion does not use; drop kinds (a self source then writes the opening of a text), or give a "
              "prompt file")


@dataclasses.dataclass
class Processes:
    """This process's place among the data-generation processes (one, unless under accelerate launch)."""

    index: int = 0
    count: int = 1
    state: object = None

    @property
    def is_main(self) -> bool:
        return self.index == 0

    def wait(self) -> None:
        if self.state is not None:
            self.state.wait_for_everyone()


def processes(device: str = "auto") -> Processes:
    # Only touch accelerate's global state when launched distributed: tests and plain runs stay free of it.
    check_cpu_launch("data")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Processes()

    # accelerate sets up CPU-only process groups (gloo) only when asked for CPU explicitly
    state = PartialState(cpu=device == "cpu" or not torch.cuda.is_available())
    if state.num_processes != world:  # every process would answer every shard, racing on the same files
        raise DraftheadsError(f"launched with WORLD_SIZE={world} but accelerate sees {state.num_processes} "
                              "process(es); launch with accelerate launch (or torchrun) and a matching config")
    return Processes(state.process_index, state.num_processes, state)


def run_data(recipe, *, overwrite: bool = False, dry_run: bool = False, target=None) -> Path:
    """Generate the recipe's dataset into recipe.data_dir (or print 3 examples with dry_run)."""
    if dry_run:
        print_examples(recipe, target)
        return recipe.data_dir
    out, procs = recipe.data_dir, processes(recipe.target.device)
    plan = datastore.folder_plan(out, recipe, overwrite)  # refuses a folder it may not use, writing nothing
    if plan == "resume" and datastore.is_complete(out):
        if procs.is_main:
            datastore.print_summary(out)
        return out
    # a place it cannot write is refused now, not after the target has answered every prompt
    check_writable(out, "data.output", published=plan == "replace")
    # the target (and its chat template) must load before the folder is claimed for these settings
    backend, tokenizer = make_backend(recipe, target, procs)
    if procs.is_main:
        datastore.prepare_folder(out, recipe, plan)
    procs.wait()
    try:
        grown = datastore.read_meta(out).get("grown_from")  # set while a finished folder grows
        prompts, skipped = ensure_prompts(out, recipe.data, backend, procs, grown)
        kept = grown["prompts"] if grown else 0  # answered before the folder grew
        chats, plan_skips = plan_chats(prompts[kept:], tokenizer, recipe.data, first_id=kept)
        skipped.update(plan_skips)
        if not chats:
            reasons = "; ".join(f"{n} {r}" for r, n in skipped.items())
            raise DraftheadsError(f"no prompt left to answer ({reasons}); raise data.max_length or set "
                                  "data.truncate=true")
    except DraftheadsError:
        # a bad prompt source: remove the folder this run just created, if still bare
        if plan == "new" and procs.is_main:
            datastore.release_folder(out)
        raise
    shards = datastore.split_shards(chats, recipe.data.shard_size)
    generate_shards(out, shards, backend, recipe.data, procs)
    procs.wait()
    if procs.is_main:
        datastore.merge(out, len(shards), recipe, skipped, len(prompts), procs.count)
        datastore.print_summary(out)
    procs.wait()
    return out


def make_backend(recipe, target, procs: Processes):
    """(backend, tokenizer): the local target, or the OpenAI-compatible server with the target's tokenizer."""
    kwargs = recipe.data.chat_template_kwargs
    if recipe.data.backend == "openai":
        tokenizer = (with_template(target[1], recipe, kwargs) if target is not None
                     else load_tokenizer(recipe.target, kwargs))
        return OpenAIBackend(tokenizer, recipe.data, model=recipe.data.openai_model or recipe.target.name), tokenizer
    if target is None:
        t = recipe.target
        device = t.device
        if procs.count > 1 and device in ("auto", "cuda"):
            device = str(procs.state.device)  # one GPU per process
        target = load_target(t.name, dtype=t.dtype, device=device, revision=t.revision,
                             trust_remote_code=t.trust_remote_code,
                             chat_template=t.chat_template, attn_implementation=t.attn_implementation,
                             mode=recipe.data.mode)
    model, tokenizer = target
    tokenizer = with_template(tokenizer, recipe, kwargs)
    return LocalBackend(model, tokenizer, recipe.data), tokenizer


def with_template(tokenizer, recipe, kwargs: dict):
    """The tokenizer with the recipe's chat template and template variables (data.mode completion: the raw-text
    one): a copy, so a caller's tokenizer (the one evaluation or tests go on using) is left as it was."""
    tokenizer = copy.copy(tokenizer)
    attach_chat_template(tokenizer, recipe.target.chat_template, recipe.target.name, kwargs, recipe.data.mode)
    return tokenizer


def ensure_prompts(out: Path, data, backend, procs: Processes, grown: dict | None = None):
    """The run's prompts: read back from the folder, else collected (self prompts written) once by the main
    process. A growing folder (`grown`: its metadata's grown_from) keeps its prompts and collects only the
    new ones after them."""
    path = out / PROMPTS
    have = read_prompts(path) if grown and path.exists() else []
    if procs.is_main and (not path.exists() or (grown and len(have) == grown["prompts"])):
        partial = out / SELF_PARTIAL
        write, reply = resumable_writer(partial, backend.write, data.batch_size, backend.reply)
        more, skipped = collect_prompts(data, write=write, have=have, reply=reply)
        if grown:
            skipped.update(grown["prompt_skips"])
        datastore.update_meta(out, prompt_skips=dict(skipped))
        save_prompts(path, have + more)  # last: its length tells a resumed run that the new prompts are collected
        partial.unlink(missing_ok=True)
    procs.wait()
    skipped = collections.Counter(datastore.read_meta(out).get("prompt_skips", {}))
    return read_prompts(path), skipped


def resumable_writer(path: Path, write, chunk: int, reply=None):
    """Wrap a backend's `write(count, max_tokens, temperature, seed, lead)` (and `reply(messages, max_tokens,
    temperature, seed)`) so self prompts (and the passages of task kinds) are written in chunks, each with its own
    seed and appended to `path` once finished: a run killed while the target writes its prompts re-uses the finished
    chunks and ends with the same prompts. Returns the wrapped write, or (write, reply) when `reply` is given."""
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # the line a kill cut short
                continue
            done[tuple(record["key"])] = [tuple(t) for t in record["texts"]]

    def finished(key: tuple, make) -> list:
        if key not in done:
            done[key] = make()
            with path.open("a") as f:
                f.write(json.dumps({"key": list(key), "texts": done[key]}) + "\n")
        return done[key]

    def write_chunks(count: int, max_tokens: int, temperature: float, seed: int, lead: str = "") -> list:
        texts = []
        starts = range(0, count, chunk)
        for index, start in enumerate(tqdm(starts, desc="draftheads data: target writes prompts", unit="batch",
                                           mininterval=1.0)):
            n = min(chunk, count - start)
            texts.extend(finished((seed, count, index, lead),
                                  lambda: write(n, max_tokens, temperature, seed * 100_003 + index, lead)))
        return texts

    def reply_chunks(messages: list[str], max_tokens: int, temperature: float, seed: int) -> list:
        texts = []
        starts = range(0, len(messages), chunk)
        for index, start in enumerate(tqdm(starts, desc="draftheads data: target writes passages, questions, "
                                                        "translations", unit="batch", mininterval=1.0)):
            part = messages[start:start + chunk]
            digest = hashlib.sha256("\x00".join(part).encode()).hexdigest()[:16]
            texts.extend(finished(("reply", seed, index, max_tokens, digest),
                                  lambda: reply(part, max_tokens, temperature, seed * 100_003 + index)))
        return texts

    return write_chunks if reply is None else (write_chunks, reply_chunks)


def plan_chats(prompts, tokenizer, data, first_id: int = 0) -> tuple[list, collections.Counter]:
    """First-turn chats sorted by prompt length (less padding); prompts that cannot fit are counted out.
    Prompt ids count from `first_id` (the prompts a grown folder already answered come first)."""
    chats, skipped = [], collections.Counter()
    room = min(data.max_new_tokens, data.max_length // 2)
    temperatures = data.answer_temperatures()
    for i, prompt in enumerate(prompts, start=first_id):
        system = data.system_prompt if data.system_prompt is not None else prompt.system
        for sample, temperature in enumerate(temperatures):  # data.samples_per_prompt answers, each its own chat
            chat = start_chat(tokenizer, i, prompt.turns, system, data.max_length, data.truncate, room)
            chat.sample, chat.temperature = sample, temperature
            if not chat.stopped:
                chats.append(chat)
            elif sample == 0:  # skips count prompts
                skipped[chat.stopped] += 1
    chats.sort(key=lambda c: (len(c.input_ids), c.prompt_id, c.sample))
    return chats, skipped


def generate_shards(out: Path, shards: list[list], backend, data, procs: Processes) -> None:
    """Answer and save every shard of this process that is not on disk yet."""
    mine = [i for i in range(len(shards)) if i % procs.count == procs.index and not datastore.shard_done(out, i)]
    total = sum(len(shards[i]) for i in mine)
    bar = tqdm(total=total, unit="prompt", desc="draftheads data", disable=not procs.is_main or total == 0,
               mininterval=1.0)
    done_tokens, started = 0, time.perf_counter()

    def on_batch(group, tokens):
        nonlocal done_tokens
        done_tokens += tokens
        bar.update(sum(1 for c in group if c.done))
        bar.set_postfix(tok_s=f"{done_tokens / max(time.perf_counter() - started, 1e-9):.0f}", refresh=False)

    with bar:
        for i in mine:
            t0 = time.perf_counter()
            # Seeded per shard, so a resumed run draws exactly what the uninterrupted run drew.
            backend.answer(shards[i], seed=data.seed * 1_000_003 + i, on_batch=on_batch)
            datastore.write_shard(out, i, shards[i], seconds=time.perf_counter() - t0)


def print_examples(recipe, target, count: int = 3) -> None:
    """Dry run: answer `count` prompts and print them with the untrained tokens in [brackets]."""
    data = dataclasses.replace(recipe.data, num_prompts=count)
    backend, tokenizer = make_backend(recipe, target, Processes())
    prompts, _ = collect_prompts(data, write=backend.write, reply=backend.reply)
    chats, skipped = plan_chats(prompts, tokenizer, data)
    backend.answer(chats, seed=data.seed)
    print(f"dry run: {len(chats)} example(s) from {recipe.name}; tokens NOT trained on are in [brackets]")
    for chat in sorted(chats, key=lambda c: c.prompt_id):
        trained = sum(chat.loss_mask)
        print(f"\n--- example {chat.prompt_id}: {len(chat.input_ids)} tokens, {trained} trained ---")
        print(show_mask(tokenizer, chat.input_ids, chat.loss_mask))
    for reason, n in skipped.items():
        print(f"(skipped {n}: {reason})")
