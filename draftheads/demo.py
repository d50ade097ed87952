"""`draftheads demo`: data -> training -> evaluation on the embedded target, every artefact under one folder.

    run_demo()                                   # runs/demo/, the bundled recipe demo-smollm2
    run_demo("runs/demo", heads=("eagle", "medusa", "mtp"))          # also Medusa and MTP, if time allows
    run_demo(out, target_model=(model, tokenizer), **{"train.max_steps": 2})   # tests: a fixture, tiny overrides

Leaves, under `out`:
    data/         the target's own answers to prompts it wrote itself (`draftheads data`)
    eagle/        the training run: step_NNNNNN/ checkpoints, final/drafter/, logs/ (`draftheads train`)
    medusa/ mtp/  the same for the other heads, when asked for
    eval/         report.md, report.json and plots: every head beside the prompt-lookup baseline (`draftheads eval`)
    demo.json     what ran, how long each phase took, where everything is
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from pathlib import Path

from accelerate.state import AcceleratorState, GradientState

from draftheads.core.config import load_yaml
from draftheads.core.errors import DraftheadsError
from draftheads.core.state_files import read_json
from draftheads.data.datagen import run_data
from draftheads.data.target import load_target
from draftheads.evaluation.evaluate import run_eval
from draftheads.recipe import load_recipe, read_recipe_text, recipe_from_dict
from draftheads.training.loop import run_training

RECIPE = "demo-smollm2"
# Head sections of the other heads' bundled CPU recipes; data, training and evaluation stay the demo's.
HEAD_RECIPES = {"medusa": "medusa-smollm2", "mtp": "mtp-smollm2"}


def run_demo(out: str = "runs/demo", *, heads=("eagle",), target_model=None, combined: bool = True,
             progress: bool = True, **overrides) -> Path:
    """Run the whole pipeline into `out`; print the comparison table; return `out`.

    heads: which drafters to train ('eagle' uses the demo recipe's head; 'medusa'/'mtp' their bundled recipes').
    overrides: recipe values by dotted key, e.g. {"train.max_steps": 50} (or train__max_steps=50); strings are
    parsed as YAML like command-line overrides.
    target_model: (model, tokenizer) instead of loading recipe.target (tests).
    """
    out = Path(out)
    clock = Phases(out, heads)
    recipe = demo_recipe(out, overrides)
    unknown = [h for h in heads if h != recipe.head.type and h not in HEAD_RECIPES]
    if unknown or not heads:
        raise DraftheadsError(f"demo heads {list(heads)}: choose from eagle, medusa, mtp")
    clock.start("target", "using the given target" if target_model else
                f"loading the target {recipe.target.name} (fetched and converted once, then cached)")
    target = target_model or load_demo_target(recipe)
    clock.start("data", f"the target answers {recipe.data.num_prompts} prompts -> {recipe.data_dir}")
    run_data(recipe, target=target)
    runs = []
    for head in heads:
        head_recipe = recipe_for_head(recipe, head, out)
        clock.start(f"train {head}", f"training {head} for up to {head_recipe.train.max_steps} steps / "
                                     f"{head_recipe.train.time_budget_minutes or '-'} min -> {head_recipe.run_dir}")
        runs.append(run_training(head_recipe, target=target))
        _reset_accelerate()
    e = recipe.eval
    clock.start("eval", f"evaluating on {e.prompts} ({e.limit} prompts) beside the prompt-lookup baseline -> "
                        f"{out / 'eval'}")
    config = dataclasses.replace(e, combined=e.combined or "graft") if combined else e
    report = run_eval([str(r) for r in runs], config, out=str(out / "eval"), target_model=target, progress=progress)
    clock.finish(recipe, runs, report)
    return out


def demo_recipe(out: Path, overrides: dict):
    """The bundled demo recipe with `overrides` applied and its data and run folders placed under `out`."""
    text, source = read_recipe_text(RECIPE)
    data = load_yaml(text)
    for key, value in overrides.items():
        key = key.replace("__", ".")
        set_dotted(data, key, load_yaml(value, key) if isinstance(value, str) else value)
    data.setdefault("data", {})["output"] = str(out / "data")
    data.setdefault("train", {})["output_dir"] = str(out / data["head"]["type"])
    return recipe_from_dict(data, source)


def set_dotted(data: dict, key: str, value) -> None:
    *sections, last = key.split(".")
    node = data
    for part in sections:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise DraftheadsError(f"demo override '{key}': '{part}' is not a section")
    node[last] = value


def recipe_for_head(recipe, head: str, out: Path):
    """The demo recipe training `head` into out/<head>/: the demo's own head, or another head's bundled section."""
    if head == recipe.head.type:
        return recipe
    other = copy.deepcopy(recipe)
    other.head = load_recipe(HEAD_RECIPES[head]).head
    if other.head.draft_vocab_size is not None and recipe.head.draft_vocab_size is not None:
        # one draft vocabulary size for the demo's data and target
        other.head.draft_vocab_size = recipe.head.draft_vocab_size
    other.name = f"{recipe.name}-{head}"
    other.train.output_dir = str(out / head)
    return other


def load_demo_target(recipe):
    t = recipe.target
    return load_target(t.name, dtype=t.dtype, device=t.device, revision=t.revision,
                       trust_remote_code=t.trust_remote_code,
                       chat_template=t.chat_template, attn_implementation=t.attn_implementation)


def _reset_accelerate() -> None:
    """Let the next training run build its own Accelerator (accelerate keeps process-wide state)."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


class Phases:
    """Numbered progress lines with elapsed time, and demo.json at the end."""

    def __init__(self, out: Path, heads):
        self.out, self.total = out, 3 + len(heads)
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.current: tuple[str, float] | None = None

    def start(self, name: str, what: str) -> None:
        self._close()
        self.current = (name, time.perf_counter())
        print(f"\ndraftheads demo [{len(self.seconds) + 1}/{self.total}] {what} "
              f"(elapsed {self._elapsed()})", flush=True)

    def _close(self) -> None:
        if self.current:
            name, t0 = self.current
            self.seconds[name] = time.perf_counter() - t0
            self.current = None

    def _elapsed(self) -> str:
        s = int(time.perf_counter() - self.started)
        return f"{s // 60}:{s % 60:02d}"

    def finish(self, recipe, runs: list[Path], report: Path) -> None:
        self._close()
        measured = read_json(report / "report.json", "eval report", "run the demo again", required=("results",))
        summary = {
            "recipe": recipe.to_dict(), "seconds": self.seconds, "total_seconds": time.perf_counter() - self.started,
            "data": str(recipe.data_dir), "runs": [str(r) for r in runs],
            "drafters": [str(r / "final" / "drafter") for r in runs],
            "report": str(report / "report.md"), "results": measured["results"],
        }
        (self.out / "demo.json").write_text(json.dumps(summary, indent=1) + "\n")
        print(f"\ndraftheads demo: done in {self._elapsed()}. Data {recipe.data_dir}/, drafters "
              f"{', '.join(summary['drafters'])}, report {summary['report']} (tau includes the bonus token)",
              flush=True)
