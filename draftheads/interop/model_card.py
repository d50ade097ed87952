"""The model card every export writes beside its weights (README.md): what the drafter is, the command that serves
it, what it measured, and the Hugging Face hub's front matter.

    measured = find_measured(saved, given=None)    # the newest eval of this drafter folder, or None
    write_card(tmp, saved, "vllm", record, measured, out=Path("exported/vllm"), repo=None)

Front matter: `base_model` (the target's hub id where it has one: the hub refuses a local path there),
`library_name` (the engine's), `tags`, and the target's `license` where it is known without the network: the
target GGUF's general.license, a target folder's README.md, a hub target's card in the local cache (fetched only
when the export is pushed, the network being in use then anyway). The measured tau comes from a `draftheads eval`
report: `--eval-report`, else the newest eval-*/report.json in the drafter's run folder (where `draftheads eval RUN`
writes when given no --out) that measured this drafter folder. Runs keep no list of their evaluations, so the run
folder is where one is looked for.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from gguf import GGUFReader
from huggingface_hub import hf_hub_download, metadata_load, try_to_load_from_cache

from draftheads.core.config import to_dict
from draftheads.core.errors import DraftheadsError
from draftheads.core.run_folder import BEST, DRAFTER, EVAL_PREFIX, FINAL, STEP_RE
from draftheads.core.state_files import read_json
from draftheads.core.targets import ALIASES, cache_dir
from draftheads.core.version import __version__
from draftheads.interop import deepspec, sglang, speculators, tgi, vllm
from draftheads.interop.hub_upload import FAILURES
from draftheads.interop.layout import LABELS
from draftheads.interop.llama_cpp import field_value
from draftheads.interop.native import SavedDrafter

CARD = "README.md"
ENGINE_NAMES = {"native": "draftheads itself (the native format)", "vllm": "vLLM", "sglang": "SGLang",
                "tgi": "TGI (text-generation-inference)", "speculators": "vLLM, in the speculators format",
                "deepspec": "DeepSpec (deepseek-ai/DeepSpec's evaluator)", "llama.cpp": "llama.cpp, as a GGUF file"}
LIBRARIES = {"native": "draftheads", "vllm": "vllm", "sglang": "sglang", "tgi": "text-generation-inference",
             "speculators": "speculators", "deepspec": "transformers", "llama.cpp": "llama.cpp"}
SERVE = {"vllm": vllm.serve_command, "sglang": sglang.serve_command, "tgi": tgi.serve_command,
         "speculators": speculators.serve_command, "deepspec": deepspec.serve_command}
TAGS = {"medusa": "medusa", "medusa2": "medusa", "eagle": "eagle", "eagle3": "eagle3", "mtp": "mtp",
        "dflash": "dflash", "dspark": "dspark", "peagle": "p-eagle", "native": "mtp", "assistant": "gemma4-assistant"}
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
LICENCE_FIELDS = ("license", "license_name", "license_link")
GGUF_LICENCE = {"license": "general.license", "license_name": "general.license.name",
                "license_link": "general.license.link"}


def write_card(folder: Path, saved: SavedDrafter, fmt: str, record: dict, measured: Measured | None, out: Path,
               repo: str | None) -> None:
    """README.md into `folder` (the export being written, renamed to `out` once whole); `repo`: the hub repository it
    is pushed to, which its commands then name (else `out`)."""
    gguf = folder / record["llama_cpp"]["target"] if fmt == "llama.cpp" else None
    licence = target_licence(saved, online=repo is not None, gguf=gguf)
    (folder / CARD).write_text(model_card(saved, fmt, record, measured, licence, out, repo))


def model_card(saved: SavedDrafter, fmt: str, record: dict, measured: Measured | None,
               licence: tuple[dict, str | None], out: Path, repo: str | None) -> str:
    name = saved.target_name() or "its target"
    short = name if HUB_ID.fullmatch(name) else Path(name).name
    sections = [f"# {LABELS[saved.kind]} drafter for {short}", introduction(saved, fmt),
                "## Serve", serve_section(saved, fmt, record, out, repo),
                "## Measured", measured_section(measured),
                "## Drafter", drafter_section(saved, fmt),
                "## Licence", licence_section(saved, fmt, *licence)]
    front = yaml.safe_dump(front_matter(saved, fmt, licence[0]), sort_keys=False)
    return f"---\n{front}---\n\n" + "\n\n".join(sections) + "\n"


def front_matter(saved: SavedDrafter, fmt: str, licence: dict) -> dict:
    hub = target_hub_id(saved)
    tags = ["speculative-decoding", TAGS[saved.kind], "draftheads"] + (["gguf"] if fmt == "llama.cpp" else [])
    return {**({"base_model": hub} if hub else {}), "library_name": LIBRARIES[fmt], **licence, "tags": tags}


def target_hub_id(saved: SavedDrafter) -> str | None:
    """The target's hub id: the embedded target's source checkpoint, or a recorded name that is no local path."""
    name = saved.target_name()
    if name in ALIASES:
        return ALIASES[name].hub_id
    if name and HUB_ID.fullmatch(name) and not Path(name).expanduser().exists():
        return name
    return None


def introduction(saved: SavedDrafter, fmt: str) -> str:
    name = saved.target_name() or "its target"
    text = (f"A speculative-decoding drafter for `{target_hub_id(saved) or name}`, trained with draftheads and "
            f"exported for {ENGINE_NAMES[fmt]}. It proposes the next few tokens; the target checks them all in one "
            "forward pass and accepts them by its own probabilities, so the output follows the target's distribution "
            "and only the speed changes.")
    if name in ALIASES:
        text += (f" It was trained on draftheads' embedded target `{name}`: the `{ALIASES[name].gguf}` file of "
                 f"`{ALIASES[name].hub_id}`, dequantized, so an engine serving the original checkpoint runs a "
                 "slightly different target.")
    return text


# ---- the serve command ------------------------------------------------------------------------------------------

def serve_section(saved: SavedDrafter, fmt: str, record: dict, out: Path, repo: str | None) -> str:
    """The command that runs the drafter with its target: the engine's, naming the hub repository (engines fetch
    it) or the export folder; llama.cpp and draftheads itself read local files, downloaded first from a hub copy."""
    n = saved.speculative_tokens
    length = f"It drafts {n} token{'s' * (n != 1)} per step (`--speculative-tokens` at export sets another length)."
    if fmt in SERVE:
        return code("bash", SERVE[fmt](saved, repo or str(out), target_hub_id(saved) or saved.target_name()
                                       or "TARGET")) + "\n\n" + length
    local = repo.split("/")[-1] if repo else str(out)
    download = f"hf download {repo} --local-dir {shlex.quote(local)}\n" if repo else ""
    if fmt == "llama.cpp":
        return code("bash", f"{download}cd {shlex.quote(local)}\n{record['llama_cpp']['command']}") + "\n\n" + length
    usage = code("python", "import draftheads\n"
                           f"target, tokenizer = draftheads.load_target({json.dumps(saved.target_name())})\n"
                           f"drafter = draftheads.load_drafter({json.dumps(local)}, target)\n"
                           'input_ids = tokenizer("The capital of France is", return_tensors="pt").input_ids\n'
                           "out = draftheads.speculative_generate(target, drafter, input_ids, max_new_tokens=64)\n"
                           "print(out.tokens, out.stats.tau)")
    return (code("bash", download.strip()) + "\n\n" if download else "") + usage + (
        f"\n\n`draftheads eval {shlex.quote(local)}` measures it against plain decoding of the same target.")


def code(language: str, text: str) -> str:
    return f"```{language}\n{text}\n```"


# ---- what an evaluation measured ------------------------------------------------------------------------------


@dataclass
class Measured:
    """What one `draftheads eval` measured of this drafter: its rows at batch size 1, and the report."""

    file: Path   # the report.json
    rows: list[dict]
    report: dict


def find_measured(saved: SavedDrafter, given: str | None) -> Measured | None:
    """The report `given` (a folder or report.json; refused when it did not measure this drafter), else the newest
    report in the drafter's run folder that did (None: there is none)."""
    if given:
        file = Path(given).expanduser()
        file = file / "report.json" if file.is_dir() else file
        if not file.is_file():
            raise DraftheadsError(f"--eval-report: no report at {file}; give the folder or report.json of a "
                                  "draftheads eval")
        measured = measured_in(file, read_report(file), saved.folder)
        if measured is None:
            raise DraftheadsError(f"--eval-report {given} did not measure the drafter at {saved.folder}; give the "
                                  "report of an eval of this drafter, or leave the flag out")
        return measured
    for file in run_reports(saved.folder):
        try:
            measured = measured_in(file, read_report(file), saved.folder)
        except DraftheadsError as e:   # an old report in the run folder: skipped, not a reason to refuse the export
            print(f"note: the model card skips {file}: {e}", file=sys.stderr)
            continue
        if measured is not None:
            return measured
    return None


