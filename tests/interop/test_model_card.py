"""Every export's model card (README.md): front matter a YAML parser reads (base_model, library_name, tags, the
target's licence), the engine's serve command naming the export, the tau the newest eval of this drafter measured;
and `--push-to-hub` through a stubbed HfApi: the calls it makes and its refusals, no network."""

from __future__ import annotations

import json
import re
import shlex

import huggingface_hub
import pytest
import torch
import yaml

from draftheads.api import build_drafter
from draftheads.core.errors import DraftheadsError
from draftheads.evaluation.eval_config import EvalConfig
from draftheads.evaluation.evaluate import run_eval
from draftheads.interop import hub_upload, model_card
from draftheads.interop.export import export_drafter
from draftheads.interop.native import save_drafter
from tests.fixtures import make_target
from tests.interop.test_llama_cpp import write_target_gguf

V, VD = 384, 100   # the tiny target's vocabulary, an EAGLE-3 draft vocabulary
HEADS = {"medusa": {"num_heads": 2}, "eagle": {}, "eagle3": {"draft_vocab_size": VD},
         "dflash": {"block_size": 4, "num_layers": 1}, "peagle": {"draft_vocab_size": VD, "depths": 3}}
# a head each engine loads for a Llama target, each of an engine's kinds where its command differs by kind
CASES = [("native", "eagle3"), ("vllm", "medusa"), ("vllm", "eagle"), ("vllm", "eagle3"), ("vllm", "dflash"),
         ("vllm", "peagle"), ("sglang", "eagle"), ("sglang", "eagle3"), ("sglang", "dflash"), ("tgi", "medusa"),
         ("speculators", "eagle3"), ("llama.cpp", "eagle3")]
LIBRARIES = {"native": "draftheads", "vllm": "vllm", "sglang": "sglang", "tgi": "text-generation-inference",
             "speculators": "speculators", "llama.cpp": "llama.cpp"}
TAGS = {"medusa": "medusa", "eagle": "eagle", "eagle3": "eagle3", "dflash": "dflash", "peagle": "p-eagle"}


@pytest.fixture(scope="module")
def world(tmp_path_factory, tokenizer):
    """A tiny Llama target saved with a README.md that names its licence, a run per head kind (runs/<kind>/final/
    drafter) and a metadata GGUF of the target carrying a licence of its own."""
    root = tmp_path_factory.mktemp("cards")
    target = make_target("llama", tokenizer)
    target.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    (root / "target" / "README.md").write_text("---\nlicense: apache-2.0\n---\n# a tiny target\n")
    target.name_or_path = str(root / "target")   # what its drafters record, as if loaded by name
    for kind, cfg in HEADS.items():
        torch.manual_seed(0)
        drafter = build_drafter(kind, target, **cfg)
        if cfg.get("draft_vocab_size"):
            drafter.vocab.choose(torch.randint(0, 1000, (V,)))
        save_drafter(drafter, root / "runs" / kind / "final" / "drafter", target=target)
    write_target_gguf(root / "target.gguf", tokenizer, licence="mit")
    return root, target


def export(world, kind, fmt, out, **kw):
    root, target = world
    extra = {"target_gguf": root / "target.gguf"} if fmt == "llama.cpp" else {}
    return export_drafter(root / "runs" / kind, fmt, out, **extra, **kw)


def read_card(folder) -> tuple[dict, str]:
    """(front matter, body) of the folder's README.md, split as the hub splits it."""
    text = (folder / "README.md").read_text()
    match = re.fullmatch(r"---\n(.*?)\n---\n(.*)", text, re.S)
    assert match, text[:200]
    return yaml.safe_load(match[1]), match[2]


def command(body: str, language: str = "bash") -> str:
    return re.search(rf"## Serve\n\n```{language}\n(.*?)\n```", body, re.S)[1]


def flags(line: str) -> dict:
    words = shlex.split(line)
    return {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}


