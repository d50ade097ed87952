"""Chat rendering and loss masks for target-generated rows.

A row is built turn by turn, exactly as the target saw it while answering:

    ids  = render(system?, user_1, generation prompt)          mask 0
         + tokens the target generated, end-of-turn included   mask 1
         + template tokens between that end-of-turn and the
           next generation prompt (user_2 and its headers)     mask 0
         + tokens the target generated for turn 2              mask 1 ...

The template pieces between turns are found by rendering conversation prefixes with
the tokenizer's own chat template and diffing their token ids, so no template is
special-cased. The generated tokens are kept as generated (not re-tokenized from text),
so every trained token is exactly what the target produced after exactly its left context.

A template that is not incremental (it rewrites earlier turns once a later one follows, as Qwen3's drops the
thinking of earlier answers) gives one row per turn instead: turn k's row is the template's rendering of the
conversation up to user k (mask 0) followed by answer k (mask 1).

Targets without a chat template (base models) are prompted in completion mode (data.mode: completion) through
`completion_template`: a template that writes the conversation as raw text, so the same replay (and evaluation's)
renders them and the loss mask covers exactly every token the target generated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftheads.core.errors import DraftheadsError

# Plain ASCII without edge whitespace, so templates that trim or escape content keep it intact.
SENTINEL = "DraftheadsSentinel7f3a"


def completion_template(tokenizer) -> str:
    """The template of data.mode: completion, for base models: the prompt as raw text (after the tokenizer's BOS when
    it adds one, as a completions server would tokenize it) and no generation prompt, so the target continues the
    text itself. A system message and later user turns follow what came before after a blank line: the turns of a
    multi-turn prompt become one running text, each reply continuing the user text it follows."""
    bos = "{{ bos_token }}" if adds_bos(tokenizer) else ""
    return bos + ("{% for m in messages %}{% if m['role'] != 'assistant' and not loop.first %}{{ '\\n\\n' }}"
                  "{% endif %}{{ m['content'] }}{% endfor %}")


def adds_bos(tokenizer) -> bool:
    """Whether encoding text puts the BOS token first (Llama, Gemma, Mistral; not Qwen, GPT-2)."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return False
    added, plain = tokenizer("a")["input_ids"], tokenizer("a", add_special_tokens=False)["input_ids"]
    return added[:1] == [bos] and plain[:1] != [bos]


def render_text(tokenizer, messages: list[dict], add_generation_prompt: bool) -> str:
    """The chat template applied to `messages`, as text; template errors become one-line errors."""
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    except DraftheadsError:
        raise
    except Exception as e:  # jinja raises its own error types, including the template's raise_exception()
        raise DraftheadsError(f"the chat template failed on a conversation: {str(e).splitlines()[0][:200]}") from None


def encode(tokenizer, text: str) -> list[int]:
    # The template writes BOS itself where the family wants one; don't add a second.
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def render_ids(tokenizer, messages: list[dict], add_generation_prompt: bool) -> list[int]:
    return encode(tokenizer, render_text(tokenizer, messages, add_generation_prompt))


def special_ids(tokenizer) -> set[int]:
    """Ids of all special and added tokens (templates' markers are usually added tokens)."""
    ids = set(tokenizer.all_special_ids)
    ids.update(getattr(tokenizer, "added_tokens_decoder", {}).keys())
    return ids


def end_of_turn_id(tokenizer) -> int | None:
    """The token the template writes right after an assistant message's content, if it is special.

    ChatML: <|im_end|>; Llama-3: <|eot_id|>; templates that close a turn with plain text: None.
    """
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": SENTINEL}]
    text = render_text(tokenizer, messages, add_generation_prompt=False)
    if SENTINEL not in text:
        return None
    cut = text.index(SENTINEL) + len(SENTINEL)
    head, full = encode(tokenizer, text[:cut]), encode(tokenizer, text)
    if len(full) <= len(head) or full[: len(head)] != head:
        return None
    token = full[len(head)]
    return token if token in special_ids(tokenizer) else None


def stop_token_ids(tokenizer, generation_config=None) -> list[int]:
    """Tokens that end a response: EOS, the template's end-of-turn, the model's generation-config EOS."""
    stops = []
    for token in (tokenizer.eos_token_id, end_of_turn_id(tokenizer)):
        if token is not None:
            stops.append(token)
    extra = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
    stops.extend([extra] if isinstance(extra, int) else list(extra or []))
    return sorted(set(stops))