def run_reports(folder: Path) -> list[Path]:
    """The eval reports in the run of a drafter folder (run/final|best|step_N/drafter), newest first."""
    folder = folder.resolve()
    if folder.name != DRAFTER or not (folder.parent.name in (FINAL, BEST) or STEP_RE.match(folder.parent.name)):
        return []
    return sorted(folder.parent.parent.glob(f"{EVAL_PREFIX}*/report.json"), reverse=True)


def read_report(file: Path) -> dict:
    report = read_json(file, "eval report", "give the report of an intact draftheads eval, or run it again",
                       required=("drafters", "results", "settings"))
    if not (isinstance(report["drafters"], list) and isinstance(report["results"], list)
            and isinstance(report["settings"], dict)):
        raise DraftheadsError(f"{file} is not a draftheads eval report (its drafters, results or settings are not "
                              "what eval writes); give the report.json a draftheads eval wrote")
    return report


def measured_in(file: Path, report: dict, folder: Path) -> Measured | None:
    """This drafter's rows in `report` (its own, not its combinations with lookup), at batch size 1."""
    names = {d.get("name") for d in report["drafters"]
             if isinstance(d, dict) and d.get("kind") == "learned" and same_folder(d.get("folder"), folder)}
    rows = [r for r in report["results"] if isinstance(r, dict) and r.get("drafter") in names
            and r.get("batch_size", 1) == 1 and isinstance(r.get("tau"), (int, float))]
    return Measured(file, rows, report) if rows else None


