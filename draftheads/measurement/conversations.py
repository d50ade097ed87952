"""The prompts an evaluation answers, as conversations: loaded from a prompt source, kept when they fit the target's
context, rendered with the chat template exactly as the training data was (data/chat.py; a drafter trained in
data.mode: completion sees raw text, through the tokenizer load_eval_target prepared); and the calibration prompts
(what automatic trees, gates and predictions are fitted on) taken from past the evaluated ones."""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass

from draftheads.core.errors import DraftheadsError
from draftheads.core.target_dims import context_limit
from draftheads.data.chat import Chat, start_chat, stop_token_ids
from draftheads.data.prompt_source import PromptSource
from draftheads.data.prompts import load_source
from draftheads.decoding.settings import DecodeSettings


@dataclass
class Conversation:
    """One prompt to answer: the user turns, answered one after another, and its system message."""

    prompt_id: int
    users: list[str]
    system: str | None
    kind: str = ""   # the prompt set's task kind ('tasks'), for the report's breakdown


@dataclass
class EvalSettings:
    """How an evaluation decodes its conversations: the settings every run shares (each run sets its rule and
    temperature, measure.RunConfig; stop ids: the chat template's end of turn), the longest conversation, and the
    seed that prompt i's turn t adds 1000 i + t to."""

    decode: DecodeSettings
    max_length: int               # longest conversation (prompt + replies) in tokens
    seed: int = 0


def first_chat(tokenizer, conv: Conversation, settings: EvalSettings) -> Chat:
    return start_chat(tokenizer, conv.prompt_id, conv.users, conv.system, settings.max_length)


def eval_settings(model, tokenizer, config, nodes: int) -> EvalSettings:
    """`config`'s (an EvalConfig's) decode settings, with the chat template's stop ids, and room for the longest
    conversation: the target's context minus the biggest draft tree (`nodes`)."""
    context = context_limit(model)
    max_length = context - nodes - 1
    if max_length <= config.max_new_tokens + 1:
        raise DraftheadsError(f"max_new_tokens {config.max_new_tokens} plus a {nodes}-node draft tree do not fit the "
                              f"target's context of {context} tokens; lower max_new_tokens")
    stops = stop_token_ids(tokenizer, getattr(model, "generation_config", None))
    return EvalSettings(dataclasses.replace(config.decode, eos_token_id=stops), max_length, config.seed)


def load_conversations(source: str, limit: int | None, tokenizer, settings: EvalSettings, calibration: int = 0):
    """(conversations, skip reasons, calibration conversations): prompts from humaneval / a file / a hub dataset,
    kept when they fit. Calibration takes the `calibration` prompts after the evaluated ones, or the first evaluated
    ones when the source has no more."""
    found = collections.Counter()
    prompts = load_source(PromptSource(source=source, limit=None if limit is None else limit + calibration), found)
    conversations, skipped = fitting(prompts[:limit], 0, tokenizer, settings)
    for reason, count in found.items():
        skipped[reason] = skipped.get(reason, 0) + count
    if not conversations:
        raise DraftheadsError(f"no prompt of '{source}' fits the target's context; use shorter prompts or lower "
                              "max_new_tokens")
    extra = fitting(prompts[limit:], limit, tokenizer, settings)[0][:calibration] if limit is not None else []
    return conversations, skipped, extra or conversations[:calibration]


def fitting(prompts, first_id: int, tokenizer, settings: EvalSettings) -> tuple[list[Conversation], dict]:
    conversations, skipped = [], {}
    for i, prompt in enumerate(prompts, start=first_id):
        conv = Conversation(i, list(prompt.turns), prompt.system, prompt.kind)
        # Room for the first reply; later turns end the conversation early when they no longer fit.
        chat = first_chat(tokenizer, conv, settings)
        if chat.stopped or len(chat.input_ids) + settings.decode.max_new_tokens > settings.max_length:
            reason = chat.stopped or "prompt plus max_new_tokens longer than the target's context"
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        conversations.append(conv)
    return conversations, skipped