@pytest.mark.parametrize("fmt, kind", CASES, ids=[f"{f}-{k}" for f, k in CASES])
def test_every_export_has_a_model_card_with_its_serve_command(fmt, kind, world, tmp_path):
    root, _ = world
    out = export(world, kind, fmt, tmp_path / "out")
    front, body = read_card(out)
    assert front["library_name"] == LIBRARIES[fmt]
    assert front["tags"][:3] == ["speculative-decoding", TAGS[kind], "draftheads"]
    assert "base_model" not in front   # a local target: the hub takes hub ids only
    # the target folder's README.md, or the GGUF llama.cpp runs the drafter with
    assert front["license"] == ("mit" if fmt == "llama.cpp" else "apache-2.0")
    record = json.loads((out / "draftheads_export.json").read_text())
    n = json.loads((root / "runs" / kind / "final" / "drafter" / "config.json").read_text())["head"]
    serve = command(body, "python" if fmt == "native" else "bash")
    target = str(root / "target")
    if fmt == "vllm":
        assert serve.startswith("# vLLM 0.34.0 refuses parallel_drafting") == (kind == "peagle")
        serve = serve.splitlines()[-1]
        config = json.loads(flags(serve)["--speculative-config"])
        method = {"medusa": "medusa", "eagle": "eagle", "eagle3": "eagle3", "dflash": "dflash", "peagle": "eagle3"}
        assert shlex.split(serve)[:3] == ["vllm", "serve", target] and config["method"] == method[kind]
        assert config["model"] == str(out) and config["num_speculative_tokens"] >= 1
        assert config.get("parallel_drafting", False) == (kind == "peagle")
    elif fmt == "sglang":
        given = flags(serve)
        assert serve.startswith("python -m sglang.launch_server") and given["--model-path"] == target
        assert given["--speculative-algorithm"] == {"eagle": "EAGLE", "eagle3": "EAGLE3", "dflash": "DFLASH"}[kind]
        assert given["--speculative-draft-model-path"] == str(out)
        if kind != "dflash":   # a chain: n steps of one token, n + 1 verified
            assert int(given["--speculative-num-draft-tokens"]) == int(given["--speculative-num-steps"]) + 1
    elif fmt == "tgi":
        assert serve == f"text-generation-launcher --model-id {out}"
        assert json.loads((out / "config.json").read_text())["base_model_name_or_path"] == target
    elif fmt == "speculators":
        assert serve == f"vllm serve {out}"
    elif fmt == "llama.cpp":   # the record's command, run where the files are
        assert serve == f"cd {out}\n{record['llama_cpp']['command']}"
        assert (out / record["llama_cpp"]["target"]).is_file()
    else:
        assert f'draftheads.load_drafter("{out}", target)' in serve
    assert "Not measured yet" in body and n["type"] == kind


def test_the_native_cards_python_runs(world, tmp_path):
    out = export(world, "eagle3", "native", tmp_path / "native")
    scope = {}
    exec(command(read_card(out)[1], "python"), scope)   # noqa: S102 - the card's own snippet, as a reader runs it
    assert scope["out"].tokens.shape[1] > scope["input_ids"].shape[1] and scope["out"].stats.tau >= 1


def test_a_hub_target_is_the_base_model_and_what_the_engine_serves(world, tmp_path, tokenizer):
    """A target recorded by hub id is the card's base_model and the served model; its licence is looked for in the
    local hub cache only (not cached here: the card says so), unless the export is pushed."""
    _, target = world
    target.name_or_path = "someone/tiny-llama"
    try:
        drafter = build_drafter("eagle", target)
        native = save_drafter(drafter, tmp_path / "runs" / "hubbed" / "final" / "drafter", target=target)
    finally:
        target.name_or_path = str(world[0] / "target")
    out = export_drafter(native, "vllm", tmp_path / "vllm", target=target)
    front, body = read_card(out)
    assert front["base_model"] == "someone/tiny-llama" and "license" not in front
    assert command(body).startswith("vllm serve someone/tiny-llama --speculative-config")
    assert "licence was not found without the network" in body


