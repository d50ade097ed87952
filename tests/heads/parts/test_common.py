"""The shared masked loss: soft labels reduce to hard ones where the target is certain."""

import torch
import torch.nn.functional as F

from draftheads.heads.parts.common import TargetDistribution, masked_ce


def test_soft_labels_on_a_certain_target_give_the_hard_loss():
    g = torch.Generator().manual_seed(0)
    vocab, b, s = 11, 2, 9
    ids = torch.randint(0, vocab, (b, s), generator=g)
    attention = torch.ones(b, s, dtype=torch.long)
    attention[1, -2:] = 0
    loss_mask = attention.clone()
    loss_mask[:, :3] = 0
    batch = {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask}
    # "features" whose logits (identity projection) put all mass on the token that follows
    certain = 1e4 * F.one_hot(ids.roll(-1, dims=1), vocab).float()
    soft = TargetDistribution(certain, batch, lambda f: f)
    hidden = torch.randn(b, s, 5, generator=g)
    project = torch.nn.Linear(5, vocab)
    for shift in (1, 2, 3):
        want = masked_ce(hidden, batch, shift, project)
        got = masked_ce(hidden, batch, shift, project, soft=soft)
        torch.testing.assert_close(got[0], want[0])
        assert [int(x) for x in got[1:]] == [int(x) for x in want[1:]]