def same_folder(recorded, folder: Path) -> bool:
    """`recorded` (a drafter folder as an eval was given it) is `folder`: the same folder from here, or the same last
    three parts (runs/<name>/final/drafter, the eval run from another working folder)."""
    if not isinstance(recorded, str) or not recorded:
        return False
    here, there = folder.resolve(), Path(recorded).expanduser()
    return there.resolve() == here or (len(there.parts) >= 3 and there.parts[-3:] == here.parts[-3:])


def measured_section(measured: Measured | None) -> str:
    if measured is None:
        return ("Not measured yet: `draftheads eval` on the drafter's run folder measures tau and speedup against "
                "plain decoding; an export made after it (or given `--eval-report PATH`) shows them here.")
    report, settings = measured.report, measured.report["settings"]
    limit = f", the first {settings['limit']}" if settings.get("limit") else ""
    target = (report.get("target") or {}).get("name", "?")
    text = (f"`draftheads eval` of {str(report.get('created', '?'))[:10]} ({measured.file.parent.name}): prompts "
            f"{settings.get('prompts', '?')}{limit}, up to {settings.get('max_new_tokens', '?')} new tokens each, "
            f"target `{target}` in {settings.get('dtype', '?')} on {machine(report)}. tau is the tokens each target "
            "forward pass yields (the bonus token included) in draftheads' own decoding loop; an engine's figures "
            "differ with its batching and kernels.")
    lines = ["| rule | temperature | tree | prompts | tau | speedup |", "|---|---|---|---|---|---|"]
    for r in measured.rows:
        speedup = f"{r['speedup']:.2f}x" if isinstance(r.get("speedup"), (int, float)) else "-"
        lines.append(f"| {r.get('rule')} | {r.get('temperature')} | {r.get('tree')} | {r.get('prompts', '-')} | "
                     f"{r['tau']:.2f} | {speedup} |")
    return text + "\n\n" + "\n".join(lines)


