"""Task kinds of self-written prompts: every kind of the evaluation set is written, by weight; passage kinds put an
article the target wrote (hundreds of words) before our instruction, retrieval among others' articles; multi-turn
prompts carry follow-ups; unusable pieces are redrawn and counted; the data folder of a recipe without kinds keeps its
identity; a killed run resumes with the same passages."""

from __future__ import annotations

import collections
import re

import pytest

from draftheads.core.errors import DraftheadsError
from draftheads.data.datagen import DataConfig
from draftheads.data.prompt_source import PromptSource
from draftheads.data.prompts import collect_prompts
from draftheads.data.self_prompts import kinds_prompts
from draftheads.data.task_kinds import FOLLOW_UPS, GENERAL, INTO_ENGLISH, KINDS, LEADS, Writers, clean_passage, loops

ARTICLE = ("The river town grew around a mill in {n}. Farmers brought grain from the hills, and traders came by "
           "boat. In the spring the water rose and covered the lower streets, so the people built their houses on "
           "stone. A school opened in the old church, and a bridge joined the two banks. Today the mill is a museum, "
           "the bridge carries cars, and visitors walk along the water to see the old stone houses and the market.")


class FakeTarget:
    """A writer that continues each lead with a numbered message, and a replier that writes articles, questions."""

    def __init__(self):
        self.count, self.replies = 0, []

    def write(self, n, max_tokens, temperature, seed, lead):
        out = []
        for _ in range(n):
            self.count += 1
            out.append((f"{lead} topic number {self.count} for the test.".strip(), True))
        return out

    def reply(self, messages, max_tokens, temperature, seed):
        self.replies.append((len(messages), max_tokens))
        out = []
        for m in messages:
            self.count += 1
            if "Write one question" in m:
                out.append((f"What did the town build in year {self.count}?", True))
            elif m.startswith(LEADS["translation"]):
                out.append((f"Le sujet numéro {self.count} pour le test.", True))
            else:
                out.append((ARTICLE.format(n=1700 + self.count), True))
        return out


def test_the_general_mixture_writes_every_kind_by_weight():
    fake = FakeTarget()
    src = PromptSource(source="self", kinds="general")
    prompts = kinds_prompts(Writers(fake.write, fake.reply), 62, src, seed=0, skipped=collections.Counter())
    counts = collections.Counter(p.kind for p in prompts)
    assert set(counts) == set(GENERAL) and sum(counts.values()) == 62   # 4 x the weights, which sum to 15.5
    assert counts["coding"] == 4 * counts["writing"]                       # 4 : 1 by weight
    assert len({tuple(p.turns) for p in prompts}) == len(prompts)          # distinct
    by_kind = {p.kind: p for p in prompts}
    assert any(by_kind["coding"].turns[0].startswith(lead) for lead in LEADS["coding"])
    translations = [p.turns[0] for p in prompts if p.kind == "translation"]
    assert sum(t.startswith(LEADS["translation"]) for t in translations) == 2          # from English: half
    assert sum(t.startswith(INTO_ENGLISH) and "Le sujet" in t for t in translations) == 2   # into English: half
    summary = by_kind["summarization"].turns[0]
    assert "The river town grew around a mill" in summary and len(summary.split()) > 80
    assert re.search(r"Question: What did the town build|based on the text above, what did", by_kind["qa"].turns[0],
                     re.I)
    docs = re.findall(r"Document \d:\n", by_kind["retrieval"].turns[0])
    assert len(docs) == 4 and "What did the town build" in by_kind["retrieval"].turns[0]
    multi = by_kind["multi-turn"].turns
    assert len(multi) in (2, 3) and all(turn in FOLLOW_UPS for turn in multi[1:])


def test_into_english_translates_back_what_the_target_translated_and_drops_copies():
    fake = FakeTarget()
    real_reply = fake.reply

    def copying_reply(messages, max_tokens, temperature, seed):   # every other translation is the English text again
        out = real_reply(messages, max_tokens, temperature, seed)
        return [(m.split(":", 1)[1] if i % 2 else text, done) for i, (m, (text, done)) in enumerate(zip(messages, out))]

    skipped = collections.Counter()
    src = PromptSource(source="self", kinds={"translation": 1})
    prompts = kinds_prompts(Writers(fake.write, copying_reply), 20, src, seed=2, skipped=skipped)
    back = [p.turns[0] for p in prompts if p.turns[0].startswith(INTO_ENGLISH)]
    assert len(prompts) == 20 and len(back) == 10
    assert all(re.fullmatch(r"[^\n]+\nLe sujet numéro \d+ pour le test\.", t) for t in back)
    assert skipped["self translations: a copy, not a translation"] > 0


def test_retrieval_documents_are_other_prompts_articles():
    fake = FakeTarget()
    src = PromptSource(source="self", kinds={"retrieval": 1})
    prompts = kinds_prompts(Writers(fake.write, fake.reply), 4, src, seed=1, skipped=collections.Counter())
    years = [set(re.findall(r"mill in (\d+)", p.turns[0])) for p in prompts]
    assert all(len(y) == 4 for y in years)                     # four different articles in each
    assert len(set.union(*years)) < 4 * len(prompts)           # shared among the prompts: the others' articles


