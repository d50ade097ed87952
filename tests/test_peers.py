"""benchmarks/peers.py's two halves that run in speculators: our rows written as its offline EAGLE-3 data
(benchmarks/speculators_data.py) read back by speculators' own data loader, and its own trainer run on CPU from them
(benchmarks/peer_runners/speculators_train.py), its checkpoint then loaded into our loop. Needs .venv-speculators."""

import json
import os
import subprocess
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from benchmarks.speculators_data import write_speculators_data
from draftheads.heads.eagle3 import default_feature_layers
from draftheads.interop.load import load_drafter
from draftheads.interop.vocab_mapping import write_vocab_mappings

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SPECULATORS_PYTHON = ROOT / ".venv-speculators" / "bin" / "python"
RUNNER = ROOT / "benchmarks" / "peer_runners" / "speculators_train.py"
MAX_LENGTH = 24
ORDER = [3, 0, 4, 1, 2, 5]  # file index i = row ORDER[i]: the training rows, then the held-out ones
TRAIN_ROWS = 4

# in .venv-speculators: every row as speculators' ArrowDataset (train, then val split) serves it to its trainer
READ_BACK = """
import sys, torch
from safetensors.torch import save_file
from speculators.train.data import ArrowDataset
data, ratio, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
items = {}
for split in ("train", "val"):
    dataset = ArrowDataset(max_len=64, datapath=data, on_missing="raise", train_ratio=ratio, split=split)
    for i in range(len(dataset)):
        for key, value in dataset[i].items():
            items[f"{split}.{i}.{key}"] = value.contiguous()
save_file(items, out)
"""


@pytest.fixture(scope="module")
def speculators_python():
    if not SPECULATORS_PYTHON.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{SPECULATORS_PYTHON} is missing: CI runs `make test`, which builds it (make "
                        "speculators-venv)")
        pytest.skip("no .venv-speculators: run `make speculators-venv`")
    return str(SPECULATORS_PYTHON)


@pytest.fixture(scope="module")
def exported(tiny_target_dir, tmp_path_factory):
    """Six rows of a tiny random Llama target (two longer than MAX_LENGTH) written as speculators' data."""
    target = AutoModelForCausalLM.from_pretrained(tiny_target_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    lengths = [9, 30, 14, 17, 40, 11]
    ids = [torch.randint(3, target.config.vocab_size, (n,), generator=g).tolist() for n in lengths]
    masks = [[0] * (n // 3) + [1] * (n - n // 3) for n in lengths]
    rows = datasets.Dataset.from_dict({"input_ids": ids, "loss_mask": masks}).with_format("numpy")
    layers = [layer + 1 for layer in default_feature_layers(target.config.num_hidden_layers)]  # hidden_states indices
    folder = tmp_path_factory.mktemp("speculators-data")
    write_speculators_data(target, rows, ORDER, layers, folder, max_length=MAX_LENGTH, batch_size=4,
                           dtype=torch.float32)
    return target, ids, masks, layers, folder


def test_speculators_loader_reads_the_rows_with_their_layers_and_masks(exported, speculators_python, tmp_path):
    target, ids, masks, layers, folder = exported
    ratio = (TRAIN_ROWS + 0.5) / len(ORDER)
    out = tmp_path / "read.safetensors"
    done = subprocess.run([speculators_python, "-c", READ_BACK, str(folder), str(ratio), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = load_file(str(out))
    hidden = target.config.hidden_size
    for file_index, row in enumerate(ORDER):
        split, i = ("train", file_index) if file_index < TRAIN_ROWS else ("val", file_index - TRAIN_ROWS)
        n = min(len(ids[row]), MAX_LENGTH)
        assert got[f"{split}.{i}.input_ids"].tolist() == ids[row][:n]
        assert got[f"{split}.{i}.loss_mask"].tolist() == masks[row][:n]
        with torch.no_grad():  # each row alone, unpadded: the export batches rows of different lengths
            states = target.model(input_ids=torch.tensor([ids[row][:n]]), output_hidden_states=True).hidden_states
        fused, last = got[f"{split}.{i}.hidden_states"], got[f"{split}.{i}.verifier_last_hidden_states"]
        assert fused.shape == (n, 3 * hidden) and last.shape == (n, hidden)
        expected = torch.cat([states[layer][0] for layer in layers], dim=-1)
        torch.testing.assert_close(fused, expected, atol=1e-4, rtol=1e-4)
        # speculators applies the verifier's final norm itself: the file holds the last layer's output before it
        torch.testing.assert_close(target.model.norm(last), states[-1][0], atol=1e-4, rtol=1e-4)
        assert not torch.allclose(last, states[-1][0], atol=1e-2)


def test_speculators_trainer_runs_two_steps_on_cpu_and_its_checkpoint_loads_here(exported, speculators_python,
                                                                                    tiny_target_dir, tmp_path):
    target, _, _, layers, folder = exported
    vocab = target.config.vocab_size
    d2t = torch.arange(0, vocab, 2)[:100]
    d2t = d2t - torch.arange(len(d2t))  # a draft vocabulary of 100 tokens: every other id
    write_vocab_mappings(tmp_path, d2t, vocab)
    save = tmp_path / "checkpoints"
    metrics = tmp_path / "metrics.json"
    command = [speculators_python, str(RUNNER), "--minutes", "5", "--metrics", str(metrics), "--",
               "--verifier-name-or-path", str(tiny_target_dir), "--data-path", str(folder), "--save-path", str(save),
               "--log-dir", str(tmp_path / "logs"), "--target-layer-ids", *map(str, layers),
               "--draft-vocab-size", "100", "--d2t-path", str(tmp_path / "d2t.npy"),
               "--t2d-path", str(tmp_path / "t2d.npy"), "--ttt-steps", "3", "--no-norm-before-residual",
               "--no-norm-before-fc", "--no-norm-output", "--train-data-ratio", str((TRAIN_ROWS + 0.5) / len(ORDER)),
               "--num-workers", "0", "--on-missing", "raise", "--total-seq-len", "32", "--epochs", "1",
               "--max-steps", "2", "--draft-attn-impl", "sdpa",
               "--loss-implementation", "eager"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(metrics.read_text())
    assert result["steps"] == 2 and result["train_tokens_per_s"] > 0, result
    checkpoint = Path(result["checkpoint"])
    drafter = load_drafter(checkpoint, target)
    assert drafter.config.type == "eagle3"
    assert [layer + 1 for layer in drafter.config.feature_layers] == layers
    assert drafter.vocab.size == 100 and torch.equal(drafter.vocab.d2t.cpu(), d2t)
    saved = load_file(str(checkpoint / "model.safetensors"))
    assert np.isfinite(saved["fc.weight"].float().numpy()).all()
