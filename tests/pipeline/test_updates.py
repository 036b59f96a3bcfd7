"""A step's optimizer steps (roll_device/pipeline/updates.py): the mini-batches a pass is cut into,
the record's metrics over the updates, and PPO's K epochs of minibatch updates (Schulman et al.,
arXiv 1707.06347, Algorithm 1) written out by hand beside ours, on our clipped loss and a real
optimizer."""

import pytest
import torch

from roll_device.pipeline.updates import Updates, mean_metrics, mini_batches
from strategies.base import TrainBatch
from strategies.training.losses import LossSpec, policy_loss


def rows(count: int, **tensors) -> TrainBatch:
    """A batch of `count` one-token rows whose input id is the row's index."""
    ones = torch.ones(count, 1)
    return TrainBatch(torch.arange(count)[:, None], ones.long(), ones, **tensors)


@pytest.mark.parametrize(
    "size, count, data_parallel, sizes",
    [
        (64, 16, 1, [4] * 16),  # DAPO's 16 on the tiny task's 8 x 8
        (64, 1, 1, [64]),
        (6, 4, 1, [1, 2, 1, 2]),
        (12, 4, 2, [2, 4, 2, 4]),
        (8, 16, 2, [2, 2, 2, 2]),  # fewer rows than count x ranks (a dynamic-sampling batch): fewer parts
    ],
)
def test_mini_batches_cut_the_rows_in_order_each_a_multiple_of_the_ranks(size, count, data_parallel, sizes):
    parts = mini_batches(rows(size), count, data_parallel)
    assert [len(part) for part in parts] == sizes
    assert torch.cat([part.input_ids for part in parts]).squeeze(1).tolist() == list(range(size))


def test_the_record_takes_each_metric_s_mean_and_the_last_learning_rate():
    updates = [
        {"loss": 1.0, "clip_fraction": 0.0, "lr": 1e-4},
        {"loss": 3.0, "clip_fraction": 0.5, "lr": 2e-4},
    ]
    assert mean_metrics(updates) == {"loss": 2.0, "clip_fraction": 0.25, "lr": 2e-4, "updates": 2}


def test_ppo_s_epochs_of_minibatch_updates_as_the_paper_writes_them():
    """Algorithm 1: K epochs over the NT samples in minibatches of M, one gradient step each on
    L^CLIP = mean(min(r A, clip(r, 1 - eps, 1 + eps) A)), r against the policy that sampled. Ours
    (`Updates`, K passes of NT / M mini-batches, our ppo_clip loss) ends at the same parameters."""
    generator = torch.Generator().manual_seed(0)
    features, start = torch.randn(8, 3, generator=generator), torch.randn(3, 4, generator=generator)
    actions, advantages = torch.randint(0, 4, (8,), generator=generator), torch.randn(8, generator=generator)
    epochs, minibatch, eps, lr = 3, 2, 0.2, 0.5

    def logprobs(weights, index):
        return torch.log_softmax(features[index] @ weights, dim=-1).gather(1, actions[index, None])

    old = logprobs(start, slice(None)).detach()
    by_hand = start.clone().requires_grad_()
    optimizer = torch.optim.SGD([by_hand], lr=lr)
    for _ in range(epochs):
        for first in range(0, len(features), minibatch):
            index = slice(first, first + minibatch)
            ratio, a = torch.exp(logprobs(by_hand, index) - old[index]), advantages[index, None]
            objective = torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps, 1 + eps) * a).mean()
            optimizer.zero_grad()
            (-objective).backward()
            optimizer.step()

    ours = start.clone().requires_grad_()
    optimizer, loss = torch.optim.SGD([ours], lr=lr), policy_loss(LossSpec(clip_ratio=eps))

    def update(part: TrainBatch) -> dict[str, float]:
        value, metrics = loss(logprobs(ours, part.input_ids[:, 0]), part)
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        return {"loss": value.item(), "clip_fraction": float(metrics["clip_fraction"])}

    got = Updates(epochs, len(features) // minibatch, 1).run(
        update, rows(8, advantages=advantages, old_logprobs=old)
    )
    assert got["updates"] == epochs * len(features) // minibatch
    assert got["clip_fraction"] > 0, (
        "later minibatches moved past the clip: the test is not one on-policy step"
    )
    assert torch.allclose(ours, by_hand, atol=1e-6)
    assert not torch.allclose(ours, start, atol=1e-3)
