"""A hardware cost profile: what one target forward, one acceptance rule and one drafter cost on this machine.

Speculative decoding pays when tau / (verify cost + draft cost) > 1, both costs in plain decode steps. On a
GPU verifying a few dozen tokens costs about one decode step; on a CPU it costs more, so every prediction here
is made from times measured on the machine it is for:

    TargetProfile   a verify forward (greedy pick included) of n query tokens on c cached ones, on a grid of
                    n x c, read back by linear interpolation; the acceptance rules' own cost over n nodes
    DrafterProfile  a drafter's time per step, fitted as base + per level * depth + per node * nodes from
                    steps drafted with a few trees, and its prompt-observing cost per prompt token

Profiles are cached as JSON under $DRAFTHEADS_PROFILES (default: profiles/ in the cache folder), keyed by what they
depend on (target architecture and weights fingerprint, dtype, device, CPU, threads, library versions; a drafter's
folder contents), so `draftheads eval` measures each once per machine. `draftheads profile` prints and plots them.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftheads.core.state_files import DamagedFile, read_json
from draftheads.core.target_dims import context_limit
from draftheads.core.targets import cache_dir
from draftheads.core.tree import Tree
from draftheads.core.version import __version__
from draftheads.data.hardware import environment
from draftheads.decoding.accept import accept, target_warp
from draftheads.decoding.decoder import clock
from draftheads.decoding.generate import speculative_generate
from draftheads.decoding.settings import DecodeSettings, applied_rule
from draftheads.decoding.verify import compact_cache, new_cache, prefill, verify

PROFILE_VERSION = 4
CONTEXTS = (0, 128, 512, 1024, 2048)
QUERIES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
REPEATS = 7


# ---------------------------------------------------------------- interpolation


def interpolate(xs: list[float], ys: list[float | None], x: float) -> float:
    """Piecewise-linear y(x) through the measured points (None: not measured); beyond the ends, the line through
    the two nearest points."""
    points = [(a, b) for a, b in zip(xs, ys) if b is not None]
    if len(points) == 1:
        return points[0][1]
    i = next((i for i in range(1, len(points)) if x <= points[i][0]), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


LINEAR_QUERIES = 64


def row_time(queries: list[int], row: list[float | None], n: float) -> float:
    """One context's forward time at n tokens: its line fitted to the cells up to LINEAR_QUERIES tokens (slope at
    least 0), the cells themselves beyond."""
    points = [(q, t) for q, t in zip(queries, row) if t is not None and q <= LINEAR_QUERIES]
    if n > LINEAR_QUERIES or len(points) < 3:
        return interpolate(queries, row, n)
    mean_q = sum(q for q, _ in points) / len(points)
    mean_t = sum(t for _, t in points) / len(points)
    slope = max(0.0, sum((q - mean_q) * (t - mean_t) for q, t in points) / sum((q - mean_q) ** 2 for q, _ in points))
    return mean_t + slope * (n - mean_q)


# ---------------------------------------------------------------- the target


@dataclass
class TargetProfile:
    """forward_s[i][j]: seconds of a verify forward of queries[j] tokens on contexts[i] cached ones (None where
    they do not fit the target's context). rule_s[setting][j]: what warping and an acceptance rule add over
    queries[j] nodes ('greedy', 'strict T=0.7 k=0 p=1', ...), beyond the greedy pick the forward includes."""

    key: dict
    contexts: list[int]
    queries: list[int]
    forward_s: list[list[float | None]]
    rule_s: dict[str, list[float]] = field(default_factory=dict)
    created: str = ""

    def forward(self, queries: float, context: float) -> float:
        """Seconds of one forward of `queries` tokens on `context` cached tokens.

        On a cache, up to LINEAR_QUERIES tokens, a row is read through its least-squares line: there a forward costs
        a fixed part plus a small one per token, and single cells are noisy enough (a lucky fastest run at 1 token,
        an unlucky one at 2) that reading them one by one overstated a verify's cost against what the loop then
        took. Prefills (context 0) and bigger forwards interpolate cells."""
        measured = [(c, row) for c, row in zip(self.contexts, self.forward_s) if any(t is not None for t in row)]
        if context > 0:
            # a verify reads the rows timed on a cache, never the prefill row: a forward without a cache takes another
            # path (at a few tokens several times a 1-token one), so reading between it and the 128-token row
            # overstated a verify on a short prompt against what the loop took
            cached = [(c, row) for c, row in measured if c > 0]
            at = [row_time(self.queries, row, queries) for _, row in cached]
            return interpolate([c for c, _ in cached], at, max(context, cached[0][0]))
        return interpolate(self.queries, measured[0][1], queries)

    def prefill(self, tokens: int) -> float:
        return self.forward(tokens, 0)

    def decode_step(self, context: float) -> float:
        return self.forward(1, context)

    def rule(self, setting: str, nodes: float) -> float:
        return interpolate(self.queries, self.rule_s[setting], nodes) if setting in self.rule_s else 0.0


def rule_setting(rule: str, temperature: float, top_k: int = DecodeSettings.top_k,
                 top_p: float = DecodeSettings.top_p) -> str:
    """The name a rule's cost is stored under. At T = 0 every rule is the greedy rule (settings.applied_rule)."""
    if applied_rule(rule, temperature) == "greedy":
        return "greedy"
    return f"{rule} T={temperature:g} k={top_k} p={top_p:g}"


def hardware() -> dict:
    """The facts a time depends on besides the model: the processor, the threads, the libraries."""
    env = environment()
    return {"cpu": env["hardware"]["cpu"], "cuda": (env["hardware"]["cuda"] or {}).get("device"),
            "threads": torch.get_num_threads(), "machine": platform.machine(), "torch": torch.__version__,
            "transformers": env["versions"]["transformers"], "draftheads": __version__}


def weights_fingerprint(module: torch.nn.Module) -> str:
    """A cheap fingerprint of a module's weights (shapes and a few sums): tells two random tiny targets apart."""
    digest = hashlib.sha256()
    params = list(module.parameters())
    for p in params[:3] + params[-3:]:
        digest.update(str(tuple(p.shape)).encode())
        digest.update(f"{float(p.detach().float().sum()):.6e}".encode())
    return digest.hexdigest()[:16]


def target_key(model) -> dict:
    config = model.config.to_json_string(use_diff=False)
    return {"version": PROFILE_VERSION, "architecture": type(model).__name__,
            "config": hashlib.sha256(config.encode()).hexdigest()[:16], "weights": weights_fingerprint(model),
            "dtype": str(model.dtype).removeprefix("torch."), "device": str(model.device), **hardware()}


def key_hash(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


def profile_folder() -> Path:
    """$DRAFTHEADS_PROFILES, else profiles/ in the cache folder."""
    return Path(os.environ.get("DRAFTHEADS_PROFILES") or cache_dir() / "profiles")


def profile_path(kind: str, key: dict) -> Path:
    return profile_folder() / f"{kind}-{key_hash(key)}.json"


def save(path: Path, data: dict) -> None:
    """Write atomically (a profile half written by a killed run is never read)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def load(path: Path) -> dict | None:
    """A cached profile; None when absent or damaged (measured again, and a damaged one said so before it is
    written over)."""
    if not path.exists():
        return None
    try:
        return read_json(path, "cached cost profile", "measuring it again")
    except DamagedFile as e:
        print(f"draftheads profile: {e}", file=sys.stderr, flush=True)
        return None


def cached_profile(kind: str, model, measure, timing: str, timed: str, refresh: bool = False,
                   progress=print) -> tuple[dict, Path]:
    """(the saved fields, the file) of this target's `kind` profile on this machine: read back, or, when absent,
    damaged or `refresh`, the fields `measure()` returns timed now and saved with the key and the time."""
    key = target_key(model)
    path = profile_path(kind, key)
    saved = None if refresh else load(path)
    if saved is None:
        progress(f"draftheads profile: timing the target's {timing} (once per target, dtype and machine)")
        started = time.time()
        saved = {"key": key, **measure(), "created": time.strftime("%Y-%m-%d %H:%M:%S")}
        save(path, saved)
        progress(f"draftheads profile: {timed} timed in {time.time() - started:.0f} s; cached in {path}")
    return saved, path


def _times(run, device, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = clock(device)
        run()
        times.append(clock(device) - t0)
    return times


def fastest_time(run, device, repeats: int) -> float:
    """The fastest of `repeats` runs: another process on a shared machine only ever adds time, in bursts that a
    median of a few runs still catches."""
    return min(_times(run, device, repeats))


def _median_time(run, device, repeats: int) -> float:
    return statistics.median(_times(run, device, repeats))


def star(n: int) -> Tree:
    """A tree of n nodes: the root and n - 1 children (its mask and positions are as cheap as any)."""
    return Tree.from_paths([(r,) for r in range(n - 1)])


@torch.no_grad()
def measure_forwards(model, contexts=CONTEXTS, queries=QUERIES, repeats: int = REPEATS) -> list[list[float | None]]:
    """forward_s[i][j] as TargetProfile defines it: verify + greedy pick + the cache cut back, per cell: the fastest
    of `repeats` consecutive runs after two untimed ones, each row made monotone in the tokens. Consecutive, as the
    loop runs them: timing the sizes in turn slowed the one-token forwards more than the rest, so verify costs came
    out well below those the loop then took."""
    device, limit = model.device, context_limit(model)
    vocab = model.config.get_text_config(decoder=True).vocab_size
    generator = torch.Generator().manual_seed(0)
    grid = []
    for context in contexts:
        cache = new_cache(model)
        if context:
            prefill(model, torch.randint(vocab, (1, context), generator=generator).to(device), cache)
        row = []
        for n in queries:
            if context + n >= limit:
                row.append(None)
                continue
            step = forward_step(model, cache, context, torch.randint(vocab, (1, n), generator=generator).to(device))
            step()
            step()
            row.append(fastest_time(step, device, repeats))
        grid.append(monotone(row))
    return grid


def monotone(row: list[float | None]) -> list[float | None]:
    """A forward of more tokens never takes less time: a cell above a larger one was slowed by the machine, and
    is lowered to it."""
    out, smallest = list(row), float("inf")
    for j in reversed(range(len(out))):
        if out[j] is not None:
            smallest = out[j] = min(out[j], smallest)
    return out


def forward_step(model, cache, context: int, tokens: torch.Tensor):
    """A function running one timed cell: a prefill of the tokens (context 0) or a verify of them on the cache."""
    n = tokens.shape[1]
    tree, device = star(n), tokens.device

    def step():
        if context == 0:
            prefill(model, tokens, new_cache(model))
            return
        out = verify(model, cache, tokens, tree)
        out.logits.max(-1)
        compact_cache(cache, n, torch.tensor([0], device=device))
        cache.crop(context - cache.get_seq_length())   # negative: drop that many from the end

    return step


@torch.no_grad()
def measure_rule(model, setting: str, rule: str, temperature: float, top_k: int, top_p: float,
                 queries=QUERIES, repeats: int = REPEATS) -> list[float]:
    """What `setting` adds to a step over n nodes: warping the [n, V] logits and running the rule."""
    vocab = model.config.get_text_config(decoder=True).vocab_size
    settings = DecodeSettings(rule, temperature, top_k, top_p, max_new_tokens=1, eos_token_id=[])
    warp = target_warp(settings)
    generator = torch.Generator().manual_seed(0)
    out = []
    for n in queries:
        tree = star(n)
        logits = (3 * torch.randn(1, n, vocab, generator=generator)).to(model.device, model.dtype)
        tokens = torch.arange(n, device=model.device)[None] % vocab   # distinct siblings, as drafted
        q = None
        if settings.applied_rule != "greedy":
            q = torch.softmax(torch.randn(1, n, vocab, generator=generator), -1).to(model.device)

        def run():
            accept(settings.applied_rule, tree, tokens, logits, q, generator, epsilon=settings.typical_epsilon,
                   delta=settings.typical_delta, warp=warp)

        def greedy_pick():   # already counted in the forward's time
            logits.max(-1)

        run()
        out.append(max(0.0, _median_time(run, model.device, repeats)
                            - _median_time(greedy_pick, model.device, repeats)))
    return out


def target_profile(model, *, refresh: bool = False, rules: list[tuple] = (), progress=print) -> TargetProfile:
    """The cached profile of this target on this machine (measured now if absent or `refresh`), with the cost of
    every (rule, temperature, top_k, top_p) in `rules` measured if it is not there yet."""
    saved, path = cached_profile("target", model, lambda: {"contexts": list(CONTEXTS), "queries": list(QUERIES),
                                                           "rule_s": {}, "forward_s": measure_forwards(model)},
                                 "forwards", "target", refresh, progress)
    changed = False
    for rule, temperature, top_k, top_p in [("greedy", 0.0, 0, 1.0), *rules]:
        setting = rule_setting(rule, temperature, top_k, top_p)
        if setting not in saved["rule_s"]:
            saved["rule_s"][setting] = measure_rule(model, setting, rule, temperature, top_k, top_p)
            changed = True
    if changed:
        save(path, saved)
    return TargetProfile(**saved)


# ---------------------------------------------------------------- drafters


@dataclass
class DrafterProfile:
    """Seconds per step = base_s + level_s * depth + node_s * nodes (fitted by least squares over the probe trees'
    steps), and observe_s per prompt token (reading the prompt before the first step)."""

    key: dict
    base_s: float
    level_s: float
    node_s: float
    observe_s: float
    plain_step_s: float     # a plain decode step of the same prompt, timed with the probes
    probes: list[dict] = field(default_factory=list)   # per probe tree: depth, nodes, measured s per step

    def step(self, depth: float, nodes: float) -> float:
        return max(0.0, self.base_s + self.level_s * depth + self.node_s * nodes)

    def step_in_decode_steps(self, depth: float, nodes: float) -> float:
        """The draft time per step in plain decode steps timed beside it: a ratio, which a machine running faster
        or slower since (another load, another clock) changes far less than the seconds."""
        return self.step(depth, nodes) / self.plain_step_s


def folder_fingerprint(folder: Path) -> str:
    """Names, sizes and modification times of the drafter folder's files."""
    digest = hashlib.sha256()
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file():
            stat = path.stat()
            digest.update(f"{path.relative_to(folder)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def probe_trees(draft_limit: int | None) -> list[Tree]:
    """Chains and wide trees whose steps separate the cost of a draft level from that of a node."""
    depth = min(4, draft_limit or 4)
    wide = Tree.from_paths([(0,) * d + (r,) for d in range(depth) for r in range(4)])
    return [Tree.chain(1), Tree.chain(depth), wide]


def fit_costs(points: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    """(base, per level, per node) from (depth, nodes, seconds) points by least squares; a cost the probes
    cannot separate (collinear columns) is folded into the others."""
    a = torch.tensor([[1.0, d, n] for d, n, _ in points], dtype=torch.float64)
    y = torch.tensor([s for _, _, s in points], dtype=torch.float64)[:, None]
    solution = torch.linalg.lstsq(a, y, driver="gelsd").solution[:, 0]
    base, level, node = (float(v) for v in solution)
    if node < 0:     # noise: refit without the per-node term
        base, level = (float(v) for v in torch.linalg.lstsq(a[:, :2], y, driver="gelsd").solution[:, 0])
        node = 0.0
    if level < 0:
        level = 0.0
    return base, level, node


def drafter_profile(model, drafter, *, prompt: torch.Tensor, name: str, key: dict, draft_limit: int | None = None,
                    refresh: bool = False, new_tokens: int = 48, progress=print) -> DrafterProfile:
    """The cached cost profile of `drafter` with this target (measured now if absent): greedy generations of
    `new_tokens` from `prompt` with each probe tree, every step's draft time kept."""
    key = {**key, "target": target_key(model), "prompt_tokens": int(prompt.numel()), "new_tokens": new_tokens}
    path = profile_path("drafter", key)
    saved = None if refresh else load(path)
    if saved is None:
        progress(f"draftheads profile: timing drafter {name}")
        points, probes, observe = [], [], []
        for tree in probe_trees(draft_limit):
            speculative_generate(model, drafter, prompt, 8, tree=tree, eos_token_id=[])  # untimed warm-up
            result = speculative_generate(model, drafter, prompt, new_tokens, tree=tree, eos_token_id=[])
            stats = result.stats
            steps = [(t.depth, n, s) for t, n, s in zip([tree] * stats.steps, stats.step_nodes, stats.step_draft_s)]
            points += steps
            probes.append({"depth": tree.depth, "nodes": tree.num_nodes, "draft_s": stats.mean_draft_s})
            observe.append(stats.draft_prefill_s / max(1, stats.prompt_tokens))
        plain = speculative_generate(model, None, prompt, new_tokens, eos_token_id=[]).stats
        base, level, node = fit_costs(points)
        saved = {"key": key, "base_s": base, "level_s": level, "node_s": node, "observe_s": statistics.median(observe),
                 "plain_step_s": plain.decode_s / max(1, plain.steps), "probes": probes}
        save(path, saved)
    return DrafterProfile(**saved)
