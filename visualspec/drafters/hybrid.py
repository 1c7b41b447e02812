"""Hybrids of learned and model-free drafts: the feature drafter's near the committed tokens and
Jacobi's past them (images); copies of the context where it repeats, the feature drafter's elsewhere (text)."""

from __future__ import annotations

import torch

from ..core.checks import check_positive_int
from ..core.engine import Drafter
from ..core.verify import point_mass
from .feature import FeatureDrafter
from .jacobi import JacobiDrafter
from .ngram import NGramDrafter, filled


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

    carries_drafts = True  # the positions past ``depth`` carry over from one step to the next

    @property
    def wants_features(self):
        return self.feature.wants_features

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


class LookupFeatureDrafter(Drafter):
    """Each row's drafts copied from its context where the context's end matches earlier text by at
    least ``lookup.min_ngram`` tokens (prompt lookup, :class:`NGramDrafter`), else the feature
    drafter's (SAM-Decoding's choice, Hu et al. 2024: retrieval where the match is long, a trained
    drafter elsewhere).

    Why: on code the context often repeats, and there a copied draft is as good as a learned one
    and costs nothing, while each feature draft costs a drafter pass and a read of the target's LM
    head. The feature drafter runs only on steps where some row does not copy (at batch 1: only
    where the match is short); its cache catches up on the positions it skipped at its next
    proposal, from the real features the engine keeps handing it.

    A row that copies drafts the continuation it matched, up to the k tokens the step asks for; one
    that does not, at most ``feature_drafts`` (None: k), since each feature draft costs a drafter
    pass where a copied one costs nothing. Where rows of a batch differ, the shorter rows are
    filled with their last draft again, as a point mass.

    Lossless under the exact rule: a row's choice depends only on its committed tokens, and its
    drafts are draws from the law reported for them, a point mass for the copied ones and the
    padding, the feature drafter's q for the others (None under greedy decoding, where drafts are
    point masses).
    """

    @property
    def wants_features(self):
        return self.feature.wants_features

    def __init__(self, lookup: NGramDrafter, feature: FeatureDrafter, feature_drafts: int | None = None):
        if feature_drafts is not None:
            check_positive_int("feature_drafts (the most drafts a step the feature drafter makes)", feature_drafts)
        self.lookup, self.feature, self.feature_drafts = lookup, feature, feature_drafts

    @property
    def forwards(self):
        return self.feature.forwards

    def start(self, batch_size, num_tokens, sampling):
        self.lookup.start(batch_size, num_tokens, sampling)
        self.feature.start(batch_size, num_tokens, sampling)
        self.copied = 0  # drafts copied from the context so far

    def prefix_features(self, features, rows=None):
        self.feature.prefix_features(features, rows)

    def propose(self, tokens, n, k, generator=None):
        B = tokens.shape[0]
        if k == 0:
            return tokens.new_empty(B, 0), None
        follows = [self.lookup.continuation(context, k)[0] for context in self.lookup.contexts(tokens, n)]
        copy = [bool(f) for f in follows]
        self.copied += sum(map(len, follows))
        if all(copy):
            return filled(follows, tokens), None
        drafts, q = self.feature.propose(tokens, n, self.feature_count(k), generator)
        if not any(copy):
            return drafts, q
        width = max(drafts.shape[1], *map(len, follows))  # every row filled with its last draft, a point mass
        rows = [f if c else d for f, c, d in zip(follows, copy, drafts.tolist())]
        drafts = filled(rows, tokens, width)
        if q is not None:
            mass = point_mass(drafts, q.shape[-1]).to(q.dtype)
            feature_rows = torch.tensor([not c for c in copy], device=tokens.device)
            mass[feature_rows, :q.shape[1]] = q[feature_rows]
            q = mass
        return drafts, q

    def feature_count(self, k: int) -> int:
        """The drafts a step of ``k`` asks of the feature drafter: ``min(k, feature_drafts)``."""
        return min(k, self.feature_drafts or k)

    def precompile_chains(self, rows: int, columns: int, counts, sampling, feature_dtype) -> None:
        """The feature drafter's :meth:`~FeatureDrafter.precompile_chains` for the proposals it makes
        in steps of ``counts`` drafts (:meth:`feature_count`)."""
        self.feature.precompile_chains(rows, columns, sorted({self.feature_count(k) for k in counts}), sampling,
                                       feature_dtype)

    def observe(self, n, committed, target_probs, generator=None, features=None):
        self.feature.observe(n, committed, target_probs, generator, features=features)

    def select(self, rows):
        self.lookup.select(rows)
        self.feature.select(rows)

    def cost_tag(self):
        return (f"{type(self).__name__}[{self.lookup.min_ngram}..{self.lookup.max_ngram},{self.feature_drafts}]:"
                f"{self.feature.cost_tag()}")
