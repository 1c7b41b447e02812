"""A hybrid of learned and Jacobi drafts: the feature drafter's near the committed tokens, Jacobi's past them."""

from __future__ import annotations

import torch

from ..core.checks import check_positive_int
from ..core.engine import Drafter
from ..core.verify import point_mass
from .feature import FeatureDrafter
from .jacobi import JacobiDrafter


class HybridDrafter(Drafter):
    """Each step drafts the first ``depth`` positions after the committed tokens with a feature
    drafter and the rest of the window with Jacobi self-drafting (#50: "learned drafts where they
    beat Jacobi's, Jacobi's where not").

    Why that split: a Jacobi draft at position n + j is the target's sample from its previous
    window, which saw a stale draft where the last step emitted its bonus token, so the positions
    right after the committed ones are the ones it guesses worst. The feature drafter reads the
    token the last step emitted and the target's real features, so its first drafts are the most
    accurate it makes; each further one feeds back a predicted feature and costs a drafter pass,
    while Jacobi's drafts cost nothing. ``depth`` sets the boundary.

    Lossless under the exact rule: every draft is a draw from the law it reports. The first
    ``min(depth, k)`` are drawn this step from the feature drafter's q (which may depend on the
    drafts before them, as a chain's do); the rest are the Jacobi carry's tokens, drawn in an earlier
    step from the target's distribution there and independent of this step's draws, with that
    distribution as their law, or an initialisation's point mass (what SJD itself verifies). The
    Jacobi update keeps the target's new samples past each row's committed tokens, whichever drafter
    made the drafts they replace; with ``coupling`` the new sample is coupled to the draft that
    stood there, with the law it was drawn from.
    """

    wants_features = True
    carries_drafts = True  # the positions past ``depth`` carry over from one step to the next

    def __init__(self, feature: FeatureDrafter, jacobi: JacobiDrafter, depth: int):
        check_positive_int("a hybrid drafter's depth (the positions the feature drafter drafts)", depth)
        self.feature, self.jacobi, self.depth = feature, jacobi, depth

    @property
    def forwards(self):
        return self.feature.forwards

    def start(self, batch_size, num_tokens, sampling):
        self.feature.start(batch_size, num_tokens, sampling)
        self.jacobi.start(batch_size, num_tokens, sampling)

    def prefix_features(self, features, rows=None):
        self.feature.prefix_features(features, rows)

    def propose(self, tokens, n, k, generator=None):
        drafts, q = self.feature.propose(tokens, n, min(self.depth, k), generator)
        if k > self.depth:
            jacobi, jacobi_q = self.jacobi.propose(tokens, n, k, generator)
            if jacobi_q is None:  # nothing carried yet: the initialisation's point masses
                jacobi_q = point_mass(jacobi, q.shape[-1])
            drafts = torch.cat([drafts, jacobi[:, self.depth:]], 1)
            q = torch.cat([q, jacobi_q[:, self.depth:].to(q.dtype)], 1)
        self.jacobi.proposed = (drafts, q)  # what coupling couples the next samples to
        return drafts, q

    def observe(self, n, committed, target_probs, generator=None, features=None):
        self.jacobi.observe(n, committed, target_probs, generator)
        self.feature.observe(n, committed, target_probs, generator, features=features)

    def select(self, rows):
        self.feature.select(rows)
        self.jacobi.select(rows)

    def reset(self, rows, requests):
        self.feature.reset(rows, requests)
        self.jacobi.reset(rows, requests)

    def cost_tag(self):
        return f"{type(self).__name__}[{self.depth}]:{self.feature.cost_tag()}+{self.jacobi.cost_tag()}"