def user_turn_prefix(tokenizer, system: str | None = None, lead: str = "") -> list[int]:
    """Ids of the template up to where a user's words start (Magpie): e.g. '<|im_start|>user\\n',
    followed by `lead`, the words the user's message is made to begin with."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": SENTINEL}]
    text = render_text(tokenizer, messages, add_generation_prompt=False)
    if SENTINEL not in text:
        raise DraftheadsError("the chat template drops the user's message; check target.chat_template")
    prefix = encode(tokenizer, text[: text.index(SENTINEL)] + lead)
    if not prefix:  # completion mode on a tokenizer without BOS: no token to start writing after
        raise DraftheadsError("the target has nothing to write a self prompt after: its tokenizer adds no BOS token "
                              "and data.mode: completion renders no template text; give the self source starts_with "
                              "(e.g. 'def') or data.system_prompt, or use a prompt file")
    return prefix


@dataclass
class Chat:
    """A conversation being replayed: the target answers each user turn in order.

    `input_ids`/`loss_mask` grow as turns are answered; `done` once every user turn is
    answered or the conversation had to stop early (`stopped` says why).
    """

    prompt_id: int
    users: list[str]
    system: str | None = None
    messages: list[dict] = field(default_factory=list)
    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    answered: int = 0
    done: bool = False
    stopped: str | None = None
    truncated: bool = False
    cut: int = 0  # replies that ran out of tokens before the end-of-turn token
    sample: int = 0  # which of its prompt's data.samples_per_prompt answers this is
    temperature: float | None = None  # its sampling temperature (None: data.temperature)
    # finished (input_ids, loss_mask) rows of earlier turns, when the template is not incremental
    earlier: list[tuple[list[int], list[int]]] = field(default_factory=list)

    def rows(self) -> list[tuple[list[int], list[int]]]:
        """The training rows of this conversation: one, or one per turn when the template re-renders earlier turns."""
        current = [(self.input_ids, self.loss_mask)] if any(self.loss_mask) else []
        return self.earlier + current


def first_messages(users: list[str], system: str | None) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": users[0]}]


def start_chat(tokenizer, prompt_id: int, users: list[str], system: str | None, max_length: int,
               truncate: bool = False, room: int = 1) -> Chat:
    """The first turn's prompt. One with no room left to answer in max_length is stopped (counted as
    skipped), or with `truncate`, its user message is cut to leave `room` tokens for the answer."""
    chat = Chat(prompt_id=prompt_id, users=list(users), system=system)
    chat.messages = first_messages(users, system)
    ids = render_ids(tokenizer, chat.messages, add_generation_prompt=True)
    if len(ids) + 1 > max_length:
        if not truncate:
            chat.done, chat.stopped = True, "prompt longer than max_length"
            return chat
        ids = _truncate_user(tokenizer, chat, max_length - room)
        if ids is None:
            chat.done, chat.stopped = True, "prompt longer than max_length even when truncated"
            return chat
        chat.truncated = True
    chat.input_ids, chat.loss_mask = ids, [0] * len(ids)
    return chat


def _truncate_user(tokenizer, chat: Chat, limit: int) -> list[int] | None:
    """Cut the user's message from the end until the rendered prompt has at most `limit` tokens."""
    words = encode(tokenizer, chat.users[0])
    keep = len(words)
    while keep > 0:
        over = len(render_ids(tokenizer, first_messages([tokenizer.decode(words[:keep])], chat.system), True)) - limit
        if over <= 0:
            chat.users[0] = tokenizer.decode(words[:keep])
            chat.messages = first_messages(chat.users, chat.system)
            return render_ids(tokenizer, chat.messages, add_generation_prompt=True)
        keep -= max(over, 1)  # re-tokenising after a cut can shift a token or two; step again
    return None


def add_reply(tokenizer, chat: Chat, reply_ids: list[int], stop_ids, max_length: int,
              message: dict | None = None) -> None:
    """Append the target's reply (mask 1) and, if a user turn follows, the template up to its answer (mask 0).

    `reply_ids` are exactly the generated tokens, ending in a stop token when the target
    finished its turn; a reply cut by max_new_tokens/max_length ends the conversation.
    `message` is the assistant message the history records (default: the reply decoded as its
    content); a server's reply with its thinking passes {content, reasoning_content}.
    """
    stops = set(stop_ids)
    chat.input_ids += list(reply_ids)
    chat.loss_mask += [1] * len(reply_ids)
    chat.answered += 1
    finished = bool(reply_ids) and reply_ids[-1] in stops
    chat.cut += not finished
    content = reply_ids[:-1] if finished else reply_ids
    message = message or {"role": "assistant", "content": tokenizer.decode(content, skip_special_tokens=True)}
    chat.messages.append(message)
    if chat.answered == len(chat.users):
        chat.done = True
        return
    if not finished:
        chat.done, chat.stopped = True, "later turns dropped: reply cut before end of turn"
        return
    user = chat.users[chat.answered]
    delta = next_turn_ids(tokenizer, chat.messages, user, end_of_turn_id(tokenizer))
    if delta is None:
        # The template re-renders earlier turns (Qwen3 drops their thinking blocks), so the next answer's context is
        # not this row's ids: answer it from the context the template renders for it, as a server would, in a row of
        # its own where only that answer is trained.
        context = render_ids(tokenizer, chat.messages + [{"role": "user", "content": user}], add_generation_prompt=True)
        if len(context) + 1 > max_length:
            chat.done, chat.stopped = True, "later turns dropped: over max_length"
            return
        chat.earlier.append((chat.input_ids, chat.loss_mask))
        chat.messages.append({"role": "user", "content": user})
        chat.input_ids, chat.loss_mask = context, [0] * len(context)
    elif len(chat.input_ids) + len(delta) + 1 > max_length:
        chat.done, chat.stopped = True, "later turns dropped: over max_length"
    else:
        chat.messages.append({"role": "user", "content": chat.users[chat.answered]})
        chat.input_ids += delta
        chat.loss_mask += [0] * len(delta)


