"""Task kinds for the prompts the target writes itself: what a chat model is asked besides code, built from pieces the
target writes, so nothing is downloaded.

    prompts = kind_prompts("summarization", 40, writers, src, seed=3, skipped=counter)

- Message kinds (open, writing, role-play, reasoning, math, coding, stem, humanities, translation): the target writes
  the user's message after one of the kind's leads ("Write a short story about", "Translate into French:"), as for
  `starts_with` (Magpie). Half the translations go the other way: the target's own translation of such a message is
  the text it is asked to translate into English.
- Passage kinds (summarization, extraction, qa, retrieval): the target first writes a request for an article on a
  subject of its choosing, then the article itself (up to `passage_tokens`); for qa and retrieval it then writes a
  question the article answers. The prompt puts the article (retrieval: among three articles written for other prompts)
  with one of our instructions: real prompts of hundreds to a couple of thousand tokens.
- multi-turn: a first message of a message kind, then one or two follow-ups (ours, FOLLOW_UPS), answered turn by turn.

`GENERAL` (`kinds: general`) is the documented default mixture. Our instructions are worded apart from those of the
bundled evaluation set ('tasks'), which is never trained on.
"""

from __future__ import annotations

import collections
import random
import re
from dataclasses import dataclass
from typing import Callable

from draftheads.core.config import suggest
from draftheads.core.errors import DraftheadsError

# The default mixture (kinds: general), by weight: every kind of the evaluation set and more; code keeps a large share
# (a quarter: the drafter should stay close to a HumanEval-tuned one there), the passage kinds near a quarter.
GENERAL = {"open": 1.0, "writing": 1.0, "role-play": 0.5, "reasoning": 1.0, "math": 1.0, "coding": 4.0, "stem": 1.0,
           "humanities": 0.5, "translation": 1.0, "summarization": 1.0, "extraction": 0.5, "qa": 1.0, "retrieval": 1.0,
           "multi-turn": 1.0}

LEADS = {
    "open": ("",),
    "writing": ("Write a short story about", "Write a poem about", "Write an email to", "Write a blog post about",
                "Write a product description for", "Write a cover letter for", "Write a speech for"),
    "role-play": ("Pretend you are", "Imagine you are", "Act as", "You are a", "Play the role of"),
    "reasoning": ("Explain why", "What would happen if", "What are the pros and cons of", "Is it better to", "Why do",
                  "Give three reasons why"),
    "math": ("Solve this math problem step by step:", "A store sells", "If a train travels", "Calculate",
             "Solve for x:", "Tom has", "What is the probability that"),
    "coding": ("Write a Python function", "Write a Python function", "Write a JavaScript function",
               "Write a Python class", "Write a SQL query", "How do I", "Write a function in C that"),
    "stem": ("Explain how", "What is the difference between", "Describe the process of", "How does", "What causes"),
    "humanities": ("What were the causes of", "Who was", "Describe the history of", "What is the significance of",
                   "Discuss the main ideas of"),
    "translation": ("Translate the following sentence into French:", "Translate this text into Spanish:",
                    "Translate into German:", "Translate the following into Italian:",
                    "How would you say this in French:"),
}
# Into English, the text to translate is the target's own translation of a message it wrote after a LEADS one.
INTO_ENGLISH = ("Translate this into English:", "Translate the following text into English:",
                "Please translate to English:", "What does this mean in English?")
ARTICLE_LEADS = ("Write a detailed article about", "Write an informative essay about", "Write a report on",
                 "Write a long explanation of")
SUMMARIZE = ("Give a short summary of the text below.\n\n{text}", "{text}\n\nSummarize this in a few sentences.",
             "Write a summary of the following article in three bullet points.\n\n{text}",
             "{text}\n\nWhat is the main point of this text? Summarize it briefly.")
EXTRACT = ("{text}\n\nList every person, place, number and date mentioned in the text above.",
           "Extract the key facts from this text as a bulleted list.\n\n{text}",
           "{text}\n\nName the key terms used in this text and define each in one line.",
           "From the text below, pull out the main claims and the evidence given for each.\n\n{text}")
QA = ("Read the passage and answer the question.\n\nPassage:\n{text}\n\nQuestion: {question}",
      "{text}\n\nBased on the text above, {question_lower}",
      "Use the article below to answer: {question}\n\n{text}")