def test_the_embedded_target_is_named_by_its_hub_checkpoint(world, tmp_path, monkeypatch, tokenizer):
    """A drafter of the embedded target: base_model is the checkpoint its GGUF was made from, whose licence the
    cached GGUF's metadata gives."""
    from draftheads.core.targets import ALIASES

    _, target = world
    cache = tmp_path / "cache"
    (cache / "smollm2-135m").mkdir(parents=True)
    write_target_gguf(cache / "smollm2-135m" / ALIASES["smollm2-135m"].gguf, tokenizer, licence="apache-2.0")
    monkeypatch.setenv("DRAFTHEADS_CACHE", str(cache))
    target.name_or_path = "smollm2-135m"
    try:
        native = save_drafter(build_drafter("medusa", target, num_heads=2), tmp_path / "drafter", target=target)
    finally:
        target.name_or_path = str(world[0] / "target")
    out = export_drafter(native, "tgi", tmp_path / "tgi", target=target)
    front, body = read_card(out)
    assert front["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and front["license"] == "apache-2.0"
    assert "embedded target `smollm2-135m`" in body


def test_the_llama_cpp_gguf_carries_the_cards_base_model_licence_and_tags(world, tmp_path, monkeypatch, tokenizer):
    """The drafter GGUF holds the card's front matter as general.* fields, read by gguf's own model-card parser
    (what llama.cpp's converter writes of a folder's README.md), so a GGUF-only user sees them too."""
    from gguf import GGUFReader

    from draftheads.interop.llama_cpp import field_value

    root, target = world
    target.name_or_path = "someone/tiny-llama"
    try:
        drafter = build_drafter("eagle3", target, **HEADS["eagle3"])
        drafter.vocab.choose(torch.randint(0, 1000, (V,)))
        native = save_drafter(drafter, tmp_path / "drafter", target=target)
    finally:
        target.name_or_path = str(root / "target")
    out = export_drafter(native, "llama.cpp", tmp_path / "gguf", target=target, target_gguf=root / "target.gguf")
    front, _ = read_card(out)
    reader = GGUFReader(str(out / "drafter.gguf"))
    assert field_value(reader, "general.license") == front["license"] == "mit"
    assert field_value(reader, "general.tags") == front["tags"]
    assert field_value(reader, "general.base_model.count") == 1
    assert field_value(reader, "general.base_model.0.organization") == "Someone"   # gguf title-cases it
    assert field_value(reader, "general.base_model.0.repo_url") == "https://huggingface.co/someone/tiny-llama"
    assert field_value(reader, "general.name").startswith("draftheads EAGLE-3 drafter for someone/tiny-llama")


# ---- the tau an evaluation measured ------------------------------------------------------------------------------

def measured_rows(body: str) -> list[list[str]]:
    table = body.split("## Measured\n\n")[1].split("\n\n## ")[0].split("\n\n")[1]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def test_the_card_gives_the_tau_of_the_newest_eval_of_this_drafter(world, tmp_path, tokenizer, capsys):
    root, target = world
    run = root / "runs" / "eagle"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Count to {i}."}) + "\n" for i in range(3)))
    folder = run_eval([str(run)], EvalConfig(prompts=str(prompts), limit=2, tree="chain:2", max_new_tokens=6,
                                             calibration_prompts=1),
                      target_model=(target, tokenizer), progress=False)
    assert folder.parent == run   # where eval writes without --out: the run folder
    report = json.loads((folder / "report.json").read_text())
    ours = [r for r in report["results"] if r["drafter"] == "eagle"]
    # newer reports beside it: one of another drafter, one damaged; both passed over
    other = json.loads(json.dumps(report))
    for entry in other["drafters"]:
        entry["folder"] = str(root / "runs" / "medusa" / "final" / "drafter")
    (run / "eval-29990101-000000").mkdir()
    (run / "eval-29990101-000000" / "report.json").write_text(json.dumps(other))
    (run / "eval-29990102-000000").mkdir()
    (run / "eval-29990102-000000" / "report.json").write_text('{"drafters": [')
    try:
        _, body = read_card(export(world, "eagle", "sglang", tmp_path / "sglang"))
        assert "skips" in capsys.readouterr().err
        assert measured_rows(body) == [[r["rule"], str(r["temperature"]), r["tree"], str(r["prompts"]),
                                        f"{r['tau']:.2f}", f"{r['speedup']:.2f}x"] for r in ours]
        assert folder.name in body and "prompts.jsonl, the first 2" in body
        # given, the report must be this drafter's
        _, body = read_card(export(world, "eagle", "vllm", tmp_path / "given", eval_report=str(folder)))
        assert measured_rows(body)[0][4] == f"{ours[0]['tau']:.2f}"
        with pytest.raises(DraftheadsError, match="did not measure the drafter at .*; give the report of an eval"):
            export(world, "eagle", "vllm", tmp_path / "wrong", eval_report=str(run / "eval-29990101-000000"))
        with pytest.raises(DraftheadsError, match="--eval-report: no report at"):
            export(world, "eagle", "vllm", tmp_path / "none", eval_report=str(tmp_path / "nope"))
        assert not (tmp_path / "wrong").exists() and not (tmp_path / "none").exists()
    finally:
        for name in ("eval-29990101-000000", "eval-29990102-000000"):
            (run / name / "report.json").unlink()
            (run / name).rmdir()


# ---- --push-to-hub -----------------------------------------------------------------------------------------------

class StubApi:
    """HfApi as the upload uses it: each call recorded, with the README.md the folder held when it was uploaded."""

    calls: list = []
    fail: Exception | None = None

    def __init__(self, *args, **kwargs):
        StubApi.calls.append(("HfApi", args, kwargs))

    def create_repo(self, repo_id, **kwargs):
        StubApi.calls.append(("create_repo", repo_id, kwargs))

    def upload_folder(self, **kwargs):
        if StubApi.fail is not None:
            raise StubApi.fail
        from pathlib import Path

        StubApi.calls.append(("upload_folder", kwargs, (Path(kwargs["folder_path"]) / "README.md").read_text()))


@pytest.fixture
def hub(monkeypatch):
    """The hub client stubbed: a token, online, HfApi recording; a hub card download fails the test."""
    StubApi.calls, StubApi.fail = [], None
    monkeypatch.setattr(huggingface_hub, "HfApi", StubApi)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_stub")
    monkeypatch.setattr(hub_upload.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def no_download(*args, **kwargs):
        raise AssertionError(f"fetched {args}: this target's card was to be read locally")

    monkeypatch.setattr(model_card, "hf_hub_download", no_download)
    return StubApi


@pytest.mark.parametrize("private", [False, True])
def test_push_to_hub_creates_the_repository_and_uploads_the_folder(private, world, hub, tmp_path, capsys):
    out = export(world, "eagle3", "vllm", tmp_path / "out", push_to_hub="you/tiny-eagle3", private=private)
    assert [c[0] for c in hub.calls] == ["HfApi", "create_repo", "upload_folder"]
    assert hub.calls[1][1:] == ("you/tiny-eagle3", {"private": True if private else None, "exist_ok": True})
    upload, card = hub.calls[2][1], hub.calls[2][2]
    assert upload["repo_id"] == "you/tiny-eagle3" and upload["folder_path"] == str(out)
    assert json.loads(flags(command(card))["--speculative-config"])["model"] == "you/tiny-eagle3"   # engines fetch it
    assert "uploaded" in capsys.readouterr().out and (out / "README.md").read_text() == card


def test_a_pushed_export_of_a_hub_target_reads_the_targets_card_from_the_hub(world, hub, tmp_path, monkeypatch):
    _, target = world
    target.name_or_path = "someone/tiny-llama"
    try:
        native = save_drafter(build_drafter("eagle", target), tmp_path / "drafter", target=target)
    finally:
        target.name_or_path = str(world[0] / "target")
    card = tmp_path / "hub-card.md"
    card.write_text("---\nlicense: other\nlicense_name: tiny-licence\n---\n")
    fetched = []
    monkeypatch.setattr(model_card, "hf_hub_download", lambda repo, name: fetched.append((repo, name)) or str(card))
    out = export_drafter(native, "sglang", tmp_path / "out", target=target, push_to_hub="you/tiny-eagle")
    front, body = read_card(out)
    assert fetched == [("someone/tiny-llama", "README.md")]
    assert (front["license"], front["license_name"]) == ("other", "tiny-licence")
    assert "someone/tiny-llama's model card" in body


@pytest.mark.parametrize("problem, setup, expected", [
    ("offline", lambda m: m.setenv("HF_HUB_OFFLINE", "1"), "HF_HUB_OFFLINE is set, so nothing can be uploaded; unset"),
    ("no token", lambda m: m.setattr(huggingface_hub, "get_token", lambda: None),
     "no Hugging Face token; set HF_TOKEN or run `hf auth login`"),
])
def test_push_to_hub_is_refused_before_any_work(problem, setup, expected, world, hub, tmp_path, monkeypatch):
    setup(monkeypatch)
    with pytest.raises(DraftheadsError, match=re.escape(expected)) as info:
        export(world, "eagle3", "vllm", tmp_path / "out", push_to_hub="you/tiny-eagle3")
    assert "\n" not in str(info.value) and not (tmp_path / "out").exists() and hub.calls == []


@pytest.mark.parametrize("kw, expected", [
    ({"push_to_hub": "not a repo"}, "--push-to-hub 'not a repo' is not a hub repository id; give OWNER/NAME"),
    ({"push_to_hub": "you/a--b"}, "is not a hub repository id"),
    ({"push_to_hub": "tiny-eagle3"}, "is not a hub repository id"),
    ({"private": True}, "--private applies to the repository --push-to-hub creates"),
])
def test_bad_hub_settings_are_refused(kw, expected, world, hub, tmp_path):
    with pytest.raises(DraftheadsError, match=re.escape(expected)):
        export(world, "eagle3", "vllm", tmp_path / "out", **kw)
    assert not (tmp_path / "out").exists() and hub.calls == []


# an OSError (what the hub client raised before 1.0, and HfHubHTTPError is one), and the base of the hub's HTTP errors
# that is not (httpx's HTTPError, which a refused connection raises)
HTTP_BASE = huggingface_hub.errors.HfHubHTTPError.__bases__[0]


@pytest.mark.parametrize("failure", [OSError("403 Forbidden: no write access"),
                                     HTTP_BASE("[Errno 111] Connection refused")])
def test_a_failed_upload_is_one_line_and_keeps_the_export(failure, world, hub, tmp_path):
    hub.fail = failure
    with pytest.raises(DraftheadsError, match="uploading .* to the hub repository you/x failed") as info:
        export(world, "medusa", "tgi", tmp_path / "out", push_to_hub="you/x")
    message = str(info.value)
    assert "\n" not in message and str(failure).split(":")[0] in message and "`hf upload you/x " in message
    assert (tmp_path / "out" / "README.md").is_file() and (tmp_path / "out" / "draftheads_export.json").is_file()
