"""Bad inputs through the real CLI, each in a subprocess on tiny fixture targets.

For every case: a non-zero exit, no traceback, a last line `error: <problem>; <fix>` that names
the problem, and nothing written, changed or removed, neither in the shared fixtures nor in the
case's own folder. The cases run two at a time (the machine has two cores); each test reads its
result.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A last line names the fix when it says what to do: after a semicolon, or as a rule or an instruction.
FIX_WORDS = (";", " must ", " use ", "choose", " give ", " set ", " pass ", "rerun", " run ")


@dataclass
class Case:
    name: str
    args: list[str]  # after `draftheads`, with {w} the shared fixtures' folder and {c} the case's
    expect: str  # in the last line of stderr
    setup: Callable[[Path, Path], dict | None] | None = None  # (world, case folder) -> files the case needs (and
                                                              # any more names its args use, e.g. {url})
    command: list[str] | None = None  # instead of `python -m draftheads` (accelerate launch --quiet: exit 1, no
                                      # traceback of its own)
    env: dict = field(default_factory=dict)


def copy_run(w: Path, c: Path) -> None:
    shutil.copytree(w / "runs" / "medusa", c / "run")


def truncate(path: Path, keep: int = 64) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def damaged_checkpoints(w, c):
    copy_run(w, c)
    for step in (c / "run").glob("step_*"):
        (step / "optimizer.bin").unlink()
    shutil.rmtree(c / "run" / "final")


def unfinished_run(w, c):
    copy_run(w, c)
    shutil.rmtree(c / "run" / "final")


def copy_data(w, c):
    shutil.copytree(w / "data", c / "data", ignore=shutil.ignore_patterns("features"))


def truncated_arrow(w, c):
    copy_data(w, c)
    truncate(next((c / "data").glob("*.arrow")), 200)


def truncated_shard(w, c):
    copy_data(w, c)
    shutil.copytree(next((w / "data" / "features").glob("*")), c / "cache")
    truncate(c / "cache" / "shard_00000.npy", 300)


def zero_loss_mask(w, c):
    from datasets import load_from_disk

    rows = load_from_disk(str(w / "data"), keep_in_memory=True)  # map() would write a cache file beside the shared data
    rows.map(lambda r: {"loss_mask": [0] * len(r["loss_mask"])}, keep_in_memory=True).save_to_disk(str(c / "data"))


def first_row_unanswered(w, c):
    from datasets import load_from_disk

    rows = load_from_disk(str(w / "data"), keep_in_memory=True)
    rows.map(lambda r, i: {"loss_mask": [0] * len(r["loss_mask"]) if i == 0 else r["loss_mask"]}, with_indices=True,
             keep_in_memory=True).save_to_disk(str(c / "data"))


def killed_data_folder(w, c):
    (c / "data" / "shards").mkdir(parents=True)
    (c / "data" / "prompts.jsonl").write_text('{"turns": ["hi"]}\n')
    (c / "data" / "draftheads_data.json").write_text(json.dumps({"recipe_hash": "x", "complete": False}))


def bad_prompts(w, c):
    lines = [json.dumps({"prompt": f"question {i}"}) for i in range(4)]
    lines[2] = '{"prompt": "unterminated'
    (c / "prompts.jsonl").write_text("\n".join(lines) + "\n")


def truncated_target(w, c):
    shutil.copytree(w / "target", c / "target")
    truncate(c / "target" / "model.safetensors", 1000)


def truncated_drafter(w, c):
    copy_run(w, c)
    truncate(c / "run" / "final" / "drafter" / "model.safetensors", 1000)


def bad_gguf(w, c):
    (c / "model.gguf").write_bytes(b"GGUF" + b"\0" * 60)


def user_folder(w, c):
    (c / "mine").mkdir()
    (c / "mine" / "notes.txt").write_text("keep me")


def previous_export(w, c):
    subprocess.run([sys.executable, "-m", "draftheads", "export", str(w / "runs" / "medusa"), "--format", "tgi",
                    "--out", str(c / "out"), "--target", str(w / "target")], check=True, capture_output=True, cwd=c)


def a_file(w, c):
    (c / "afile").write_text("x")


def bad_yaml(w, c):
    (c / "bad.yaml").write_text("target: {name: [\n")


class Metrics(http.server.BaseHTTPRequestHandler):
    """A server's /metrics, answering every poll with the class's `body`."""

    body = b""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def serving(drafted: bytes, accepted: bytes = b"1"):
    """A setup that starts a local server whose /metrics holds these counter values, for the case's whole run (a
    daemon thread); the case's args name it {url}."""
    body = (b"llamacpp:spec_decode_num_draft_tokens_total " + drafted + b"\n"
            b"llamacpp:spec_decode_num_accepted_tokens_total " + accepted + b"\n")

    def setup(w, c):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("Served", (Metrics,), {"body": body}))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return {"url": f"http://127.0.0.1:{server.server_address[1]}"}

    return setup