RETRIEVE = ("Here are some documents.\n\n{documents}\n\nUsing these documents, answer: {question}",
            "{documents}\n\nQuestion: {question}\nAnswer from the documents above and name the one you used.",
            "Answer the question with the help of the sources below.\n\nQuestion: {question}\n\n{documents}")
QUESTION_REQUEST = "{text}\n\nWrite one question that the text above answers. Reply with the question only."
FOLLOW_UPS = ("Can you make that shorter?", "Can you explain that in simpler words?", "Give me another example.",
              "What are the limitations of this?", "Can you add more detail?", "Now write it in a more formal tone.",
              "Summarize your answer in one sentence.", "Why is that?", "Are there any alternatives?",
              "Can you turn that into a list?")
MULTI_TURN_FIRST = ("writing", "reasoning", "coding", "stem", "humanities", "math", "open")
PASSAGE_KINDS = ("summarization", "extraction", "qa", "retrieval")
KINDS = (*LEADS, *PASSAGE_KINDS, "multi-turn")
DOCUMENTS_PER_RETRIEVAL = 4


@dataclass
class Writers:
    """What the target writes with: `write(count, max_tokens, temperature, seed, lead)` continues a user's message after
    `lead` (Magpie); `reply(messages, max_tokens, temperature, seed)` answers each user message as the assistant. Both
    return [(text, finished)]."""

    write: Callable
    reply: Callable | None = None


def resolve_kinds(kinds) -> dict[str, float]:
    """kinds: 'general' (GENERAL) or {kind: weight}; unknown kinds or weights are a one-line error."""
    if kinds == "general":
        return dict(GENERAL)
    if not isinstance(kinds, dict) or not kinds:
        raise DraftheadsError(f"data.prompts: kinds must be 'general' or a mapping {{kind: weight}}, got {kinds!r}")
    for kind, weight in kinds.items():
        if kind not in KINDS:
            raise DraftheadsError(f"data.prompts: unknown task kind '{kind}'{suggest(str(kind), KINDS)}; kinds are "
                                  f"{', '.join(KINDS)}")
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight <= 0:
            raise DraftheadsError(f"data.prompts: the weight of kind '{kind}' must be a positive number, got "
                                  f"{weight!r}")
    return {k: float(w) for k, w in kinds.items()}


