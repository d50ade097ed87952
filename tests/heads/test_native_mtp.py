"""head.type native: the MTP layers a checkpoint ships, read, drafted with, fine-tuned and put back.

The checkpoints (tests/shipped_checkpoints.py) are written by transformers' own save_pretrained in each family's real
key layout, sharded, with per-expert MoE keys; the references below read them without draftheads' key mapping.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os

import pytest
import torch
from safetensors import safe_open
from transformers.modeling_layers import MtpModel

from draftheads.core.drafter import Drafter, TrainableDrafter
from draftheads.core.errors import DraftheadsError
from draftheads.core.tree import Tree
from draftheads.decoding.generate import speculative_generate
from draftheads.heads.factory import bound_drafter, head_config
from draftheads.interop.export import export_drafter
from draftheads.interop.native import save_drafter
from draftheads.interop.shipped_mtp import key_files, shipped_drafter
from tests.families import family_target
from tests.shipped_checkpoints import LAYERS, load_shipped_target, shipped_checkpoint
from tests.test_family_matrix import P_MIN, strict_pvalue

FAMILIES = ("deepseek_v3", "glm4_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe", "mimo_v2_flash")
NEXTN = ("deepseek_v3", "glm4_moe")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("shipped")
    return {family: shipped_checkpoint(family, root / family) for family in FAMILIES}


def step_one_logits(drafter, target, ids):
    """Our drafter's first step over a row: [s-1, V] logits of x_{t+2} (training's forward)."""
    h0 = target(ids, output_hidden_states=True).hidden_states[-1]
    return drafter.vocab_logits(drafter.forward_modules(h0, ids)[0], 1)[0]


@pytest.mark.parametrize("family", NEXTN)
@torch.no_grad()
def test_a_nextn_layer_drafts_as_transformers_own_mtp_model_does(family, checkpoints):
    """transformers 5.24's MtpModel reads the same checkpoint by its own conversions; our first step equals its
    logits (DeepSeek's embedding at position 0 zeroed, as vLLM's DeepSeekMTP does)."""
    target = load_shipped_target(checkpoints[family])
    drafter = shipped_drafter(target)
    # transformers finds MTP keys by the release's layer index (61 for DeepSeek-V3); ours has 4 layers
    target._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{LAYERS}\..*"]
    reference = MtpModel.from_pretrained(target).eval()
    ids = torch.randint(3, 300, (1, 10), generator=torch.Generator().manual_seed(0))
    h0 = target(ids, output_hidden_states=True).hidden_states[-1][:, :-1]
    embeds = target.get_input_embeddings()(ids[:, 1:])
    if family == "deepseek_v3":
        embeds[:, 0] = 0
    out = reference.forward_layer(0, h0, torch.arange(9)[None], None, inputs_embeds=embeds)
    want = reference._project_to_logits(out)[0]   # its post-norm applied, as shared_head.norm
    torch.testing.assert_close(step_one_logits(drafter, target, ids), want, rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_a_qwen_mtp_layer_drafts_as_a_hand_built_forward(checkpoints):
    """Qwen3.5's mtp.*: lm_head(norm(layer(fc([pre_fc_norm_embedding(emb); pre_fc_norm_hidden(h)])))), built from
    transformers' own layer and norm classes and the checkpoint's tensors by their keys."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

    folder = checkpoints["qwen3_5"]
    target = load_shipped_target(folder)
    files = key_files(folder)
    raw = {}
    for key, file in files.items():
        if key.startswith("mtp."):
            with safe_open(str(folder / file), framework="pt") as f:
                raw[key] = f.get_tensor(key)
    config = target.config
    layer = Qwen3_5DecoderLayer(config, 1)   # a full-attention index
    layer.load_state_dict({k[len("mtp.layers.0."):]: v for k, v in raw.items() if k.startswith("mtp.layers.0.")})
    norms = {}
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        norms[name] = Qwen3_5RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        norms[name].load_state_dict({"weight": raw[f"mtp.{name}.weight"]})
    ids = torch.randint(3, 300, (1, 10), generator=torch.Generator().manual_seed(0))
    h0 = target(ids, output_hidden_states=True).hidden_states[-1][:, :-1]
    emb = target.get_input_embeddings()(ids[:, 1:])
    fused = torch.cat([norms["pre_fc_norm_embedding"](emb), norms["pre_fc_norm_hidden"](h0)], -1)
    fused = fused @ raw["mtp.fc.weight"].T
    positions = torch.arange(9)[None]
    rotary = target.model.rotary_emb(fused, positions)
    mask = torch.full((9, 9), float("-inf")).triu(1)[None, None]
    out = layer(fused, attention_mask=mask, position_ids=positions, position_embeddings=rotary)
    out = out[0] if isinstance(out, tuple) else out
    want = target.lm_head(norms["norm"](out))[0]
    torch.testing.assert_close(step_one_logits(bound_as_shipped(target), target, ids), want, rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_a_mimo_mtp_layer_drafts_as_vllms_forward_written_out(checkpoints):
    """MiMo-V2's model.mtp.layers.0, as vLLM's MiMoV2MTPLayer runs it (mimo_v2_mtp.py @ 037951a): eh_proj([enorm(emb);
    hnorm(h)]), a pre-norm sliding-window layer with attention sinks and a dense MLP (its pre_mlp_layernorm), then
    final_layernorm, and the target's lm_head; built from transformers' layer and norm classes and the checkpoint's
    tensors by their keys. The 10 positions cross the fixture's window of 8."""
    from transformers.models.mimo_v2_flash.modeling_mimo_v2_flash import MiMoV2FlashDecoderLayer, MiMoV2FlashRMSNorm

    folder = checkpoints["mimo_v2_flash"]
    target = load_shipped_target(folder)
    files = key_files(folder)
    prefix = "model.mtp.layers.0."
    raw = {}
    for key, file in files.items():
        if key.startswith(prefix):
            with safe_open(str(folder / file), framework="pt") as f:
                raw[key[len(prefix):]] = f.get_tensor(key)
    config = copy.deepcopy(target.config)
    config.layer_types, config.mlp_layer_types = ["sliding_attention"], ["dense"]
    layer = MiMoV2FlashDecoderLayer(config, 0)
    renamed = {k.replace("pre_mlp_layernorm.", "post_attention_layernorm.").replace("attention_sink_bias", "sinks"): v
               for k, v in raw.items() if not k.startswith(("enorm", "hnorm", "eh_proj", "final_layernorm"))}
    layer.load_state_dict(renamed)
    norms = {}
    for name in ("enorm", "hnorm", "final_layernorm"):
        norms[name] = MiMoV2FlashRMSNorm(config.hidden_size, config.rms_norm_eps)
        norms[name].load_state_dict({"weight": raw[f"{name}.weight"]})
    ids = torch.randint(3, 300, (1, 11), generator=torch.Generator().manual_seed(0))
    h0 = target(ids, output_hidden_states=True).hidden_states[-1][:, :-1]
    emb = target.get_input_embeddings()(ids[:, 1:])
    fused = torch.cat([norms["enorm"](emb), norms["hnorm"](h0)], -1) @ raw["eh_proj.weight"].T
    positions = torch.arange(10)[None]
    rotary = target.model.rotary_emb(fused, positions, "sliding_attention")
    q, k = positions[0][:, None], positions[0][None, :]
    mask = torch.zeros(10, 10).masked_fill(~((k <= q) & (q - k < config.sliding_window)), float("-inf"))[None, None]
    out = layer(fused, attention_mask=mask, position_ids=positions, position_embeddings=rotary)
    out = out[0] if isinstance(out, tuple) else out
    want = target.lm_head(norms["final_layernorm"](out))[0]
    torch.testing.assert_close(step_one_logits(bound_as_shipped(target), target, ids), want, rtol=1e-4, atol=1e-4)


def bound_as_shipped(target, **settings):
    return shipped_drafter(target, head_config({"type": "native", **settings}))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_shipped_drafter_keeps_greedy_output_and_recurses_past_its_one_module(family, checkpoints):
    target = load_shipped_target(checkpoints[family])
    drafter = bound_as_shipped(target, depth=3)
    assert len(drafter.blocks) == 1 and drafter.step(3) is drafter.blocks[0]   # vLLM's step % modules
    assert isinstance(drafter, Drafter) and isinstance(drafter, TrainableDrafter)
    prompt = torch.tensor([5, 17, 42, 9, 77, 31])
    plain = speculative_generate(target, None, prompt, 12, eos_token_id=[])
    spec = speculative_generate(target, drafter, prompt, 12, tree=Tree.chain(3), eos_token_id=[])
    assert spec.rows == plain.rows


@pytest.mark.parametrize("family", ["deepseek_v3", pytest.param("qwen3_5", marks=pytest.mark.slow)])  # a hybrid: 600
def test_strict_sampling_with_a_shipped_drafter_keeps_the_target_distribution(family, checkpoints):  # rows one by one
    """As tests/test_family_matrix.py's check: (y1, y2, y3) under strict acceptance, T 0.8, top-k 3, top-p 0.95,
    against the exact law of plain sampling; 600 runs."""
    target = load_shipped_target(checkpoints[family])
    drafter = bound_as_shipped(target, depth=2)
    rows = 1 if family == "qwen3_5" else 200   # a recurrent target decodes one row at a time
    assert strict_pvalue(target, drafter, torch.tensor([5, 17, 42, 9, 77, 31]), rows) > P_MIN


def digests(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def tensors_of(folder) -> dict[str, torch.Tensor]:
    out = {}
    for key, file in key_files(folder).items():
        with safe_open(str(folder / file), framework="pt") as f:
            out[key] = f.get_tensor(key)
    return out


@pytest.mark.parametrize("family", ["deepseek_v3", "qwen3_next", "qwen3_5_moe", "mimo_v2_flash"])
def test_put_back_rewrites_only_the_drafter_shards_and_never_the_original(family, checkpoints, tmp_path):
    """Unchanged, the drafter put back gives every tensor bit for bit; changed, exactly its tensors change, in the
    checkpoint's dtype and per-expert layout; untouched shards are hard links; the original's bytes never change."""
    folder = checkpoints[family]
    before = digests(folder)
    target = load_shipped_target(folder)
    drafter = bound_as_shipped(target)
    target.name_or_path = str(folder)
    same = export_drafter(str(save_drafter(drafter, tmp_path / "as-shipped", target=target)), "checkpoint",
                          tmp_path / "same")
    original = tensors_of(folder)
    assert all(torch.equal(v, original[k]) for k, v in tensors_of(same).items())
    with torch.no_grad():
        for tensor in drafter.state_dict().values():   # buffers too (DeepSeek's e_score_correction_bias)
            tensor.add_(0.01)
    out = export_drafter(str(save_drafter(drafter, tmp_path / "tuned", target=target)), "checkpoint", tmp_path / "out")
    record = json.loads((out / "draftheads_export.json").read_text())
    written = tensors_of(out)
    changed = {k for k in original if not torch.equal(original[k], written[k])}
    # the drafter's tensors: MiMo-V2's first MTP layer only (vLLM runs it alone); its layers 1 and 2 stay as shipped
    mtp = {k for k in original if k.startswith(("mtp.", f"model.layers.{LAYERS}.", "model.mtp.layers.0."))}
    frozen = {k for k in mtp if k.endswith(("shared_head.head.weight", "embed_tokens.weight"))}
    assert changed == mtp - frozen and len(changed) == record["tensors_written"]
    assert all(written[k].dtype == original[k].dtype for k in original)
    untouched = set(key_files(folder).values()) - set(record["rewritten_files"])
    assert untouched and all(os.path.samefile(folder / f, out / f) for f in untouched)
    assert record["bytes_rewritten"] < record["checkpoint_bytes"]
    assert digests(folder) == before
    again = shipped_drafter(load_shipped_target(out))   # the new checkpoint ships the changed drafter
    for (name, a), b in zip(drafter.state_dict().items(), again.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)


@pytest.mark.parametrize("family", NEXTN)
@torch.no_grad()
def test_transformers_own_mtp_model_reads_a_put_back_checkpoint_as_our_drafter(family, checkpoints, tmp_path):
    """The fine-tuned NextN layer, put back, read by another loader (transformers' MtpModel over the new checkpoint):
    its first step equals our fine-tuned drafter's."""
    target = load_shipped_target(checkpoints[family])
    target.name_or_path = str(checkpoints[family])
    drafter = bound_as_shipped(target)
    for tensor in drafter.state_dict().values():
        tensor.add_(0.01 * torch.randn_like(tensor.float()).to(tensor.dtype))
    out = export_drafter(str(save_drafter(drafter, tmp_path / "tuned", target=target)), "checkpoint", tmp_path / "out")
    released = load_shipped_target(out)
    released._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{LAYERS}\..*"]
    reference = MtpModel.from_pretrained(released).eval()
    ids = torch.randint(3, 300, (1, 10), generator=torch.Generator().manual_seed(1))
    h0 = released(ids, output_hidden_states=True).hidden_states[-1][:, :-1]
    embeds = released.get_input_embeddings()(ids[:, 1:])
    if family == "deepseek_v3":
        embeds[:, 0] = 0
    want = reference._project_to_logits(reference.forward_layer(0, h0, torch.arange(9)[None], None,
                                                                inputs_embeds=embeds))[0]
    torch.testing.assert_close(step_one_logits(drafter, target, ids), want, rtol=1e-4, atol=1e-4)


def test_a_target_without_shipped_layers_is_refused_in_one_line(checkpoints, tmp_path):
    with pytest.raises(DraftheadsError, match="head.type native reads the MTP layers") as err:
        bound_drafter(head_config({"type": "native"}), family_target("llama"))
    assert "\n" not in str(err.value)
    target = load_shipped_target(checkpoints["glm4_moe"])
    stripped = tmp_path / "stripped"
    target.save_pretrained(stripped)   # transformers drops the MTP keys on load: saved again, they are gone
    target.config.num_nextn_predict_layers = 1
    with pytest.raises(DraftheadsError, match=r"holds no model\.layers\.4\.\S+ \(17 of the MTP .* ships no MTP layers"):
        shipped_drafter(target, head_config({"type": "native", "checkpoint": str(stripped)}))


@pytest.mark.trains
@pytest.mark.parametrize("family, train_only", [("deepseek_v3", "all"), ("qwen3_5", "fusion"), ("glm4_moe", "lora")])
def test_the_one_loop_fine_tunes_a_shipped_drafter(family, train_only, checkpoints, tmp_path):
    """Through run_training, from the shipped weights (not random ones): the loss falls, the target and, with
    train_only fusion, the decoder layer stay as shipped, and the saved drafter loads back."""
    from draftheads.api import load_drafter
    from draftheads.training.loop import run_training
    from tests.margins import at_most
    from tests.training.train_helpers import drafter_weights, make_dataset, tiny_recipe

    target = load_shipped_target(checkpoints[family])
    shipped = {k: v.clone() for k, v in bound_as_shipped(target).state_dict().items()}
    data = make_dataset(target, tmp_path / "rows")
    head = {"type": "native", "depth": 2, "train_only": train_only}
    recipe = tiny_recipe(data, tmp_path / "run", head, max_steps=16, log_every=4, eval_every=8, save_every=8,
                         lr=3e-3, warmup_steps=2)
    run = run_training(recipe, target=target)
    losses = [h["loss"] for h in json.loads((run / "final" / "metrics.json").read_text())["history"]]
    # 16 steps from the shipped weights on 19 rows: last / first 0.777 (deepseek_v3, all), 0.791 (qwen3_5, fusion)
    # and 0.765 (glm4_moe, lora) natively (AMD EPYC), under ATEN_CPU_CAPABILITY=avx2 and =default alike (to 1e-7);
    # the bound of 1 says only that fine-tuning lowers the loss, 0.2 of room for any kernel's rounding
    at_most(losses[-1] / losses[0], 1.0, "logged loss, last / first")
    saved = drafter_weights(run / "final" / "drafter")
    layer = [k for k in saved if ".layer." in k and ".lora_" not in k]   # the shipped layer's own weights
    moved = [k for k in layer if not torch.equal(saved[k], shipped[k.replace(".base_layer.", ".")])]
    assert (not moved) if train_only in ("fusion", "lora") else moved
    assert train_only != "lora" or any(k.endswith("lora_B.default.weight") and saved[k].abs().sum() > 0
                                       for k in saved)   # the adapters learned
    assert not torch.equal(saved["blocks.0.proj.weight"], shipped["blocks.0.proj.weight"])
    again = load_drafter(str(run), target)
    assert again.config.type == "native" and again.config.train_only == train_only


@pytest.mark.slow   # a second virtual environment's loader, as tests/engines' engine runs
@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5", "qwen3_5_moe"])
def test_speculators_own_loader_reads_a_fine_tuned_qwen_mtp_export(family, checkpoints, tmp_path):
    """speculators 0.9.0's MTPDraftModel.from_pretrained (the second virtual environment) loads the export: every
    parameter finite (it fills what it does not find with NaN, embed_tokens and lm_head come from the verifier's
    folder) and equal to ours. NextN drafters are refused there in one line that names speculators."""
    import subprocess

    from tests.interop.test_export import SPECULATORS_PYTHON

    if not SPECULATORS_PYTHON.is_file():
        pytest.skip("no .venv-speculators: run `make speculators-venv` (or `make test`)")
    target = load_shipped_target(checkpoints[family])
    target.name_or_path = str(checkpoints[family])
    drafter = bound_as_shipped(target)
    with torch.no_grad():
        drafter.blocks[0].proj.weight.add_(0.01)
    folder = export_drafter(str(save_drafter(drafter, tmp_path / "native", target=target)), "speculators",
                            tmp_path / "speculators")
    script = os.path.join(os.path.dirname(__file__), "..", "engines", "speculators_check.py")
    done = subprocess.run([str(SPECULATORS_PYTHON), script, str(folder)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    assert result["ok"], result["problems"]


def test_a_nextn_drafter_is_refused_by_speculators_in_one_line(checkpoints, tmp_path):
    target = load_shipped_target(checkpoints["glm4_moe"])
    target.name_or_path = str(checkpoints["glm4_moe"])
    native = save_drafter(bound_as_shipped(target), tmp_path / "native", target=target)
    with pytest.raises(DraftheadsError, match="speculators.* glm4_moe") as err:
        export_drafter(str(native), "speculators", tmp_path / "out")
    assert "\n" not in str(err.value) and "checkpoint" in str(err.value)   # the formats it has


def test_the_shipped_drafter_is_evaluated_as_shipped_by_the_cli_and_draftheads_eval(checkpoints, tmp_path):
    """`draftheads shipped` writes the drafter a checkpoint ships as a drafter folder; `draftheads eval` measures it
    under greedy, strict and typical acceptance, on a tree (a NextN target verifies trees): the baseline every
    fine-tune is compared with."""
    from draftheads.cli import main
    from draftheads.evaluation.eval_config import EvalConfig
    from draftheads.evaluation.evaluate import run_eval

    assert main(["shipped", str(checkpoints["deepseek_v3"]), "--out", str(tmp_path / "shipped"), "--depth", "2",
                 "--dtype", "fp32"]) == 0
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "def add(a, b):"}) + "\n")
    config = EvalConfig(prompts=str(prompts), accept=["greedy", "strict", "typical"], tree="static:[[0],[1],[0,0]]",
                        max_new_tokens=6, dtype="fp32")
    out = run_eval([str(tmp_path / "shipped")], config, out=str(tmp_path / "eval"), progress=False)
    rows = [r for r in json.loads((out / "report.json").read_text())["results"] if r["drafter"] == "shipped"]
    assert sorted(r["rule"] for r in rows) == ["greedy", "strict", "typical"]
    assert all(r["greedy_mismatches"] == 0 for r in rows if r["rule"] == "greedy")


@pytest.mark.parametrize("family", ["glm4_moe", "qwen3_5"])
def test_lora_fine_tunes_the_layer_and_is_merged_into_the_checkpoint(family, checkpoints, tmp_path):
    """train_only lora: peft adapters on the layer's linear modules (the shipped weights frozen), the fusion
    trained whole; put back, the adapters are merged: the checkpoint's drafter drafts as the adapted one."""
    target = load_shipped_target(checkpoints[family])
    target.name_or_path = str(checkpoints[family])
    drafter = bound_as_shipped(target, train_only="lora", lora_r=4)
    shipped = {k.replace(".base_layer.", "."): v.clone() for k, v in drafter.state_dict().items()}
    trains = {name for name, p in drafter.named_parameters() if p.requires_grad}
    assert trains and all(".layer." not in n or ".lora_" in n for n in trains)
    ids = torch.randint(3, 300, (2, 16), generator=torch.Generator().manual_seed(2))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids),
             "features": target(ids, output_hidden_states=True).hidden_states[-1]}
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        loss, _ = drafter.training_loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for key, value in drafter.state_dict().items():   # the shipped layer weights never moved
        if ".base_layer." in key:
            assert torch.equal(value, shipped[key.replace(".base_layer.", ".")]), key
    out = export_drafter(str(save_drafter(drafter, tmp_path / "lora", target=target)), "checkpoint", tmp_path / "out")
    merged = shipped_drafter(load_shipped_target(out))
    with torch.no_grad():
        torch.testing.assert_close(step_one_logits(merged, target, ids[:1]), step_one_logits(drafter, target, ids[:1]),
                                   rtol=1e-4, atol=1e-4)
