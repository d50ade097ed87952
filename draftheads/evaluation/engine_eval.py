"""`draftheads engine eval llama.cpp DRAFTER`: EAGLE-3, DSpark, DFlash and native MTP drafters inside llama.cpp, beside
the engine's own decoding.

    folder = run_engine_eval(["runs/eagle3-smollm2"], EngineEvalConfig(limit=10, draft_tokens=[2, 3, 4]))

Each EAGLE-3 drafter is exported to GGUF (interop/llama_cpp.py), each DSpark and DFlash drafter converted to GGUF by
llama.cpp's converter (interop/llama_cpp_block.py, run with `draft-dspark` / `draft-dflash`), and paired with the target
GGUF; a native MTP
drafter (head.type native) is put back into a copy of its checkpoint and the whole of it converted by llama.cpp's
converter, its MTP layer riding in the target's GGUF, run with `draft-mtp`. One llama-server per
configuration runs at once on the loopback: plain greedy decoding, llama.cpp's n-gram speculation modes (each at
llama.cpp's own settings and at short ones), and every drafter under `draft-eagle3` at every draft length, alone and
with an n-gram mode beside it (llama.cpp mixes a drafter with one draftless mode). Every conversation is decoded by
every configuration back to back, the order reversed from one conversation to the next, so the speedups are ratios
of runs made side by side. Times are the engine's own, prompt processing included (as our loop's tokens/s);
drafted and accepted counts are the engine's.

Beside each drafter row stands our own loop's tau for the same drafter drafting a chain of the same length on the
same prompts (greedy, the target in `dtype`), to compare with the engine's tokens per target pass. Greedy
speculative outputs must equal llama.cpp's plain greedy outputs; the report counts the conversations that differ.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from draftheads.core.errors import DraftheadsError
from draftheads.core.target_dims import context_limit
from draftheads.core.tree import Tree
from draftheads.data.chat import add_reply, stop_token_ids
from draftheads.data.hardware import environment
from draftheads.decoding.settings import DecodeSettings
from draftheads.decoding.stats import GenerationStats
from draftheads.evaluation.engine_report import (
    engine_rows,
    format_engine_markdown,
    format_engine_table,
    write_engine_plots,
)
from draftheads.evaluation.eval_config import EngineEvalConfig
from draftheads.evaluation.report import now, write_report
from draftheads.evaluation.report_folder import check_report_folder, report_folder
from draftheads.evaluation.saved_runs import load_eval_target
from draftheads.interop.export import export_drafter
from draftheads.interop.gguf_targets import convert_to_gguf
from draftheads.interop.llama_cpp import DRAFTER_FILE
from draftheads.interop.llama_cpp_build import install_llama_cpp
from draftheads.interop.llama_server import LlamaServer, Reply
from draftheads.interop.native import read_config, read_export_record, resolve_drafter_folder
from draftheads.measurement.conversations import Conversation, EvalSettings, first_chat, load_conversations
from draftheads.measurement.drafter_specs import learned_paths
from draftheads.measurement.entries import drafter_name, learned_entry
from draftheads.measurement.measure import RunConfig, generate_conversations

# llama.cpp's n-gram modes at its own settings (long keys and drafts, tuned for rewriting code) and at short ones
# (a 3-token key, 6 drafted tokens: what a 128-token answer can reuse)
NGRAM_MODES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
SHORT = {"ngram-simple": ("--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "6"),
         "ngram-map-k": ("--spec-ngram-map-k-size-n", "3", "--spec-ngram-map-k-size-m", "6"),
         "ngram-map-k4v": ("--spec-ngram-map-k4v-size-n", "3", "--spec-ngram-map-k4v-size-m", "6"),
         "ngram-mod": ("--spec-ngram-mod-n-match", "8", "--spec-ngram-mod-n-min", "2", "--spec-ngram-mod-n-max", "6")}
PAIRED_NGRAM = "ngram-simple"   # the draftless mode run beside each drafter, at its short settings
MAX_CONTEXT = 8192


@dataclass(frozen=True)
class EngineConfig:
    """One llama-server configuration; kind: plain | ngram | drafter | drafter+ngram."""

    name: str
    kind: str
    args: tuple[str, ...] = ()
    drafter: str | None = None
    draft_tokens: int | None = None
    p_min: float = 0.0
    model: str | None = None   # a GGUF served instead of the target: a native drafter's checkpoint, MTP layer inside


@dataclass
class Side:
    """One configuration on one conversation: every turn's tokens, concatenated, and the engine's replies."""

    tokens: list[int] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)


def engine_configs(drafters: dict[str, Path], draft_tokens: list[int], ngram: bool = True,
                   p_mins: list[float] = (0.0,), inside: frozenset = frozenset(),
                   spec_types: dict[str, str] | None = None) -> list[EngineConfig]:
    """Plain decoding first (what every row is compared with), the n-gram modes, then each drafter at each draft length
    and confidence floor (p_min: llama.cpp stops a draft at the first token whose draft probability is below it).
    Drafters named in `inside` are GGUFs of the whole target with its MTP layer (`draft-mtp`), else drafter GGUFs
    beside the target, run as `spec_types` names them (`draft-dspark`, `draft-dflash`; default `draft-eagle3`)."""
    configs = [EngineConfig("llama.cpp plain", "plain")]
    if ngram:
        for mode in NGRAM_MODES:
            configs.append(EngineConfig(mode, "ngram", ("--spec-type", mode)))
            if mode in SHORT:
                configs.append(EngineConfig(f"{mode} key 3 draft 6", "ngram", ("--spec-type", mode, *SHORT[mode])))
    for name, gguf in drafters.items():
        for n in draft_tokens:
            for p in p_mins:
                label = f"{name} n={n}" + (f" p-min {p:g}" if p else "")
                mtp = name in inside
                drafter = (() if mtp else ("-md", str(gguf))) + ("--spec-draft-n-max", str(n), "--spec-draft-p-min",
                                                                 f"{p:g}")
                kind, model = ("draft-mtp", str(gguf)) if mtp else ((spec_types or {}).get(name, "draft-eagle3"), None)
                configs.append(EngineConfig(label, "drafter", (*drafter, "--spec-type", kind), name, n, p, model))
                if ngram:
                    configs.append(EngineConfig(f"{label} + {PAIRED_NGRAM}", "drafter+ngram",
                                                (*drafter, "--spec-type", f"{kind},{PAIRED_NGRAM}",
                                                 *SHORT[PAIRED_NGRAM]),
                                                name, n, p, model))
    return configs


def run_engine_eval(drafters: list[str], config: EngineEvalConfig | None = None, *, engine: str = "llama.cpp",
                    target: str | None = None, out: str | None = None, target_model=None) -> Path:
    """Measure each drafter in `engine` beside its plain and n-gram decoding; write and print the report; return
    its folder. `target`: the target GGUF (or any spec the drafter's export takes); `target_model`: (model, tokenizer)
    for our own loop instead of loading the target (tests)."""
    config = config or EngineEvalConfig()
    if engine != "llama.cpp":
        raise DraftheadsError(f"engine {engine}: only llama.cpp runs on this kind of machine (vLLM and SGLang "
                              "need a GPU)")
    paths = learned_paths(drafters)
    if not paths:
        raise DraftheadsError("draftheads engine eval needs an EAGLE-3, DSpark, DFlash or native MTP drafter folder "
                              "(prompt lookup runs in our own loop only)")
    draft_tokens, p_mins = sorted(set(config.draft_tokens)), sorted(set(config.p_mins))
    check_report_folder(out, drafters)
    folder = report_folder(out, drafters)
    # refuses a drafter llama.cpp cannot run, before the build
    exports = export_for_engine(paths, folder / "gguf", target, "f32" if config.dtype == "fp32" else "bf16")
    tools = install_llama_cpp()
    model, tokenizer, target_info = load_eval_target(target, config.dtype, paths, target_model,
                                                     chat_template=config.chat_template, device=config.device)
    settings = engine_settings(model, tokenizer, config.max_new_tokens)
    conversations, skipped, _ = load_conversations(config.prompts, config.limit, tokenizer, settings)
    target_gguf = folder / "gguf" / next(iter(exports)) / next(iter(exports.values()))["target"]
    files = {name: folder / "gguf" / name / (record["target"] if record.get("mtp") else DRAFTER_FILE)
             for name, record in exports.items()}
    configs = engine_configs(files, draft_tokens, config.ngram, p_mins,
                             frozenset(name for name, record in exports.items() if record.get("mtp")),
                             {name: record["spec_type"] for name, record in exports.items() if "spec_type" in record})
    print(f"draftheads engine eval llama.cpp: {len(conversations)} prompts from {config.prompts}, {len(configs)} "
          f"llama-server configurations at once ({tools.server})", flush=True)
    sides = measure_engine(tools.server, target_gguf, configs, conversations, tokenizer, settings, folder / "logs",
                           config.threads)
    ours_tau = our_tau(exports, model, tokenizer, conversations, settings, draft_tokens) if config.ours else {}
    rows = engine_rows(configs, sides, ours_tau)
    report = {
        "created": now(), "engine": {"name": "llama.cpp", "server": str(tools.server), **tools.record},
        "target": {**target_info, "gguf": str(target_gguf)}, "environment": environment(),
        "settings": {"drafters": list(drafters), "prompts": config.prompts, "limit": config.limit,
                     "max_new_tokens": config.max_new_tokens, "draft_tokens": draft_tokens, "p_mins": p_mins,
                     "ngram": config.ngram, "threads": config.threads,
                     "ours_dtype": target_info["dtype"],
                     "exports": {name: str(folder / "gguf" / name) for name in exports}},
        "prompt_count": len(conversations), "prompts_skipped": sum(skipped.values()), "skipped_reasons": skipped,
        "configs": [asdict(c) for c in configs], "results": rows,
        "outputs": {c.name: [side.tokens for side in sides[c.name]] for c in configs},
    }
    report["plots"] = write_engine_plots(folder, rows)
    write_report(folder, report, markdown=format_engine_markdown(report))
    print(format_engine_table(rows))
    broken = [r["config"] for r in rows if r["greedy_mismatches"]]
    if broken:
        print(f"draftheads eval: WARNING: greedy outputs of {', '.join(broken)} differ from llama.cpp's plain greedy "
              "decoding (see mismatched_prompts in report.json)", flush=True)
    print(f"draftheads eval: report in {folder}/report.md", flush=True)
    return folder


def export_for_engine(paths: list[str], where: Path, target: str | None, outtype: str = "bf16") -> dict[str, dict]:
    """Each drafter exported for llama.cpp into where/<name>/ (replaced on a rerun); name -> its export record. A
    native MTP drafter: its checkpoint put back and converted whole (`outtype`), {"target": the GGUF, "mtp": True}."""
    out = {}
    for path in paths:
        folder = resolve_drafter_folder(path)
        name = drafter_name(folder)
        while name in out:
            name += "'"
        if read_config(folder).get("head", {}).get("type") == "native":
            out[name] = {**whole_checkpoint_gguf(folder, where / name, target, outtype), "source": str(folder)}
            continue
        export_drafter(folder, "llama.cpp", where / name, target=target, overwrite=True)
        record = read_export_record(where / name)
        out[name] = {**record["llama_cpp"], "source": record["source"]}
    return out


def whole_checkpoint_gguf(drafter: Path, where: Path, target: str | None, outtype: str) -> dict:
    """The drafter's checkpoint with its MTP layer put back (where/checkpoint), converted whole by llama.cpp's
    converter (where/model.gguf): llama.cpp runs an MTP layer from inside the target's own GGUF."""
    if where.exists():   # an earlier run of this report wrote it: ours to replace, nothing else is
        if not ((where / "checkpoint").is_dir() or (where / "model.gguf").is_file()):
            raise DraftheadsError(f"{where} is not a folder an earlier engine eval wrote; choose another --out")
        shutil.rmtree(where)
    export_drafter(drafter, "checkpoint", where / "checkpoint", target=target)
    convert_to_gguf(where / "checkpoint", where / "model.gguf", outtype)
    return {"target": "model.gguf", "mtp": True}


def engine_settings(model, tokenizer, max_new_tokens: int) -> EvalSettings:
    """Conversations up to the target's context (at most MAX_CONTEXT tokens, each server's KV cache)."""
    max_length = min(context_limit(model), MAX_CONTEXT) - 1
    if max_length <= max_new_tokens + 1:
        raise DraftheadsError(f"max_new_tokens {max_new_tokens} does not fit the target's context of "
                              f"{max_length + 1} tokens")
    stops = stop_token_ids(tokenizer, getattr(model, "generation_config", None))
    return EvalSettings(DecodeSettings(max_new_tokens=max_new_tokens, eos_token_id=stops), max_length)


def measure_engine(server: Path, target_gguf: Path, configs: list[EngineConfig], conversations: list[Conversation],
                   tokenizer, settings: EvalSettings, logs: Path, threads: int | None) -> dict[str, list[Side]]:
    """config name -> its Side on each conversation, every configuration's server up at once and taking turns."""
    found: dict[str, list[Side]] = {c.name: [] for c in configs}
    # each server's KV cache holds the longest conversation: its first prompt, every reply, room for the later turns
    context = min(settings.max_length + 1, max(len(first_chat(tokenizer, c, settings).input_ids)
                                               + len(c.users) * (settings.decode.max_new_tokens + 256)
                                               for c in conversations) + 64)
    with contextlib.ExitStack() as stack:
        servers = {c.name: stack.enter_context(LlamaServer(server, Path(c.model) if c.model else target_gguf,
                                                           list(c.args),
                                                           logs / f"{slug(c.name)}.log",
                                                           threads, context)) for c in configs}
        for running in servers.values():   # one-off costs (allocations, the first graphs) out of the numbers
            running.complete(first_chat(tokenizer, conversations[0], settings).input_ids,
                             min(8, settings.decode.max_new_tokens))
        bar = tqdm(total=len(conversations) * len(configs), desc="draftheads engine eval llama.cpp", unit="run",
                   mininterval=1.0)
        for i, conv in enumerate(conversations):
            for config in (configs if i % 2 == 0 else configs[::-1]):
                found[config.name].append(converse(servers[config.name], conv, tokenizer, settings))
                bar.update(1)
        bar.close()
    return found


def converse(server: LlamaServer, conv: Conversation, tokenizer, settings: EvalSettings) -> Side:
    """Every user turn of `conv` answered by `server`, each turn continuing its own replies (as our loop does)."""
    chat, side = first_chat(tokenizer, conv, settings), Side()
    limit = min(settings.max_length, server.context - 1)   # what the server's KV cache holds
    while not chat.done and len(chat.input_ids) < limit:
        reply = server.complete(chat.input_ids, min(settings.decode.max_new_tokens, limit - len(chat.input_ids)))
        side.tokens += reply.tokens
        side.replies.append(reply)
        add_reply(tokenizer, chat, reply.tokens, settings.decode.eos_token_id, limit)
    return side


def our_tau(exports: dict[str, dict], model, tokenizer, conversations, settings: EvalSettings,
            draft_tokens: list[int]) -> dict[tuple[str, int], dict]:
    """(drafter, n) -> our loop's tau and acceptance per depth for that drafter drafting chain:n, greedy, same
    prompts."""
    out = {}
    for name, record in exports.items():
        for n in draft_tokens:
            entry = learned_entry(record["source"], model, Tree.chain(n), [])
            print(f"draftheads eval: our loop, {name} chain:{n}", flush=True)
            runs = [generate_conversations(model, tokenizer, [conv], entry, RunConfig("greedy", 0.0), settings)[0]
                    for conv in conversations]   # one at a time, as the engine decodes them
            stats = GenerationStats.merged(r.stats for r in runs)
            out[(name, n)] = {"tau": stats.tau, "acceptance_rates": stats.acceptance_rates,
                              "new_tokens": stats.new_tokens, "outputs": [r.tokens for r in runs]}
    return out


def slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in name)