def narrow_target(w, c):
    """The fixture target at hidden size 32, with weights: a target none of the world's drafters (hidden 64) fit."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(w / "target", hidden_size=32, intermediate_size=64, head_dim=8)
    AutoModelForCausalLM.from_config(config).save_pretrained(c / "narrow")


def narrowed_weights(w, c):
    """A copy of the run whose drafter's tensors were cut to hidden size 32, under a config.json that says 64."""
    from safetensors.torch import load_file, save_file

    copy_run(w, c)
    weights = c / "run" / "final" / "drafter" / "model.safetensors"
    save_file({k: v[..., :32].contiguous() for k, v in load_file(weights).items()}, weights, metadata={"format": "pt"})


TRAIN = ["train", "{w}/recipe.yaml", "train.output_dir={c}/run"]
EVAL = ["eval", "{w}/runs/medusa", "--prompts", "{w}/prompts.jsonl", "--limit", "1", "--max-new-tokens", "4"]
ENGINE_EVAL = ["engine", "eval", "llama.cpp", "{w}/runs/medusa", "--prompts", "{w}/prompts.jsonl", "--limit", "1",
               "--max-new-tokens", "4"]
EXPORT = ["export", "{w}/runs/medusa", "--target", "{w}/target"]
DATA = ["data", "{w}/recipe.yaml", "data.output={c}/data", "data.num_prompts=2"]
MONITOR = ["monitor", "{url}", "--baseline", "0.5", "--polls", "1", "--interval", "0"]
DRIFT = ["drift", "{w}/runs/medusa", "--target", "{w}/target", "--limit", "1", "--max-new-tokens", "4"]