def thinking_turn(tokenizer, messages: list[dict], content: str, reasoning: str,
                  cut_in_thinking: bool = False) -> str | None:
    """The text the template renders for an assistant turn with its thinking (a server's `reasoning_content` beside
    `content`) after the generation prompt of `messages`: Qwen3's '<think>\\n{reasoning}\\n</think>\\n\\n{content}'.

    It ends where the content ends (the end-of-turn is the caller's), or with `cut_in_thinking` (the reply ran out of
    tokens before its answer) where the thinking ends. None where the template has no place for the reasoning (it
    drops it, as SmolLM2's and DeepSeek-R1's do) or renders the turn apart from its own generation prompt.
    """
    prompt = render_text(tokenizer, messages, add_generation_prompt=True)
    if cut_in_thinking:
        turn = {"role": "assistant", "content": "", "reasoning_content": reasoning + SENTINEL}
    else:
        turn = {"role": "assistant", "content": content + SENTINEL, "reasoning_content": reasoning}
    text = render_text(tokenizer, messages + [turn], add_generation_prompt=False)
    if not text.startswith(prompt) or SENTINEL not in text:
        return None
    body = text[len(prompt): text.index(SENTINEL)]
    return body if reasoning.strip() in body else None


def inline_thinking(tokenizer, messages: list[dict], content: str, reasoning: str,
                    cut_in_thinking: bool = False) -> tuple[str, str]:
    """(generated text, message content) of a reply whose thinking is written before its answer in <think> tags, for
    templates with no place for reasoning; a <think> the generation prompt opens itself is not repeated in the
    generated text."""
    text = "<think>\n" + reasoning.strip("\n") + ("" if cut_in_thinking else "\n</think>\n\n" + content.lstrip("\n"))
    prompt = render_text(tokenizer, messages, add_generation_prompt=True)
    opened = next((o for o in ("<think>\n", "<think>") if prompt.endswith(o)), "")
    return text[len(opened):], text


def next_turn_ids(tokenizer, messages: list[dict], user: str, end_id: int | None) -> list[int] | None:
    """Template ids after the last assistant turn's end token up to the next generation prompt.

    Renders the conversation before the reply (P), with the reply closed (C), and with the
    next user turn opened (N); the reply ends at the first end-of-turn `end_id` in C after P
    (its content was decoded without special tokens, so none hides inside), and N must share
    C's ids up to there. None when the template does not render prefixes stably.
    """
    before = render_ids(tokenizer, messages[:-1], add_generation_prompt=True)
    closed = render_ids(tokenizer, messages, add_generation_prompt=False)
    following = render_ids(tokenizer, messages + [{"role": "user", "content": user}], add_generation_prompt=True)
    if closed[: len(before)] != before:
        return None
    end = next((i for i in range(len(before), len(closed)) if closed[i] == end_id), None)
    if end is None:
        # The template closes turns with text, not a special token: diff the whole render.
        return following[len(closed):] if following[: len(closed)] == closed else None
    if following[: end + 1] != closed[: end + 1]:
        return None
    return following[end + 1:]


def build_row(tokenizer, users: list[str], replies: list[list[int]], system: str | None = None,
              max_length: int = 1 << 30, stop_ids=None) -> Chat:
    """Replay a whole conversation with given reply ids (tests, the openai backend)."""
    stop_ids = stop_token_ids(tokenizer) if stop_ids is None else stop_ids
    chat = start_chat(tokenizer, 0, users, system, max_length)
    for reply in replies:
        if chat.done:
            break
        add_reply(tokenizer, chat, reply, stop_ids, max_length)
    return chat


def show_mask(tokenizer, input_ids: list[int], loss_mask: list[int]) -> str:
    """The row as text with the tokens that are NOT trained on (mask 0) in [brackets]."""
    pieces, start = [], 0
    for i in range(1, len(input_ids) + 1):
        if i == len(input_ids) or loss_mask[i] != loss_mask[start]:
            text = tokenizer.decode(input_ids[start:i], skip_special_tokens=False)
            pieces.append(f"[{text}]" if loss_mask[start] == 0 else text)
            start = i
    return "".join(pieces)
