"""Damaged state files through the real CLI: every kind of file draftheads writes and reads back, cut short and with
bytes changed at several offsets, then the command that reads it.

Each case: a non-zero exit, no traceback, a last line `error: ...` that names the file and says what to do, and the
damaged file left as it was (refused, never written over). A change that leaves the file valid (a byte inside a
string) is no damage and is not run; the cases that are run are counted. Every case is a process of its own, forked
from one that imported draftheads once (tests/forked_cli.py); a few are run again as `python -m draftheads` to show
that the forked runs end as real ones do.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import safetensors.torch
import yaml

from tests.test_bad_inputs import FIX_WORDS

ROOT = Path(__file__).resolve().parents[1]
JSON_STRUCTURE = b'{}[]:,"'
YAML_STRUCTURE = b":-\n"


# ---- what counts as damage ----------------------------------------------------------------------------------------


def json_damaged(intact: bytes, damaged: bytes) -> bool:
    try:
        return not isinstance(json.loads(damaged.decode("utf-8")), dict)
    except ValueError:   # JSONDecodeError and UnicodeDecodeError
        return True


def yaml_damaged(intact: bytes, damaged: bytes) -> bool:
    try:
        return not isinstance(yaml.safe_load(damaged.decode("utf-8")), dict)
    except (ValueError, yaml.YAMLError):
        return True


def tensors_damaged(intact: bytes, damaged: bytes) -> bool:
    """Unreadable, or other tensor names, dtypes or shapes than the intact file's."""
    def layout(data: bytes) -> dict:
        return {k: (v.dtype, tuple(v.shape)) for k, v in safetensors.torch.load(data).items()}
    try:
        return layout(damaged) != layout(intact)
    except Exception:  # noqa: BLE001 - the safetensors reader raises its own error type
        return True


def changed(intact: bytes, damaged: bytes) -> bool:
    """A checkpoint's files are listed with their sha256 in its manifest: any change is damage."""
    return damaged != intact


# ---- the damage done ----------------------------------------------------------------------------------------------


def spread(items: list, count: int) -> list:
    """`count` items evenly spread over `items`, first and last included."""
    if len(items) <= count:
        return list(items)
    return [items[round(i * (len(items) - 1) / (count - 1))] for i in range(count)]


def cut(data: bytes, k: int) -> bytes:
    return data[:k]


def flip(data: bytes, i: int, mask: int) -> bytes:
    return data[:i] + bytes([data[i] ^ mask]) + data[i + 1:]


def broken(data: bytes, i: int) -> bytes:
    return data[:i] + b"~" + data[i + 1:]


