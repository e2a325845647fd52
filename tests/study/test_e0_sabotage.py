"""The E0 gate fails on broken pipelines, on the tiny preset.

A gate that passes on any pipeline proves nothing. Three sabotages, each of a part a canary
exercises: no learning (a zero learning rate), the wrong Bellman operator (the targets' max over
successor candidates replaced by their mean), and a scorer blind to the candidates (their
features and struck object replaced by zeros). Each must fail E0; the genuine pipeline passes.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow


def _zero_learning_rate(monkeypatch) -> None:
    from qhlab.finite_horizon import q_learning

    def configure_optimizers(self):
        opt = self.recipe.optimizer
        return torch.optim.AdamW(
            self.online.parameters(), lr=0.0, betas=opt.betas, eps=opt.eps, weight_decay=opt.weight_decay
        )

    monkeypatch.setattr(q_learning.QhTDModule, "configure_optimizers", configure_optimizers)


def _mean_for_max(monkeypatch) -> None:
    from qhlab.finite_horizon import q_learning

    # The bootstrap over a successor's candidates, in one place: the per-batch targets and a hard
    # target's table of successor values both take it from here.
    def successor_bootstrap(next_q, next_candidate_mask, horizon):
        future = next_q[..., : horizon - 1]
        weights = next_candidate_mask.unsqueeze(-1).to(future.dtype)
        return (future * weights).sum(dim=-2) / weights.sum(dim=-2).clamp(min=1.0)

    monkeypatch.setattr(q_learning, "successor_bootstrap", successor_bootstrap)


def _blind_to_candidates(monkeypatch) -> None:
    from qhlab.finite_horizon import scorer

    original = scorer.QhScorer.forward

    def forward(self, objects, object_mask, goal, candidates, candidate_object, candidate_mask):
        return original(
            self,
            objects,
            object_mask,
            goal,
            torch.zeros_like(candidates),
            torch.zeros_like(candidate_object),
            candidate_mask,
        )

    monkeypatch.setattr(scorer.QhScorer, "forward", forward)


@pytest.mark.parametrize(
    "sabotage",
    [None, _zero_learning_rate, _mean_for_max, _blind_to_candidates],
    ids=["genuine", "zero-learning-rate", "mean-for-max", "blind-to-candidates"],
)
def test_e0_passes_only_on_the_genuine_pipeline(sabotage, tmp_path, tiny_config, monkeypatch) -> None:
    from qhlab.finite_horizon.studies.architecture_study import admit_canaries, freeze_study

    output = tmp_path / "study"
    freeze_study(tiny_config, output)  # before the sabotage: it binds the genuine source package
    if sabotage is not None:
        sabotage(monkeypatch)
    body = admit_canaries(tiny_config, output)
    assert body["selection"]["selected"] is not None
    assert body["passed"] is (sabotage is None), body["reason"]
    if sabotage is not None:
        assert body["failures"] and "did not recover" in body["reason"]
