"""A judge for judge decoding: a small head on the target's own features that says whether a
draft token can be kept though exact verification would reject it.

Judge decoding (Bachmann et al., ICLR 2025) puts a linear head on the target's last-layer
embeddings of the draft tokens, computed in the verification forward anyway. This head reads, at a
draft token's own column, the target's feature there (the final norm's output, what its LM head
reads) and two numbers of the target's distribution p at the draft's position: ``log p(x)`` and
the entropy of p. The inputs are standardised with the training set's mean and spread (kept in the
folder, as a scaler beside a logistic regression is in AutoJudge), then one linear layer (or a
two-layer MLP, ``hidden > 0``) gives a logit; its sigmoid is the judge's score, the probability
that keeping the draft leaves the outcome the labels were mined on unchanged.

The folder records the target it was trained against (``target_hash``) and the threshold chosen
for it (``threshold``); :func:`check_judge` refuses a judge of another target.
"""

from __future__ import annotations

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

from .feature_drafter import check_trained_for

EXTRA_INPUTS = 2  # log p(x) and the entropy of p, beside the feature


def distribution_inputs(draft_tokens: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """``[log p(x), H(p)]`` (..., 2) for drafts x (...) under p (..., V): log clamped at 1e-12,
    entropy in nats."""
    p = target_probs.float()
    p_x = p.gather(-1, draft_tokens.unsqueeze(-1))
    entropy = -(p * p.clamp(min=1e-12).log()).sum(-1, keepdim=True)
    return torch.cat([p_x.clamp(min=1e-12).log(), entropy], -1)


class JudgeHead(ModelMixin, ConfigMixin):
    """Feature (D) + :func:`distribution_inputs` (2) -> a logit of "harmless to keep".

    ``feature_size`` is the target's hidden width D; ``hidden`` 0 makes the head linear;
    ``threshold`` is the score above which a draft is kept (chosen at training, overridable per
    call); ``target_hash`` names the target's weights (:func:`check_judge`); ``outcome`` says what
    the labels measured (e.g. "geneval-shapes verdict")."""

    @register_to_config
    def __init__(self, feature_size: int = 256, hidden: int = 0, threshold: float = 0.5, target_hash: str = "",
                 outcome: str = ""):
        super().__init__()
        width = feature_size + EXTRA_INPUTS
        self.register_buffer("mean", torch.zeros(width))
        self.register_buffer("scale", torch.ones(width))
        self.net = (nn.Linear(width, 1) if hidden == 0
                    else nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, 1)))

    @staticmethod
    def inputs(features: torch.Tensor, draft_tokens: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
        """The head's raw inputs (..., D + 2): the features beside :func:`distribution_inputs`."""
        return torch.cat([features.float(), distribution_inputs(draft_tokens, target_probs)], -1)

    def set_scaler(self, inputs: torch.Tensor) -> None:
        """Standardise with ``inputs`` (N, D + 2): their mean and standard deviation (floored)."""
        self.mean.copy_(inputs.mean(0))
        self.scale.copy_(inputs.std(0).clamp(min=1e-4))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Raw inputs (..., D + 2) -> logits (...)."""
        x = (inputs.to(self.mean.dtype) - self.mean) / self.scale
        return self.net(x).squeeze(-1)

    def score(self, features: torch.Tensor, draft_tokens: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
        """The judge's scores (...) in [0, 1] (:data:`visualspec.core.judge.Score`)."""
        return torch.sigmoid(self(self.inputs(features, draft_tokens, target_probs)).float())


def check_judge(judge: JudgeHead, target_model: torch.nn.Module, feature_size: int) -> None:
    """:func:`~visualspec.models.feature_drafter.check_trained_for` a judge."""
    check_trained_for("judge", judge, target_model, feature_size, "visualspec train-judge")