def test_passages_are_written_at_passage_tokens_and_unusable_ones_redrawn():
    fake = FakeTarget()
    real_reply = fake.reply
    calls = []

    def reply(messages, max_tokens, temperature, seed):
        calls.append(max_tokens)
        if len(calls) == 1:   # the first round of articles: too short, looping, cut mid-word
            return [("Too short.", True), ("the same six words again " * 20, True),
                    ("A cut article with no end", False)] \
                + real_reply(messages[3:], max_tokens, temperature, seed)
        return real_reply(messages, max_tokens, temperature, seed)

    skipped = collections.Counter()
    src = PromptSource(source="self", kinds={"summarization": 1}, passage_tokens=700)
    prompts = kinds_prompts(Writers(fake.write, reply), 5, src, seed=2, skipped=skipped)
    assert len(prompts) == 5 and calls[0] == 700
    assert skipped["self passages: too short"] == 2   # the cut one has no full sentence left
    assert skipped["self passages: looping, broken characters or template markup"] == 1


def test_clean_passage_keeps_real_articles_and_cuts_unfinished_ones():
    text, reason = clean_passage(ARTICLE.format(n=1800) + " And then the", finished=False)
    assert reason is None and text.endswith("the market.")
    assert not loops(ARTICLE.format(n=1)) and loops("one two three four five six " * 3)


@pytest.mark.parametrize("kwargs, message", [
    ({"source": "humaneval", "kinds": "general"}, "kinds only apply to source 'self'"),
    ({"source": "self", "kinds": "general", "starts_with": "Write"}, "give kinds or starts_with, not both"),
    ({"source": "self", "kinds": {"poetry": 1}}, "unknown task kind 'poetry'"),
    ({"source": "self", "kinds": {"writing": 0}}, "weight of kind 'writing' must be a positive number"),
    ({"source": "self", "kinds": "everything"}, "kinds must be 'general' or a mapping"),
])
def test_kinds_are_checked(kwargs, message):
    with pytest.raises(DraftheadsError, match=message):
        PromptSource(**kwargs)


def test_collect_prompts_with_kinds_needs_the_target_to_reply():
    fake = FakeTarget()
    data = DataConfig(num_prompts=4, prompts=[PromptSource(source="self", kinds={"qa": 1})])
    with pytest.raises(DraftheadsError, match="needs the target to write passages"):
        collect_prompts(data, write=fake.write)
    prompts, _ = collect_prompts(data, write=fake.write, reply=fake.reply)
    assert len(prompts) == 4 and {p.kind for p in prompts} == {"qa"}


def test_every_kind_is_known_and_weighted_in_the_default():
    assert set(GENERAL) == set(KINDS)


def test_a_recipe_without_kinds_keeps_its_data_folders_identity():
    """kinds and passage_tokens were added after data folders existed: unset, they leave the recipe hash alone."""
    from draftheads.core.config import to_dict
    from draftheads.data.datastore import recipe_hash, settings_hash
    from draftheads.recipe import load_recipe

    recipe = load_recipe("eagle-smollm2")
    data = to_dict(recipe.data)
    before = {**data, "prompts": [{k: v for k, v in src.items() if k not in ("kinds", "passage_tokens")}
                                  for src in data["prompts"]]}
    assert settings_hash(to_dict(recipe.target), before) == recipe_hash(recipe)
    changed = {**data, "prompts": [{**src, "passage_tokens": 300} for src in data["prompts"]]}
    assert settings_hash(to_dict(recipe.target), changed) != recipe_hash(recipe)


def test_a_killed_run_writes_the_same_passages_again(tmp_path):
    from draftheads.data.datagen import resumable_writer

    fake = FakeTarget()
    messages = [f"Write an article about town {i}." for i in range(10)]
    write, reply = resumable_writer(tmp_path / "straight.jsonl", fake.write, 4, fake.reply)
    full = reply(messages, 300, 0.7, 3)
    calls = []

    def dies_on_third_chunk(part, *args):
        calls.append(len(part))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return FakeTarget().reply(part, *args)

    partial = tmp_path / "partial.jsonl"
    with pytest.raises(KeyboardInterrupt):
        resumable_writer(partial, fake.write, 4, dies_on_third_chunk)[1](messages, 300, 0.7, 3)
    resumed = resumable_writer(partial, fake.write, 4, lambda part, *a: full[8:])[1](messages, 300, 0.7, 3)
    assert len(resumed) == 10 and resumed[8:] == full[8:]
    assert calls == [4, 4, 2]


def test_the_local_backend_replies_in_order_and_seeded(llama_target, tokenizer):
    from draftheads.data.batch_generate import LocalBackend

    backend = LocalBackend(llama_target, tokenizer, DataConfig(batch_size=2))
    messages = ["Tell me about rivers.", "Hi", "Write a long article about the history of bread and mills."]
    first = backend.reply(messages, 12, 1.0, seed=4)
    assert len(first) == 3 and first == backend.reply(messages, 12, 1.0, seed=4)
    assert all(isinstance(text, str) and isinstance(done, bool) for text, done in first)


def test_seeds_past_int64_are_folded_not_refused(llama_target, tokenizer):
    """A grown folder's seeds (salt 7,919 x the rows it holds, times each writer's multipliers) passed 2**63 after 600
    translation prompts: torch.Generator refused them with an overflow traceback."""
    from draftheads.data.batch_generate import LocalBackend

    backend = LocalBackend(llama_target, tokenizer, DataConfig(batch_size=2))
    huge = 4_751_400 * 1009 * 37 * 7 * 1000 * 100_003
    assert huge > 2**63
    assert backend.write(2, 6, 1.0, huge, "Write") == backend.write(2, 6, 1.0, huge % 2**63, "Write")