def machine(report: dict) -> str:
    hardware = (report.get("environment") or {}).get("hardware") or {}
    cuda = hardware.get("cuda")
    return (cuda.get("device") if isinstance(cuda, dict) else None) or hardware.get("cpu") or "an unrecorded machine"


# ---- the drafter and its licence --------------------------------------------------------------------------------

def drafter_section(saved: SavedDrafter, fmt: str) -> str:
    target = saved.config.get("target") or {}
    revision = f", revision `{target['revision']}`" if target.get("revision") else ""
    head = json.dumps(to_dict(saved.head), indent=2)
    return (f"- kind: {LABELS[saved.kind]} (`head.type: {saved.kind}`)\n"
            f"- target: `{saved.target_name()}` ({target.get('architecture', '?')}{revision})\n"
            f"- weights: {str(saved.dtype).removeprefix('torch.')}\n"
            f"- exported by draftheads {__version__} as `--format {fmt}`\n\n"
            f"<details><summary>head settings</summary>\n\n{code('json', head)}\n\n</details>")


def licence_section(saved: SavedDrafter, fmt: str, fields: dict, source: str | None) -> str:
    name = target_hub_id(saved) or saved.target_name() or "the target"
    gguf = " This folder also holds the target's GGUF file, under the target's terms." if fmt == "llama.cpp" else ""
    if fields.get("license"):
        return (f"`{fields['license']}`, the target's licence (read from {source}): the drafter is trained on "
                f"`{name}`'s outputs and works only beside it.{gguf}")
    return (f"The target's licence was not found without the network (a local README.md, GGUF metadata or a cached "
            f"hub card); check `{name}`'s terms and add `license:` to the front matter before publishing.{gguf}")


def target_licence(saved: SavedDrafter, online: bool, gguf: Path | None = None) -> tuple[dict, str | None]:
    """The target's licence fields (license, license_name, license_link) and where they were read; ({}, None) where
    nothing says. Each source is read only if the ones before it said nothing."""
    for fields, source in licence_sources(saved, online, gguf):
        if fields.get("license"):
            return fields, source
    return {}, None


def licence_sources(saved: SavedDrafter, online: bool, gguf: Path | None):
    name = saved.target_name() or ""
    path = Path(name).expanduser()
    if gguf is not None:
        yield gguf_licence(gguf), "the target GGUF's metadata"
    if name in ALIASES:
        yield gguf_licence(cache_dir() / name / ALIASES[name].gguf), "the embedded target's GGUF metadata"
    elif path.suffix == ".gguf":
        yield gguf_licence(path), "the target GGUF's metadata"
    elif path.is_dir():
        yield card_licence(path / CARD), "the target folder's README.md"
    hub = target_hub_id(saved)
    if hub:
        cached = try_to_load_from_cache(hub, CARD)
        if isinstance(cached, str):
            yield card_licence(Path(cached)), f"{hub}'s model card"
        elif online:
            yield card_licence(download_card(hub)), f"{hub}'s model card"


def gguf_licence(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        reader = GGUFReader(str(path))
    except (OSError, ValueError):
        return {}
    values = {key: field_value(reader, gguf_key) for key, gguf_key in GGUF_LICENCE.items()}
    return {key: value for key, value in values.items() if isinstance(value, str) and value}


def card_licence(path: Path | None) -> dict:
    if path is None or not path.is_file():
        return {}
    try:
        meta = metadata_load(path) or {}
    except (OSError, ValueError, yaml.YAMLError):
        return {}
    return {key: meta[key] for key in LICENCE_FIELDS if isinstance(meta.get(key), str) and meta[key]}


def download_card(hub: str) -> Path | None:
    """The hub target's README.md, fetched (only for an export being pushed); None where it cannot be (gated, none)."""
    try:
        return Path(hf_hub_download(hub, CARD))
    except FAILURES:
        return None
