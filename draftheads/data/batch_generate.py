"""Batched generation with the frozen target: left padding, one KV cache, finished rows dropped.

    outputs = generate_batch(model, [[ids...], ...], max_new_tokens=256, stop_ids=[2], pad_id=2)
    outputs[i].tokens -> generated ids (ending in a stop id when outputs[i].finished)

Why our own loop rather than `model.generate`: rows that have finished are removed from
the batch (and the cache) as they finish, so a batch costs the longest *unfinished* rows,
not max_new_tokens for everyone; the prefill computes logits for the last position only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from draftheads.core.sampling import fold_seed, sample, top1, warp_probs
from draftheads.data.chat import add_reply, render_ids, stop_token_ids, user_turn_prefix

# Drop finished rows once this share of the live batch is done: pruning copies the cache,
# so doing it every step would cost more than the wasted compute it saves.
PRUNE_FRACTION = 0.25


@dataclass
class Output:
    tokens: list[int]
    finished: bool  # ended on a stop token (not cut by its token budget)


def left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """[b, L] ids and [b, L] attention mask, padded on the left."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def pick(logits: torch.Tensor, temperature: float, top_p: float, generator) -> torch.Tensor:
    """[b, V] -> [b] next tokens: argmax for temperature 0, else a draw from the warped distribution."""
    if temperature == 0:
        return top1(logits)
    probs = warp_probs(logits, temperature=temperature, top_p=top_p)
    return sample(probs, generator)  # the generator must live on the model's device


@torch.inference_mode()
def generate_batch(model, prompts: list[list[int]], *, max_new_tokens: int | list[int], stop_ids, pad_id: int,
                   temperature: float = 0.0, top_p: float = 1.0,
                   generator: torch.Generator | None = None) -> list[Output]:
    """Generate a response for every prompt together; each row stops at a stop id or its budget."""
    device = next(model.parameters()).device
    budgets = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    outputs = [Output([], False) for _ in prompts]
    stops = torch.tensor(sorted(set(stop_ids)), device=device)
    ids, mask = left_pad(prompts, pad_id, device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                   use_cache=True, logits_to_keep=1).logits[:, -1]
    live = list(range(len(prompts)))  # row of the batch -> index into prompts
    next_pos = positions[:, -1] + 1
    done = [b <= 0 for b in budgets]
    for _ in range(max(budgets)):
        tokens = pick(logits, temperature, top_p, generator)
        is_stop = torch.isin(tokens, stops).tolist()
        for row, token in enumerate(tokens.tolist()):
            i = live[row]
            if done[i]:
                continue
            outputs[i].tokens.append(token)
            outputs[i].finished = is_stop[row]
            done[i] = is_stop[row] or len(outputs[i].tokens) >= budgets[i]
        keep = [row for row, i in enumerate(live) if not done[i]]
        if not keep:
            break
        if len(live) - len(keep) >= PRUNE_FRACTION * len(live):
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            tokens, mask, next_pos = tokens[index], mask[index], next_pos[index]
            live = [live[row] for row in keep]
        mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
        logits = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                       cache=cache, use_cache=True).logits[:, -1]
        next_pos = next_pos + 1
    return outputs


def length_sorted_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar length (longest first, so memory peaks early)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def temperature_batches(chats: list, data) -> list[list]:
    """Length-sorted batches of chats that share a sampling temperature (a prompt's answers may differ in it)."""
    batches = []
    for temperature in sorted({c.temperature for c in chats}, key=lambda t: -1.0 if t is None else t):
        same = [c for c in chats if c.temperature == temperature]
        batches += [[same[i] for i in batch]
                    for batch in length_sorted_batches([len(c.input_ids) for c in same], data.batch_size)]
    return batches


class LocalBackend:
    """Answers chats and writes self prompts with the target in this process."""

    def __init__(self, model, tokenizer, data):
        self.model, self.tokenizer, self.data = model, tokenizer, data
        self.stop_ids = stop_token_ids(tokenizer, getattr(model, "generation_config", None))
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.stop_ids[0]
        self.device = next(model.parameters()).device

    def _generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(fold_seed(seed))

    def answer(self, chats: list, seed: int, on_batch=None) -> None:
        """Answer every open chat, turn by turn, in length-sorted batches (in place)."""
        data, generator = self.data, self._generator(seed)
        while True:
            todo = [c for c in chats if not c.done]
            if not todo:
                return
            for group in temperature_batches(todo, data):
                budgets = [min(data.max_new_tokens, data.max_length - len(c.input_ids)) for c in group]
                temperature = group[0].temperature if group[0].temperature is not None else data.temperature
                outputs = generate_batch(self.model, [c.input_ids for c in group], max_new_tokens=budgets,
                                         stop_ids=self.stop_ids, pad_id=self.pad_id, temperature=temperature,
                                         top_p=data.top_p, generator=generator)
                for chat, out in zip(group, outputs):
                    add_reply(self.tokenizer, chat, out.tokens, self.stop_ids, data.max_length)
                if on_batch is not None:
                    on_batch(group, sum(len(o.tokens) for o in outputs))

    def reply(self, messages: list[str], max_tokens: int, temperature: float, seed: int) -> list[tuple[str, bool]]:
        """The target's answer to each user message (a one-turn chat, with the recipe's system prompt), in
        length-sorted batches: [(text, finished)] in the order of `messages`."""
        system = [{"role": "system", "content": self.data.system_prompt}] if self.data.system_prompt else []
        prompts = [render_ids(self.tokenizer, system + [{"role": "user", "content": m}], add_generation_prompt=True)
                   for m in messages]
        generator, out = self._generator(seed), [None] * len(messages)
        for batch in length_sorted_batches([len(p) for p in prompts], self.data.batch_size):
            outputs = generate_batch(self.model, [prompts[i] for i in batch], max_new_tokens=max_tokens,
                                     stop_ids=self.stop_ids, pad_id=self.pad_id, temperature=temperature,
                                     top_p=self.data.top_p, generator=generator)
            for i, o in zip(batch, outputs):
                out[i] = (self.tokenizer.decode(o.tokens[:-1] if o.finished else o.tokens, skip_special_tokens=True),
                          o.finished)
        return out

    def write(self, count: int, max_tokens: int, temperature: float, seed: int,
              lead: str = "") -> list[tuple[str, bool]]:
        """Magpie: the template up to a user's words (and `lead`), and the target writes the rest of the message."""
        prefix = user_turn_prefix(self.tokenizer, self.data.system_prompt, lead)
        generator, texts = self._generator(seed), []
        for start in range(0, count, self.data.batch_size):
            n = min(self.data.batch_size, count - start)
            for out in generate_batch(self.model, [prefix] * n, max_new_tokens=max_tokens, stop_ids=self.stop_ids,
                                      pad_id=self.pad_id, temperature=temperature, top_p=1.0, generator=generator):
                body = out.tokens[:-1] if out.finished else out.tokens
                texts.append((lead + self.tokenizer.decode(body, skip_special_tokens=False), out.finished))
        return texts
