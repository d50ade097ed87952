"""Loss masks against hand-built token sequences for ChatML (SmolLM2), Qwen2 and Llama-3, multi-turn included."""

import pytest

from draftheads.core.errors import DraftheadsError
from draftheads.data.chat import (
    build_row,
    end_of_turn_id,
    inline_thinking,
    next_turn_ids,
    render_ids,
    show_mask,
    start_chat,
    stop_token_ids,
    thinking_turn,
    user_turn_prefix,
)
from tests.fixtures import make_base_tokenizer, make_tokenizer


def enc(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def sid(tok, token):
    return tok.convert_tokens_to_ids(token)


def chatml_turn(tok, role, text, close=True):
    """<|im_start|>role\\ntext<|im_end|>\\n written token by token."""
    ids = [sid(tok, "<|im_start|>")] + enc(tok, f"{role}\n{text}")
    return ids + [sid(tok, "<|im_end|>")] + enc(tok, "\n") if close else ids


def chatml_expected(tok, users, replies, system=None):
    """(ids, mask) by hand for ChatML; `replies` are the generated ids (ending in <|im_end|>)."""
    ids, mask = [], []
    if system is not None:
        ids += chatml_turn(tok, "system", system)
        mask += [0] * len(ids)
    for k, (user, reply) in enumerate(zip(users, replies)):
        head = chatml_turn(tok, "user", user) + [sid(tok, "<|im_start|>")] + enc(tok, "assistant\n")
        if k > 0:  # the template's newline after the previous <|im_end|> belongs to this turn's header
            head = enc(tok, "\n") + head
        ids += head + reply
        mask += [0] * len(head) + [1] * len(reply)
    return ids, mask


def llama3_expected(tok, users, replies):
    def header(role):
        return [sid(tok, "<|start_header_id|>")] + enc(tok, role) + [sid(tok, "<|end_header_id|>")]

    ids, mask = [sid(tok, "<|begin_of_text|>")], [0]
    for user, reply in zip(users, replies):
        head = (header("user") + enc(tok, "\n\n" + user) + [sid(tok, "<|eot_id|>")] + header("assistant")
                + enc(tok, "\n\n"))
        ids += head + reply
        mask += [0] * len(head) + [1] * len(reply)
    return ids, mask


USERS = ["Write a function that adds two numbers.", "Now print it for i in range(10)."]
REPLY_TEXTS = ["def add(a, b):\n    return a + b", "for i in range(10):\n    print(add(i, i))"]


def replies_for(tok, eot):
    return [enc(tok, text) + [sid(tok, eot)] for text in REPLY_TEXTS]


@pytest.mark.parametrize("turns", [1, 2])
def test_chatml_mask_matches_hand_built(turns):
    tok = make_tokenizer("chatml")
    replies = replies_for(tok, "<|im_end|>")[:turns]
    chat = build_row(tok, USERS[:turns], replies)
    assert (chat.input_ids, chat.loss_mask) == chatml_expected(tok, USERS[:turns], replies)
    assert chat.done and chat.stopped is None and chat.answered == turns


@pytest.mark.parametrize("system", [None, "You answer in Python."])
def test_qwen2_mask_matches_hand_built(system):
    """Qwen2 writes its default system turn when the conversation has none; never trained on."""
    tok = make_tokenizer("qwen2")
    replies = replies_for(tok, "<|im_end|>")
    chat = build_row(tok, USERS, replies, system=system)
    expected = chatml_expected(tok, USERS, replies, system=system or "You are a helpful assistant.")
    assert (chat.input_ids, chat.loss_mask) == expected


def test_llama3_mask_matches_hand_built():
    tok = make_tokenizer("llama3")
    replies = replies_for(tok, "<|eot_id|>")
    chat = build_row(tok, USERS, replies)
    assert (chat.input_ids, chat.loss_mask) == llama3_expected(tok, USERS, replies)


@pytest.mark.parametrize("template", ["chatml", "qwen2", "llama3"])
def test_row_equals_the_rendered_conversation(template):
    """With canonically tokenized replies the replayed row is the template's own render of the chat."""
    tok = make_tokenizer(template)
    eot = end_of_turn_id(tok)
    replies = [enc(tok, text) + [eot] for text in REPLY_TEXTS]
    chat = build_row(tok, USERS, replies)
    messages = [m for u, a in zip(USERS, REPLY_TEXTS) for m in ({"role": "user", "content": u},
                                                                {"role": "assistant", "content": a})]
    full = render_ids(tok, messages, add_generation_prompt=False)
    assert full[: len(chat.input_ids)] == chat.input_ids
    assert full[len(chat.input_ids):] == ([] if template == "llama3" else enc(tok, "\n"))  # ChatML's trailing newline
    trained = [t for t, m in zip(chat.input_ids, chat.loss_mask) if m]
    assert trained == replies[0] + replies[1]


@pytest.mark.parametrize("template,eot", [("chatml", "<|im_end|>"), ("qwen2", "<|im_end|>"), ("llama3", "<|eot_id|>")])
def test_end_of_turn_and_stop_ids(template, eot):
    tok = make_tokenizer(template)
    assert end_of_turn_id(tok) == sid(tok, eot)
    assert sid(tok, eot) in stop_token_ids(tok)


def test_generation_config_eos_joins_the_stop_ids():
    class GenerationConfig:
        eos_token_id = [7, 9]

    tok = make_tokenizer("chatml")
    assert set(stop_token_ids(tok, GenerationConfig())) == {sid(tok, "<|im_end|>"), 7, 9}


@pytest.mark.parametrize("template,expected", [
    ("chatml", "<|im_start|>user\n"),
    ("qwen2", "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"),
    ("llama3", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"),
])
def test_user_turn_prefix_stops_where_the_user_writes(template, expected):
    tok = make_tokenizer(template)
    assert tok.decode(user_turn_prefix(tok)) == expected


def test_cut_reply_ends_the_conversation():
    """A reply without end-of-turn (token budget ran out) is kept, trained on, and ends the row."""
    tok = make_tokenizer("chatml")
    cut = enc(tok, "def add(a, b):")
    chat = build_row(tok, USERS, [cut, replies_for(tok, "<|im_end|>")[1]])
    head = chatml_expected(tok, USERS[:1], [cut])
    assert (chat.input_ids, chat.loss_mask) == head
    assert chat.done and chat.cut == 1 and chat.stopped.startswith("later turns dropped")


def test_later_turn_over_max_length_is_dropped():
    tok = make_tokenizer("chatml")
    replies = replies_for(tok, "<|im_end|>")
    one = build_row(tok, USERS[:1], replies[:1])
    chat = build_row(tok, USERS, replies, max_length=len(one.input_ids) + 5)
    assert chat.input_ids == one.input_ids and chat.stopped == "later turns dropped: over max_length"


def test_long_prompt_is_skipped_or_truncated():
    tok = make_tokenizer("chatml")
    long_user = "Write a function that returns the sum of a list of numbers. " * 20
    full = render_ids(tok, [{"role": "user", "content": long_user}], True)
    skipped = start_chat(tok, 0, [long_user], None, max_length=len(full))
    assert skipped.done and skipped.stopped == "prompt longer than max_length" and skipped.input_ids == []
    fits = start_chat(tok, 0, [long_user], None, max_length=len(full) + 1)
    assert fits.input_ids == full and not fits.truncated
    cut = start_chat(tok, 0, [long_user], None, max_length=60, truncate=True, room=20)
    assert cut.truncated and 0 < len(cut.input_ids) <= 40 and cut.loss_mask == [0] * len(cut.input_ids)
    assert long_user.startswith(cut.users[0]) and cut.input_ids == render_ids(tok, cut.messages, True)


def test_plain_text_template_falls_back_to_diffing_renders():
    """A template that closes turns with text (no special end token): rows still replay every turn."""
    tok = make_tokenizer("chatml")
    tok.chat_template = ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
                         "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}")
    assert end_of_turn_id(tok) is None
    replies = [enc(tok, " hi") + [tok.eos_token_id], enc(tok, " ok") + [tok.eos_token_id]]
    chat = build_row(tok, USERS, replies)
    assert chat.answered == 2 and chat.stopped is None
    assert [t for t, m in zip(chat.input_ids, chat.loss_mask) if m] == replies[0] + replies[1]
    assert tok.decode([t for t, m in zip(chat.input_ids, chat.loss_mask) if not m]).count("user:") == 2


# Qwen3's way, cut down: an answer's thinking is dropped once a later turn follows it, and enable_thinking=false
# writes an empty thinking block into the generation prompt.
QWEN3_STYLE = (
    "{%- for m in messages -%}"
    "{%- set content = m['content'] -%}"
    "{%- if m['role'] == 'assistant' and not loop.last and '</think>' in content -%}"
    "{%- set content = content.split('</think>')[-1] | trim -%}{%- endif -%}"
    "{{ '<|im_start|>' + m['role'] + '\n' + content + '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{ '<think>\n\n</think>\n\n' }}{%- endif -%}"
    "{%- endif -%}"
)


def test_a_template_that_rewrites_earlier_turns_gives_one_exact_row_per_turn():
    """Each later turn is answered from the context the template renders for it (the first answer's thinking
    gone), in its own row; only that turn's answer is trained, the tokens exactly as generated."""
    tok = make_tokenizer("chatml")
    tok.chat_template = QWEN3_STYLE
    end = sid(tok, "<|im_end|>")
    replies = [enc(tok, "<think>add them</think>\n\n" + REPLY_TEXTS[0]) + [end], enc(tok, REPLY_TEXTS[1]) + [end]]
    assert next_turn_ids(tok, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>x</think>b"}],
                         "c", end) is None
    chat = build_row(tok, USERS, replies)
    assert chat.answered == 2 and chat.stopped is None
    (first, first_mask), (second, second_mask) = chat.rows()
    assert [t for t, m in zip(first, first_mask) if m] == replies[0]
    assert first == render_ids(tok, [{"role": "user", "content": USERS[0]}], True) + replies[0]
    context = render_ids(tok, [{"role": "user", "content": USERS[0]}, {"role": "assistant", "content": tok.decode(
        replies[0][:-1])}, {"role": "user", "content": USERS[1]}], True)
    assert "add them" not in tok.decode(context) and second == context + replies[1]
    assert second_mask == [0] * len(context) + [1] * len(replies[1])


# Qwen3's template, cut down to its thinking: the assistant turn after the last user message renders its
# reasoning_content as '<think>\n...\n</think>\n\n' before its answer; earlier turns drop it.
QWEN3_THINKING = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' and loop.last and m['reasoning_content'] is string -%}"
    "{{ '<|im_start|>assistant\n<think>\n' + m['reasoning_content'].strip('\n') + '\n</think>\n\n' "
    "+ m['content'].lstrip('\n') + '<|im_end|>\n' }}"
    "{%- else -%}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)
# DeepSeek-R1's way: the generation prompt opens the thinking itself, and answers keep no thinking.
R1_STYLE = (
    "{%- for m in messages -%}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n<think>\n' }}{%- endif -%}"
)


def test_a_reply_with_thinking_is_the_text_its_template_renders():
    tok = make_tokenizer("chatml")
    tok.chat_template = QWEN3_THINKING
    asked = [{"role": "user", "content": USERS[0]}]
    text = thinking_turn(tok, asked, "\n\nReturn a + b.", "\nAdd them.\n")  # as vLLM splits '<think>\n...'
    assert text == "<think>\nAdd them.\n</think>\n\nReturn a + b."
    closed = tok.apply_chat_template(asked + [{"role": "assistant", "content": "Return a + b.",
                                               "reasoning_content": "Add them."}], tokenize=False)
    assert closed == tok.apply_chat_template(asked, tokenize=False, add_generation_prompt=True) + text + "<|im_end|>\n"
    # out of tokens while thinking: the text stops where the thinking stopped, no </think> the target never wrote
    assert thinking_turn(tok, asked, "", "Add them", cut_in_thinking=True) == "<think>\nAdd them"
    assert thinking_turn(make_tokenizer("chatml"), asked, "Return a + b.", "Add them.") is None  # no place for it


def test_inline_thinking_does_not_repeat_a_think_the_prompt_opened():
    tok = make_tokenizer("chatml")
    asked = [{"role": "user", "content": USERS[0]}]
    assert inline_thinking(tok, asked, "Sum.", "\nAdd.\n") == ("<think>\nAdd.\n</think>\n\nSum.",) * 2
    tok.chat_template = R1_STYLE
    assert inline_thinking(tok, asked, "Sum.", "Add.") == ("Add.\n</think>\n\nSum.", "<think>\nAdd.\n</think>\n\nSum.")


def test_chat_template_kwargs_become_template_variables():
    from draftheads.data.target import attach_chat_template

    tok = make_tokenizer("chatml")
    attach_chat_template(tok, QWEN3_STYLE, "fixture", {"enable_thinking": False})
    prompt = tok.decode(start_chat(tok, 0, USERS[:1], None, 1024).input_ids)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    plain = make_tokenizer("chatml")
    attach_chat_template(plain, QWEN3_STYLE, "fixture")
    assert tok.decode(start_chat(plain, 0, USERS[:1], None, 1024).input_ids).endswith("assistant\n")
    with pytest.raises(DraftheadsError, match="'not-a-name' is not a template variable name"):
        attach_chat_template(make_tokenizer("chatml"), QWEN3_STYLE, "fixture", {"not-a-name": 1})


def test_template_errors_are_one_line():
    tok = make_tokenizer("chatml")
    tok.chat_template = "{{ raise_exception('Conversation roles must alternate user/assistant') }}"
    with pytest.raises(DraftheadsError, match="chat template failed.*alternate"):
        render_ids(tok, [{"role": "user", "content": "x"}], True)


def test_show_mask_brackets_untrained_tokens():
    tok = make_tokenizer("chatml")
    chat = build_row(tok, USERS[:1], replies_for(tok, "<|im_end|>")[:1])
    text = show_mask(tok, chat.input_ids, chat.loss_mask)
    assert text == f"[<|im_start|>user\n{USERS[0]}<|im_end|>\n<|im_start|>assistant\n]{REPLY_TEXTS[0]}<|im_end|>"


# ---------------------------------------------------------------- completion mode (base models)


def completion_tokenizer(bos: bool):
    """A tokenizer without a chat template (a base model's) in data.mode: completion; `bos`: it puts BOS first."""
    from draftheads.data.target import attach_chat_template

    tok = make_base_tokenizer() if bos else make_tokenizer("chatml")
    tok.chat_template = None
    attach_chat_template(tok, None, "fixture", mode="completion")
    return tok


@pytest.mark.parametrize("bos", [True, False])
def test_completion_prompt_is_the_raw_text_as_the_tokenizer_encodes_it(bos):
    tok = completion_tokenizer(bos)
    chat = start_chat(tok, 0, USERS[:1], None, 1024)
    assert chat.input_ids == tok(USERS[0])["input_ids"] and chat.loss_mask == [0] * len(chat.input_ids)
    assert (chat.input_ids[0] == tok.bos_token_id) is bos
    system = start_chat(tok, 0, USERS[:1], "Be brief.", 1024)
    assert tok.decode(system.input_ids, skip_special_tokens=True) == "Be brief.\n\n" + USERS[0]
    assert end_of_turn_id(tok) is None and stop_token_ids(tok) == [tok.eos_token_id]


def test_completion_rows_train_every_continuation_token_and_join_turns_by_a_blank_line():
    tok = completion_tokenizer(True)
    replies = [enc(tok, " " + REPLY_TEXTS[0]) + [tok.eos_token_id], enc(tok, " " + REPLY_TEXTS[1])]
    chat = build_row(tok, USERS, replies)
    prompt, between = tok(USERS[0])["input_ids"], enc(tok, "\n\n" + USERS[1])
    ids = prompt + replies[0] + between + replies[1]
    mask = [0] * len(prompt) + [1] * len(replies[0]) + [0] * len(between) + [1] * len(replies[1])
    assert chat.rows() == [(ids, mask)]
    assert show_mask(tok, ids, mask) == (f"[<|begin_of_text|>{USERS[0]}] {REPLY_TEXTS[0]}<|eot_id|>[\n\n{USERS[1]}] "
                                         f"{REPLY_TEXTS[1]}")


def test_self_prompts_in_completion_mode_start_after_bos_or_the_lead():
    tok = completion_tokenizer(True)
    assert user_turn_prefix(tok) == [tok.bos_token_id]
    assert user_turn_prefix(tok, lead="def") == [tok.bos_token_id] + enc(tok, "def")
    bare = completion_tokenizer(False)
    assert user_turn_prefix(bare, lead="def") == enc(bare, "def")
    with pytest.raises(DraftheadsError, match="adds no BOS token.*give the self source starts_with"):
        user_turn_prefix(bare)
