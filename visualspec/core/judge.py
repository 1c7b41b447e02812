"""Judge decoding's rule in the engine: a learned judge scores each draft on the target's own
features, and drafts it finds harmless are kept even where exact verification would reject them.

The judge reads what the verification forward computes anyway: the target's last hidden state at
each draft token's own column (the window ``[x_{n-1}, d_n, .., d_{n+K-1}]`` gives it at columns
1..K), beside the target's distribution there. The rule is :func:`visualspec.core.verify.judge_verify`
(lossy; exact at threshold 1). The judge itself (a small head, its training) lives outside the
core: ``score`` is any function of the features.
"""

from __future__ import annotations

from typing import Callable

import torch

from .checks import check_probability
from .sampling import Generator
from .verify import Verdict, judge_verify

#: score(features (B, K, D), draft_tokens (B, K), target_probs (B, K, V)) -> (B, K) in [0, 1]
Score = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class JudgeRule:
    """A verification rule for :func:`visualspec.core.engine.decode` that wants the target's
    features (``wants_features``): the engine hands it the features of the verified window,
    conditional rows only under guidance, as ``features=`` (B, K + 1, D).

    ``score`` gives each draft its judge score; drafts scoring above ``threshold`` are accepted
    whatever the exact rule says (:func:`judge_verify`; its verdict marks them, and the call's
    stats keep where they are, ``judged_at``, and how many, ``judged_tokens``). ``tag`` names the
    judge in window-cost tables (with the threshold).
    """

    wants_features = True

    def __init__(self, score: Score, threshold: float, tag: str = ""):
        self.score = score
        self.threshold = check_probability("the judge's threshold", threshold)
        self.keywords = {"threshold": self.threshold, "judge": tag}  # what rule_tag reads

    def __call__(self, draft_tokens, draft_probs, target_probs, generator: Generator = None, *,
                 features: torch.Tensor | None = None) -> Verdict:
        K = draft_tokens.shape[1]
        if K == 0:  # no drafts: one exact token (the prefill's first token, a step as AR)
            return judge_verify(draft_tokens, draft_probs, target_probs, generator,
                                scores=target_probs.new_empty(draft_tokens.shape), threshold=self.threshold)
        if features is None:
            raise ValueError("the judge scores drafts on the target's features at their columns; the decode "
                             "handed none (call it through decode(), whose target must return features)")
        scores = self.score(features[:, 1:K + 1], draft_tokens, target_probs[:, :K])
        return judge_verify(draft_tokens, draft_probs, target_probs, generator, scores=scores,
                            threshold=self.threshold)
