"""Drafters: where draft tokens and their draft distributions come from.

A drafter proposes up to ``k`` tokens after the ``n`` committed ones and says, for each, the
distribution q it was sampled from (``None`` when every draft is deterministic). After the target
has verified them, :meth:`Drafter.observe` tells the drafter what happened, so that self-drafting
(Jacobi) can reuse the target's own predictions and a draft model can roll its cache back.

Model-free drafters: :class:`NGramDrafter` (prompt lookup, deterministic drafts) and
:class:`StandDrafter` (a stochastic n-gram memory of the target's own distributions). Draft-model
drafters: :class:`DraftModelDrafter` and :class:`VocabTrimDrafter` (a draft model whose LM head is
restricted to a kept set of tokens, chosen e.g. with :func:`frequent_tokens`). Continuous tokens:
:class:`ContinuousDraftModelDrafter` (CSpD's draft model). Learned from the target:
:class:`FeatureDrafter` (EAGLE-style drafting from the target's features),
:class:`ChimeraDrafter` (Chimera's residual heads: several drafts from one pass over them) and
:class:`HybridDrafter` (a feature drafter's drafts next to the committed tokens, Jacobi's past
them); :class:`LookupFeatureDrafter` (text: prompt lookup's copies where the context repeats, a
feature drafter's drafts elsewhere); :class:`DenoisingJacobiDrafter` (SJD2: Jacobi drafts that
enter as noise and are denoised by a target fine-tuned for it). Any-order models:
:class:`AnySubsetDrafter` (ASSD's drafts of the next cells of the order, from the target itself).
"""

from ..core.engine import Drafter
from .any_order import AnySubsetDrafter
from .continuous import ContinuousDraftModelDrafter
from .denoising import DenoisingJacobiDrafter
from .feature import ChimeraDrafter, FeatureDrafter
from .hybrid import HybridDrafter, LookupFeatureDrafter
from .draft_model import DraftModelDrafter, VocabTrimDrafter, frequent_tokens, kept_token_ids
from .jacobi import INIT_SCHEMES, JacobiDrafter, JacobiStep, coupled_redraft
from .ngram import NGramDrafter
from .stand import StandDrafter

__all__ = ["Drafter", "JacobiDrafter", "JacobiStep", "coupled_redraft", "INIT_SCHEMES", "DraftModelDrafter", "VocabTrimDrafter",
           "frequent_tokens", "kept_token_ids", "NGramDrafter", "StandDrafter", "ContinuousDraftModelDrafter",
           "FeatureDrafter", "ChimeraDrafter", "HybridDrafter", "LookupFeatureDrafter", "AnySubsetDrafter",
           "DenoisingJacobiDrafter"]