CASES = [
    # recipes and overrides
    Case("unknown-recipe", ["train", "nope"], "unknown recipe 'nope'"),
    Case("missing-recipe-file", ["train", "{c}/missing.yaml"], "not found"),
    Case("bad-yaml", ["train", "{c}/bad.yaml"], "not valid YAML", bad_yaml),
    Case("unknown-key", [*TRAIN, "train.lrr=1"], "unknown key 'lrr'"),
    Case("override-without-value", [*TRAIN, "train.lr"], "must look like section.key=value"),
    Case("unknown-head-type", [*TRAIN, "head.type=medusae"], "unknown head type 'medusae'"),
    Case("top-p-out-of-range", [*TRAIN, "data.top_p=1.5"], "data.top_p must be in (0, 1]"),
    Case("unknown-loss", [*TRAIN, "train.loss=lk"], "'lk' is not one of"),
    Case("depth-weights-for-other-depths", [*TRAIN, "train.depth_weights=[1, 0.5, 0.25, 0.1]"],
         "lists 4 weights but this drafter trains"),
    Case("loss-dspark-cannot-take", [*TRAIN, "head={{type: dspark, block_size: 3}}", "train.loss=tv"],
         "DSpark trains with its own"),
    Case("init-target-layer-on-eagle", [*TRAIN, "head={{type: eagle, init: target_layer}}"],
         "does not apply to head.type eagle"),
    Case("temperatures-for-other-answers", [*DATA, "data.samples_per_prompt=2", "data.temperatures=[0.7]"],
         "give one per answer"),
    Case("oversized-default-tree", [*TRAIN, "head={{type: eagle, default_tree: 'chain:1000'}}"],
         "head.default_tree: tree 'chain:1000' is too large"),
    Case("typical-epsilon-1", ["recipe", "show", "{w}/recipe.yaml", "eval.typical_epsilon=1.5", "--no-target"],
         "eval.typical_epsilon"),
    Case("typical-delta-1", ["recipe", "show", "{w}/recipe.yaml", "eval.typical_delta=1", "--no-target"],
         "eval.typical_delta"),
    Case("unknown-device", [*TRAIN, "target.device=tpu"], "target.device 'tpu'"),
    Case("cuda-without-gpu", [*TRAIN, "target.device=cuda"], "no CUDA GPU"),
    Case("demo-unknown-head", ["demo", "--heads", "foo", "--out", "{c}/demo"], "choose from eagle, medusa, mtp"),
    # eval
    Case("eval-nan-temperature", [*EVAL, "--accept", "strict", "--temperature", "nan"],
         "temperature nan is not a finite"),
    Case("eval-unknown-rule", [*EVAL, "--accept", "greedyy"], "unknown acceptance rule 'greedyy'"),
    Case("eval-oversized-chain", [*EVAL, "--tree", "chain:100000"], "too large"),
    Case("eval-oversized-dynamic", [*EVAL, "--tree", "dynamic:500,4,10"], "too large"),
    Case("eval-bad-static-tree", [*EVAL, "--tree", "static:x"], "bad tree 'static:x'"),
    Case("eval-zero-batch-size", [*EVAL, "--batch-size", "1,0"],
         "(--batch-size) must be whole numbers >= 1, got [1, 0]"),
    Case("eval-fractional-batch-size", [*EVAL, "--batch-size", "2.5"], "--batch-size[0]: expected int, got float 2.5"),
    Case("eval-zero-plain-above", [*EVAL, "--plain-above", "0"], "(--plain-above) must be a whole number >= 1"),
    Case("eval-unknown-flag", [*EVAL, "--temprature", "0.7"], "unrecognized arguments: --temprature 0.7"),
    Case("recipe-zero-batch-size", ["recipe", "show", "{w}/recipe.yaml", "eval.batch_sizes=[0]", "--no-target"],
         "eval.batch_sizes"),
    Case("eval-missing-drafter", ["eval", "{c}/nope", "--prompts", "{w}/prompts.jsonl"], "does not exist"),
    Case("eval-out-dot", [*EVAL, "--out", "."], "--out . is not empty", a_file),
    Case("eval-out-under-a-file", [*EVAL, "--out", "{c}/afile/report"], "not a writable folder", a_file),
    Case("eval-missing-prompts", ["eval", "{w}/runs/medusa", "--prompts", "{c}/missing.jsonl"], "does not exist"),
    Case("eval-truncated-drafter", ["eval", "{c}/run", "--target", "{w}/target", "--prompts", "{w}/prompts.jsonl"],
         "model.safetensors", truncated_drafter),
    Case("eval-truncated-target",
         ["eval", "{w}/runs/medusa", "--target", "{c}/target", "--prompts", "{w}/prompts.jsonl"],
         "its files are damaged", truncated_target),
    # drift: updated targets, the drift report, the served acceptance
    Case("drift-missing-data", ["drift", "{w}/runs/medusa", "--target", "{w}/target", "--data", "{c}/nope"],
         "is not there; give --data FOLDER"),
    Case("update-target-over-a-user-folder", ["update-target", "{c}/data", "--out", "{c}/mine", "--base",
                                              "{w}/target"], "already exists and is not this update", user_folder),
    Case("update-target-missing-data", ["update-target", "{c}/nope", "--out", "{c}/out", "--base", "{w}/target"],
         "not found"),
    Case("update-target-requantize-a-folder", ["update-target", "--requantize", "q4_0", "--base", "{w}/target",
                                               "--out", "{c}/x.gguf"], "--requantize needs a GGUF target"),
    Case("monitor-baseline-above-1", ["monitor", "http://127.0.0.1:9", "--baseline", "1.5"],
         "baseline acceptance rate must be in (0, 1]"),
    Case("monitor-no-server", ["monitor", "http://127.0.0.1:9", "--baseline", "0.5", "--polls", "1",
                               "--interval", "0"], "cannot read http://127.0.0.1:9/metrics"),
    Case("eval-truncated-gguf", ["eval", "lookup", "--target", "{c}/model.gguf", "--prompts", "{w}/prompts.jsonl"],
         "model.gguf", bad_gguf),
    Case("eval-drafter-of-another-target",
         ["eval", "{w}/runs/medusa", "--target", "{w}/other", "--prompts", "{w}/prompts.jsonl"],
         "was trained for a target"),
    Case("eval-not-a-causal-lm", ["eval", "lookup", "--target", "{w}/bert", "--prompts", "{w}/prompts.jsonl"],
         "not a causal language model"),
    Case("eval-engine-flag", [*EVAL, "--engine", "llama.cpp"], "draftheads engine eval llama.cpp"),
    Case("engine-eval-with-rules", [*ENGINE_EVAL, "--accept", "strict"], "unrecognized arguments: --accept strict"),
    Case("engine-eval-zero-draft", [*ENGINE_EVAL, "--draft-tokens", "0"], "--draft-tokens must be whole numbers >= 1"),
    Case("eval-draft-tokens", [*EVAL, "--draft-tokens", "3"], "unrecognized arguments: --draft-tokens 3"),
    Case("engine-eval-medusa", ENGINE_EVAL, "llama.cpp has no loader for Medusa drafters"),
    # export
    Case("export-unknown-format", [*EXPORT, "--format", "vlm", "--out", "{c}/out"], "unknown export format 'vlm'"),
    Case("export-into-the-run", [*EXPORT, "--format", "vllm", "--out", "{w}/runs/medusa", "--overwrite"],
         "lies inside the drafter"),
    Case("export-into-a-users-folder", [*EXPORT, "--format", "vllm", "--out", "{c}/mine", "--overwrite"],
         "not a draftheads export", user_folder),
    Case("export-into-data", [*EXPORT, "--format", "vllm", "--out", "{w}/data", "--overwrite"], "a run or data folder"),
    Case("export-over-a-previous-export", [*EXPORT, "--format", "tgi", "--out", "{c}/out"], "pass --overwrite",
         previous_export),
    Case("export-onto-a-file", [*EXPORT, "--format", "vllm", "--out", "{c}/afile"], "is a file", a_file),
    Case("export-truncated-drafter",
         ["export", "{c}/run", "--format", "vllm", "--out", "{c}/out", "--target", "{w}/target"],
         "model.safetensors", truncated_drafter),
    Case("export-missing-source", ["export", "{c}/nope", "--format", "vllm", "--out", "{c}/out"], "does not exist"),
    Case("export-missing-target", [*EXPORT[:2], "--target", "{c}/nope", "--format", "vllm", "--out", "{c}/out"],
         "does not exist"),
    Case("export-medusa-to-llama-cpp", [*EXPORT, "--format", "llama.cpp", "--out", "{c}/out"],
         "it loads DFlash, DSpark, EAGLE-3 drafters only"),
    # training
    Case("train-changed-settings", [*TRAIN, "train.lr=0.01", "train.seed=5"], "trained with other settings",
         unfinished_run),
    Case("train-mtp-at-a-medusa-run", [*TRAIN, "head={{type: mtp, depth: 2}}"], "head.type: 'medusa' -> 'mtp'",
         unfinished_run),
    Case("train-damaged-checkpoints", TRAIN, "no intact checkpoint", damaged_checkpoints),
    Case("train-missing-resume", [*TRAIN, "train.resume={c}/nope"], "not found"),
    Case("train-missing-data", [*TRAIN, "data.output={c}/nope"], "not found"),
    Case("train-missing-more-data", [*TRAIN, "train.more_data=[{c}/nope]"], "train.more_data: "),
    Case("train-truncated-arrow", [*TRAIN, "data.output={c}/data"], "data", truncated_arrow),
    Case("train-truncated-feature-shard", [*TRAIN, "data.output={c}/data", "train.mode=offline",
                                           "train.feature_dtype=fp32", "train.feature_cache={c}/cache"],
         "shard_00000.npy", truncated_shard),
    Case("train-all-zero-loss-mask", [*TRAIN, "data.output={c}/data"], "no generated tokens", zero_loss_mask),
    Case("train-unfinished-data", [*TRAIN, "data.output={c}/data"], "unfinished", killed_data_folder),
    Case("train-not-a-causal-lm", [*TRAIN, "target.name={w}/bert"], "not a causal language model"),
    Case("train-two-cpu-processes", ["{w}/recipe.yaml", "train.output_dir={c}/run"], "torchrun --nproc_per_node 2",
         command=[sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2", "--quiet", "-m",
                  "draftheads.train"]),
    Case("data-two-cpu-processes", ["{w}/recipe.yaml", "data.output={c}/data"],
         "torchrun --nproc_per_node 2 -m draftheads.data",
         command=[sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2", "--quiet", "-m",
                  "draftheads.data"]),
    # data
    Case("data-malformed-prompts", [*DATA, "data.prompts=[{{source: {c}/prompts.jsonl}}]"], "line 3", bad_prompts),
    Case("data-no-chat-template", [*DATA, "target.name={w}/notemplate"],
         "no chat template; set target.chat_template to a Jinja template or a .jinja file, or data.mode: completion"),
    Case("data-completion-self-prompts-without-bos", [*DATA, "target.name={w}/notemplate", "data.mode=completion"],
         "adds no BOS token and data.mode: completion renders no template text; give the self source starts_with"),
    Case("data-completion-task-kinds", [*DATA, "target.name={w}/notemplate", "data.mode=completion",
                                        "data.prompts=[{{source: self, kinds: general}}]"],
         "kinds have the target follow instructions through its chat template"),
    Case("data-output-is-a-file", [*DATA, "data.output={c}/afile"], "is a file", a_file),
    # monitor, numeric flags (issue 52)
    Case("monitor-undecodable-counter", MONITOR, "is '\ufffd\ufffd', not a number", serving(b"\xff\xfe")),
    Case("monitor-malformed-counter", MONITOR, "is '1.2.3', not a number", serving(b"1.2.3")),
    Case("monitor-infinite-counter", MONITOR, "is 1e999, not a count of tokens", serving(b"1e999")),
    Case("monitor-negative-interval", [*MONITOR, "--interval", "-1"], "--interval must be seconds in [0, 86400]",
         serving(b"40", b"24")),
    Case("monitor-zero-polls", [*MONITOR, "--polls", "0"], "--polls must be a whole number >= 1",
         serving(b"40", b"24")),
    Case("drift-zero-rows", [*DRIFT, "--rows", "0"], "drift --rows must be a whole number >= 1"),
    Case("drift-no-answer-positions", [*DRIFT, "--data", "{c}/data", "--rows", "1"], "hold no answer tokens",
         first_row_unanswered),
    Case("update-target-infinite-lr", ["update-target", "{w}/data", "--out", "{c}/out", "--base", "{w}/target",
                                       "--steps", "1", "--lr", "inf"], "(--lr) must be a finite number > 0"),
    Case("export-fractional-speculative-tokens", [*EXPORT, "--format", "vllm", "--out", "{c}/out",
                                                  "--speculative-tokens", "2.5"],
         "--speculative-tokens: expected int, got float 2.5"),
    # output locations, truncation and export shapes (issue 52)
    Case("train-output-under-a-file", [*TRAIN, "train.output_dir={c}/afile/run"],
         "afile is a file, not a writable folder", a_file),
    Case("train-feature-cache-under-a-file", [*TRAIN, "train.mode=offline", "train.feature_dtype=fp32",
                                              "train.feature_cache={c}/afile/cache"],
         "cannot write train.feature_cache", a_file),
    Case("data-output-under-a-file", [*DATA, "data.output={c}/afile/data"], "afile is a file, not a writable folder",
         a_file),
    Case("update-target-out-under-a-file", ["update-target", "{w}/data", "--out", "{c}/afile/updated", "--base",
                                            "{w}/target", "--steps", "1"], "cannot write --out", a_file),
    Case("train-max-length-cuts-every-answer", [*TRAIN, "train.max_length=3"],
         "train.max_length=3 leaves no answer token in any of the"),
    Case("train-packed-max-length-cuts-every-answer", [*TRAIN, "train.max_length=3", "train.pack=true"],
         "leaves no answer token"),
    Case("train-offline-max-length-cuts-every-answer", [*TRAIN, "train.max_length=3", "train.mode=offline",
                                                        "train.feature_dtype=fp32", "train.feature_cache={c}/cache"],
         "leaves no answer token"),
    Case("export-for-a-target-of-another-size", [*EXPORT[:2], "--target", "{c}/narrow", "--format", "vllm", "--out",
                                                 "{c}/out"], "hidden_size 64 but this target has hidden_size 32",
         narrow_target),
    Case("export-weights-that-do-not-fit", ["export", "{c}/run", "--format", "tgi", "--out", "{c}/out", "--target",
                                            "{w}/target"], "does not fit the target", narrowed_weights),
    # model cards and --push-to-hub (issue 56): every case runs with HF_HUB_OFFLINE=1
    Case("export-missing-eval-report", [*EXPORT, "--format", "tgi", "--out", "{c}/out", "--eval-report", "{c}/nope"],
         "--eval-report: no report at"),
    Case("export-push-offline", [*EXPORT, "--format", "tgi", "--out", "{c}/out", "--push-to-hub", "you/drafter"],
         "HF_HUB_OFFLINE is set, so nothing can be uploaded"),
    Case("export-push-without-a-token", [*EXPORT, "--format", "tgi", "--out", "{c}/out", "--push-to-hub",
                                         "you/drafter"], "no Hugging Face token",
         env={"HF_HUB_OFFLINE": "0", "HF_TOKEN": "", "HF_HOME": "/nonexistent/hf-home",
              "HF_TOKEN_PATH": "/nonexistent/hf-home/token"}),
]


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.fixture(scope="session")
def results(world, tmp_path_factory):
    """Every case run once, two at a time: name -> (process, snapshots before, snapshots after)."""
    cases_root = tmp_path_factory.mktemp("cases")

    def run(case: Case):
        folder = cases_root / case.name
        folder.mkdir()
        names = (case.setup(world, folder) if case.setup else None) or {}
        args = [a.format(w=world, c=folder, **names) for a in case.args]
        before = (snapshot(world), snapshot(folder))
        # nothing may be fetched: no hub, no package index (the embedded target would be pip-downloaded)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
               "PIP_NO_INDEX": "1", "DRAFTHEADS_CACHE": str(folder / ".no-cache"), **case.env}
        command = case.command or [sys.executable, "-m", "draftheads"]
        done = subprocess.run([*command, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=300)
        return case.name, (done, before, (snapshot(world), snapshot(folder)))

    with ThreadPoolExecutor(max_workers=2) as pool:
        found = dict(pool.map(run, CASES))
    if os.environ.get("DRAFTHEADS_LIST_CASES"):  # the table for a closing note: case, exit status, last line
        with open(os.environ["DRAFTHEADS_LIST_CASES"], "w") as table:
            for case in CASES:
                done = found[case.name][0]
                lines = [line for line in done.stderr.split("Traceback")[0].splitlines() if line.startswith("error: ")]
                table.write(f"| {case.name} | {done.returncode} | {lines[-1] if lines else '?'} |\n")
    return found


def test_there_are_at_least_forty_cases():
    assert len(CASES) >= 40 and len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_refused_in_one_line_and_changes_nothing(case, results):
    done, before, after = results[case.name]
    stderr = done.stderr
    lines = [line for line in stderr.splitlines()
             if line.strip() and not line.startswith(("The following values", "\t", "To avoid"))]
    last = lines[-1] if lines else ""
    assert done.returncode != 0, f"exit 0; stdout: {done.stdout[-500:]}"
    assert "Traceback" not in stderr, stderr[-3000:]
    assert last.startswith("error: ") and case.expect in last and any(w in last for w in FIX_WORDS), done.stderr[-3000:]
    assert after[0] == before[0], (
        "the shared fixtures changed: "
        f"{sorted(k for k in set(after[0]) | set(before[0]) if after[0].get(k) != before[0].get(k))}")
    assert after[1] == before[1], f"the case folder changed: {sorted(set(after[1]) ^ set(before[1]))}"