# Damage is named by where it falls in the file, not by offset: a checkpoint's copies of one file differ in length
# and all get the same damage.
def text_damage(data: bytes, structure: bytes) -> dict[str, bytes]:
    """Cut at 6 places (empty to all but the last 2 bytes); a byte's top bit flipped at 3 (never UTF-8 then);
    3 structural characters (braces, colons, quotes, line ends) replaced by '~'."""
    n = len(data)
    out = {f"cut-{name}": cut(data, k) for name, k in (("empty", 0), ("1", 1), ("quarter", n // 4), ("half", n // 2),
                                                        ("3-quarters", 3 * n // 4), ("end-2", n - 2))}
    out.update({f"flip-{name}": flip(data, i, 0x80) for name, i in (("tenth", n // 10), ("half", n // 2),
                                                                     ("9-tenths", 9 * n // 10))})
    places = spread([i for i, b in enumerate(data) if b in structure], 3)
    out.update({f"break-{name}": broken(data, i) for name, i in zip(("first", "middle", "last"), places)})
    return out


def safetensors_damage(data: bytes) -> dict[str, bytes]:
    """The 8-byte header length and the JSON header after it: cut inside each and in the tensors, the length made
    absurd, the header's bytes flipped and its structure broken."""
    end = 8 + int.from_bytes(data[:8], "little")
    middle = 8 + (end - 8) // 2
    out = {f"cut-{name}": cut(data, k) for name, k in (("empty", 0), ("length", 4), ("header-start", 8),
                                                        ("header-half", middle), ("header-end", end - 1),
                                                        ("tensors-half", end + (len(data) - end) // 2))}
    out.update({f"flip-{name}": flip(data, i, mask) for name, i, mask in (("length-low", 0, 0xFF),
                                                                           ("length-high", 5, 0x01),
                                                                           ("header-half", middle, 0x80))})
    places = spread([8 + i for i, b in enumerate(data[8:end]) if b in JSON_STRUCTURE], 3)
    out.update({f"break-{name}": broken(data, i) for name, i in zip(("first", "middle", "last"), places)})
    return out


# ---- the file kinds and the commands that read them ---------------------------------------------------------------


@dataclass
class Kind:
    name: str
    file: str  # the damaged file in the case folder
    args: list[str]  # after `draftheads`: {w} the shared world, {s} the written sources, {c} the case folder
    setup: Callable[[Path, Path, Path], None]  # (world, sources, case folder): the case's copy holding `file`
    damaged: Callable[[bytes, bytes], bool] = json_damaged
    damage: Callable[[bytes], dict[str, bytes]] = lambda data: text_damage(data, JSON_STRUCTURE)
    every: str | None = None  # the same damage to every file matching this glob (each checkpoint's copy)


def copy_data(w, s, c):
    shutil.copytree(s / "data", c / "data")


def copy_updated(w, s, c):
    shutil.copytree(s / "updated", c / "updated")


def copy_export(w, s, c):
    shutil.copytree(s / "export", c / "export")


def copy_report(w, s, c):
    shutil.copytree(s / "report", c / "report")


def copy_drafter(w, s, c):
    shutil.copytree(w / "runs" / "medusa" / "final" / "drafter", c / "drafter")


def copy_run(w, s, c):
    shutil.copytree(w / "runs" / "medusa", c / "run")


def unfinished_run(w, s, c):
    copy_run(w, s, c)
    shutil.rmtree(c / "run" / "final")


def copy_cache(w, s, c):
    shutil.copytree(w / "data", c / "data", ignore=shutil.ignore_patterns("features"))
    shutil.copytree(next((w / "data" / "features").glob("*")), c / "cache")


EVAL = ["--prompts", "{w}/prompts.jsonl", "--limit", "1", "--max-new-tokens", "4"]
TRAIN = ["train", "{w}/recipe.yaml", "train.output_dir={c}/run"]
META = "data/draftheads_data.json"
STEP = "run/step_000002"
KINDS = [
    Kind("data-meta-train", META, [*TRAIN, "data.output={c}/data"], copy_data),
    Kind("data-meta-data", META, ["data", "{w}/recipe.yaml", "data.output={c}/data", "data.num_prompts=2"], copy_data),
    Kind("data-meta-update-target", META, ["update-target", "{c}/data", "--out", "{c}/updated", "--base", "{w}/target",
                                           "--steps", "1"], copy_data),
    Kind("data-meta-drift", META, ["drift", "{w}/runs/medusa", "--target", "{w}/target", "--data", "{c}/data"],
         copy_data),
    Kind("update-marker", "updated/draftheads_update.json",
         ["update-target", "{s}/data", "--out", "{c}/updated", "--base", "{w}/target", "--steps", "1"], copy_updated),
    Kind("export-record-eval", "export/draftheads_export.json", ["eval", "{c}/export", "--target", "{w}/target", *EVAL],
         copy_export),
    Kind("export-record-export", "export/draftheads_export.json",
         ["export", "{w}/runs/medusa", "--format", "vllm", "--out", "{c}/export", "--target", "{w}/target",
          "--overwrite"], copy_export),
    Kind("report-tau-from", "report/report.json",
         ["eval", "lookup", "--tau-from", "{c}/report", "--target", "{w}/target", *EVAL], copy_report),
    Kind("report-old-report", "report/report.json",
         ["drift", "{w}/runs/medusa", "--target", "{w}/target", "--data", "{s}/data", "--old-report", "{c}/report"],
         copy_report),
    Kind("drafter-config-eval", "drafter/config.json", ["eval", "{c}/drafter", *EVAL], copy_drafter),
    Kind("drafter-config-export", "drafter/config.json",
         ["export", "{c}/drafter", "--format", "vllm", "--out", "{c}/out", "--target", "{w}/target"], copy_drafter),
    Kind("safetensors-eval", "drafter/model.safetensors", ["eval", "{c}/drafter", "--target", "{w}/target", *EVAL],
         copy_drafter, tensors_damaged, safetensors_damage),
    Kind("safetensors-export", "drafter/model.safetensors",
         ["export", "{c}/drafter", "--format", "vllm", "--out", "{c}/out", "--target", "{w}/target"], copy_drafter,
         tensors_damaged, safetensors_damage),
    Kind("checkpoint-trainer-state", f"{STEP}/trainer_state.json", TRAIN, unfinished_run, changed,
         every="run/step_*/trainer_state.json"),
    Kind("checkpoint-scheduler", f"{STEP}/scheduler.json", TRAIN, unfinished_run, changed,
         every="run/step_*/scheduler.json"),
    Kind("checkpoint-manifest", f"{STEP}/MANIFEST.json", TRAIN, unfinished_run, changed,
         every="run/step_*/MANIFEST.json"),
    Kind("feature-cache-manifest", "cache/manifest.json",
         [*TRAIN, "data.output={c}/data", "train.mode=offline", "train.feature_dtype=fp32",
          "train.feature_cache={c}/cache"], copy_cache),
    Kind("run-recipe-copy", f"{STEP}/recipe.yaml", ["eval", "{c}/run", *EVAL], copy_run, yaml_damaged,
         lambda data: text_damage(data, YAML_STRUCTURE)),
]
# one case of each command, run again as `python -m draftheads` in a fresh interpreter
CHECKED_AGAINST_REAL = ("data-meta-train", "report-old-report")


@dataclass
class DamageCase:
    kind: Kind
    damage: str  # its name: cut-N, flip-N or break-N
    folder: Path


def make_cases(world: Path, sources: Path, root: Path) -> tuple[list[DamageCase], int]:
    """Every kind x every damage that really damages its file, each in a folder of its own; (cases, skipped)."""
    cases, skipped = [], 0
    for kind in KINDS:
        probe = root / f"{kind.name}-intact"
        probe.mkdir()
        kind.setup(world, sources, probe)
        intact, seen = (probe / kind.file).read_bytes(), set()
        for name, data in kind.damage(intact).items():
            if data in seen or not kind.damaged(intact, data):   # the same bytes twice (a small file), or no damage
                skipped += 1
                continue
            seen.add(data)
            folder = root / f"{kind.name}-{name}"
            folder.mkdir()
            kind.setup(world, sources, folder)
            damage_files(kind, folder, name)
            cases.append(DamageCase(kind, name, folder))
        shutil.rmtree(probe)
    return cases, skipped


def damage_files(kind: Kind, folder: Path, name: str) -> None:
    files = sorted(folder.glob(kind.every)) if kind.every else [folder / kind.file]
    for path in files:
        path.write_bytes(kind.damage(path.read_bytes())[name])


def case_env(folder: Path) -> dict:
    """Nothing may be fetched: no hub, no package index; caches inside the case folder."""
    return {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PIP_NO_INDEX": "1",
            "TOKENIZERS_PARALLELISM": "false", "DRAFTHEADS_CACHE": str(folder / ".no-cache")}


def case_args(case: DamageCase, world: Path, sources: Path) -> list[str]:
    return [a.format(w=world, s=sources, c=case.folder) for a in case.kind.args]


# ---- the written sources and the runs ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def sources(world, tmp_path_factory):
    """State files made by draftheads itself from the shared world: a `draftheads data` folder, an updated target, a
    vLLM export, an eval report."""
    from draftheads.data.datagen import run_data
    from draftheads.data.target import load_target
    from draftheads.drift.target_update import UpdateConfig, update_target
    from draftheads.evaluation.eval_config import EvalConfig
    from draftheads.evaluation.evaluate import run_eval
    from draftheads.interop.export import export_drafter
    from draftheads.recipe import load_recipe

    s = tmp_path_factory.mktemp("written")
    target = str(world / "target")
    recipe = load_recipe(str(world / "recipe.yaml"), [f"data.output={s / 'data'}", "data.num_prompts=2",
                                                      f"data.prompts=[{{source: {world / 'prompts.jsonl'}}}]",
                                                      "data.max_new_tokens=8", "data.batch_size=2"])
    run_data(recipe, target=load_target(target, dtype="fp32", device="cpu"))
    update_target(s / "data", s / "updated", UpdateConfig(steps=1, batch_size=1, max_length=64, base=target),
                  target=load_target(target, dtype="fp32", device="cpu"), progress=lambda line: None)
    export_drafter(world / "runs" / "medusa", "vllm", s / "export", target=target)
    run_eval([str(world / "runs" / "medusa")], EvalConfig(prompts=str(world / "prompts.jsonl"), limit=1,
                                                          max_new_tokens=4), target=target, out=str(s / "report"),
             progress=False)
    return s


@pytest.fixture(scope="session")
def damage_results(world, sources, tmp_path_factory):
    """Every case run once: (cases, skipped, case folder name -> (exit status, stderr, whether the damaged file is
    as it was), seconds the runs took)."""
    root = tmp_path_factory.mktemp("damaged")
    cases, skipped = make_cases(world, sources, root)
    listed = [{"args": case_args(c, world, sources), "cwd": str(c.folder), "env": case_env(c.folder),
               "out": str(root / "out" / c.folder.name)} for c in cases]
    (root / "cases.json").write_text(json.dumps(listed))
    before = {c.folder.name: (c.folder / c.kind.file).read_bytes() for c in cases}
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "tests.forked_cli", str(root / "cases.json")], cwd=ROOT, check=True,
                   env={**os.environ, **case_env(root)}, timeout=1500)
    seconds = time.monotonic() - started
    found = {}
    for c in cases:
        out = root / "out" / c.folder.name
        found[c.folder.name] = (int((out / "rc").read_text()), (out / "stderr").read_text(),
                                (c.folder / c.kind.file).read_bytes() == before[c.folder.name])
    if os.environ.get("DRAFTHEADS_LIST_CASES"):  # the table for a closing note: case, exit status, last line
        with open(os.environ["DRAFTHEADS_LIST_CASES"], "w") as table:
            table.writelines(f"| {c.folder.name} | {found[c.folder.name][0]} | {last_line(found[c.folder.name][1])} |\n"
                             for c in cases)
    return cases, skipped, found, seconds


def last_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines()
             if line.strip() and not line.startswith(("The following values", "\t", "To avoid"))]
    return lines[-1] if lines else ""


def problems(case: DamageCase, rc: int, stderr: str, kept: bool) -> str | None:
    """Why the case does not meet the bar (None: it does)."""
    last, name = last_line(stderr), Path(case.kind.file).name
    if rc == 0:
        return "exit 0"
    if "Traceback" in stderr:
        return "a traceback: " + stderr[-1500:]
    if not (last.startswith("error: ") and name in last and any(w in last for w in FIX_WORDS)):
        return f"last line {last!r} (rc {rc})"
    return None if kept else "the damaged file was written over"


def test_every_kind_runs_many_real_damages(damage_results):
    cases, skipped, _, seconds = damage_results
    counts = {kind.name: sum(c.kind is kind for c in cases) for kind in KINDS}
    print(f"\n{len(cases)} damaged-file cases run in {seconds:.0f} s ({skipped} changes left their file valid or "
          f"repeated another and were not run): {counts}")
    assert len(cases) >= 100 and min(counts.values()) >= 4, counts


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_a_damaged_file_is_refused_in_one_line_naming_it(kind, damage_results):
    cases, _, found, _ = damage_results
    failed = {c.damage: problems(c, *found[c.folder.name]) for c in cases if c.kind is kind}
    assert failed and not any(failed.values()), {k: v for k, v in failed.items() if v}


def test_forked_runs_end_as_python_m_draftheads_does(damage_results, world, sources):
    """The forked runner is only faster: the same cases as real processes give the same status and last line."""
    cases, _, found, _ = damage_results
    chosen = [next(c for c in cases if c.kind.name == name) for name in CHECKED_AGAINST_REAL]

    def real(case: DamageCase):
        return subprocess.run([sys.executable, "-m", "draftheads", *case_args(case, world, sources)], cwd=case.folder,
                              env={**os.environ, **case_env(case.folder)}, capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(max_workers=2) as pool:
        for case, done in zip(chosen, pool.map(real, chosen)):
            rc, stderr, _ = found[case.folder.name]
            assert (done.returncode, last_line(done.stderr)) == (rc, last_line(stderr)), done.stderr[-2000:]