def kind_prompts(kind: str, count: int, writers: Writers, src, seed: int, skipped: collections.Counter,
                 make_messages: Callable) -> list[tuple[list[str], str]]:
    """`count` prompts of `kind` as (user turns, kind); fewer (the failures counted in `skipped`) if the target keeps
    writing unusable pieces. `make_messages(count, src, seed, lead)` writes filtered, distinct user messages (leads
    cycled over the messages)."""
    rng = random.Random(f"{seed}:{kind}")
    if kind == "translation" and writers.reply is not None:   # half into English (without a reply: all from English)
        back = into_english(count // 2, writers, src, seed, skipped, make_messages, rng)
        return [([text], kind) for text in make_messages(count - len(back), src, seed, LEADS[kind])] + back
    if kind in LEADS:
        return [([text], kind) for text in make_messages(count, src, seed, LEADS[kind])]
    if kind == "multi-turn":
        firsts = make_messages(count, src, seed, tuple(lead for k in MULTI_TURN_FIRST for lead in LEADS[k]))
        return [([first, *rng.sample(FOLLOW_UPS, rng.choice((1, 2)))], kind) for first in firsts]
    if writers.reply is None:
        raise DraftheadsError(f"task kind '{kind}' needs the target to write passages; this backend cannot")
    passages = write_passages(count, writers, src, seed, skipped, make_messages)
    if kind in ("qa", "retrieval"):
        passages = with_questions(passages, writers, src, seed, skipped)
    prompts = []
    for i, item in enumerate(passages):
        text = item["text"]
        if kind == "summarization":
            message = rng.choice(SUMMARIZE).format(text=text)
        elif kind == "extraction":
            message = rng.choice(EXTRACT).format(text=text)
        elif kind == "qa":
            question = item["question"]
            message = rng.choice(QA).format(text=text, question=question,
                                            question_lower=question[0].lower() + question[1:])
        else:   # retrieval: the passage among others, written for this kind's other prompts
            others = [p["text"] for j, p in enumerate(passages) if j != i]
            docs = rng.sample(others, min(len(others), DOCUMENTS_PER_RETRIEVAL - 1)) + [text]
            rng.shuffle(docs)
            documents = "\n\n".join(f"Document {n}:\n{doc}" for n, doc in enumerate(docs, start=1))
            message = rng.choice(RETRIEVE).format(documents=documents, question=item["question"])
        prompts.append(([message], kind))
    return prompts


def write_passages(count: int, writers: Writers, src, seed: int, skipped: collections.Counter,
                   make_messages: Callable, rounds: int = 4) -> list[dict]:
    """`count` articles: the target asks for one (after ARTICLE_LEADS), then writes it; unusable ones are redrawn."""
    out = []
    for attempt in range(rounds):
        need = count - len(out)
        if need <= 0:
            break
        requests = make_messages(need + need // 4 + 2, src, seed * 31 + attempt, ARTICLE_LEADS)
        for text, finished in writers.reply(requests, src.passage_tokens, src.temperature, seed * 131 + attempt):
            passage, reason = clean_passage(text, finished)
            if reason:
                skipped[f"self passages: {reason}"] += 1
            else:
                out.append({"text": passage})
    return out[:count]


def into_english(count: int, writers: Writers, src, seed: int, skipped: collections.Counter, make_messages: Callable,
                 rng: random.Random, rounds: int = 3) -> list[tuple[list[str], str]]:
    """`count` prompts that translate into English: the target writes a message after a translation lead (English text
    to translate into French, Spanish...), translates it, and its translation becomes the text to bring back."""
    out = []
    for attempt in range(rounds):
        need = count - len(out)
        if need <= 0:
            break
        asks = make_messages(need + need // 4 + 2, src, seed * 37 + attempt, LEADS["translation"])
        for ask, (text, finished) in zip(asks, writers.reply(asks, src.max_tokens, src.temperature,
                                                             seed * 139 + attempt)):
            foreign, reason = clean_passage(text, finished, min_words=3)
            if not reason and normalise_words(foreign) in normalise_words(ask):
                reason = "a copy, not a translation"
            if reason:
                skipped[f"self translations: {reason}"] += 1
            else:
                out.append(([f"{rng.choice(INTO_ENGLISH)}\n{foreign}"], "translation"))
    return out[:count]


def normalise_words(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def with_questions(passages: list[dict], writers: Writers, src, seed: int, skipped: collections.Counter) -> list[dict]:
    """Each passage with a question the target wrote about it; passages it wrote none for are dropped."""
    asks = [QUESTION_REQUEST.format(text=p["text"]) for p in passages]
    out = []
    for passage, (text, finished) in zip(passages, writers.reply(asks, 64, src.temperature, seed * 137)):
        question = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not finished or not question.endswith("?") or len(question.split()) < 4:
            skipped["self questions: no one-line question"] += 1
            continue
        out.append({**passage, "question": question})
    return out


SENTENCE_END = re.compile(r"[.!?](?=\s|$)")


def clean_passage(text: str, finished: bool, min_words: int = 60) -> tuple[str, str | None]:
    """(the article, why it is unusable or None): one cut off by its token budget is kept up to its last sentence."""
    text = text.strip()
    if not finished:
        ends = [m.end() for m in SENTENCE_END.finditer(text)]
        text = text[: ends[-1]] if ends else ""
    if len(text.split()) < min_words:
        return text, "too short"
    if loops(text) or "\ufffd" in text or "<|" in text:
        return text, "looping, broken characters or template markup"
    return text, None


def loops(text: str) -> bool:
    """A small model's failure in long texts: the same line, or the same 6 words, coming back again and again (a real
    article repeats phrases, not whole lines or long runs of words)."""
    lines = [line.strip() for line in text.splitlines() if len(line.strip()) > 20]
    if lines and collections.Counter(lines).most_common(1)[0][1] >= 3:
        return True
    words = text.lower().split()
    grams = collections.Counter(" ".join(words[i:i + 6]) for i in range(len(words) - 5))
    return bool(grams) and grams.most_common(1)[0][1] >= 3
