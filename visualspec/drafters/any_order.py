"""ASSD's self-drafts: an any-order model predicts the next k cells of its order from the committed ones."""

from __future__ import annotations

from ..core.engine import Drafter


class AnySubsetDrafter(Drafter):
    """Any-Subset Speculative Decoding's drafts (Guo and Ermon 2025) from the target itself.

    The target is an any-subset model (``forward_queries``, e.g.
    :class:`visualspec.models.any_order.AnyOrderGPT`): in one forward it gives the distributions of
    the next k positions of its order, each conditioned only on the committed tokens,
    q_j = p(x_{n+j} | x_{<n}). The drafts are sampled from those independently (with the call's
    guidance, temperature and filters: ``sampling.probs``), and the engine verifies them along the
    order in its usual window forward with the exact rule, which gives
    p_j = p(x_{n+j} | x_{<n}, d_{<j}). So the output has exactly the law of sequential sampling along
    the order. The first draft's q equals its p (the same conditional), so it is always accepted:
    a round of two forwards commits at least two tokens, and ASSD never needs more forwards than
    sequential sampling.

    Its forwards are the target's: ``drafts_with_target`` makes the engine count each draft forward
    as a target forward of every row (so ``target_forwards`` and the acceptance map hold all of
    them), and :attr:`forwards` stays 0.
    """

    drafts_with_target = True

    def __init__(self, model):
        if not hasattr(model, "forward_queries"):
            raise TypeError(f"{type(model).__name__} cannot predict several positions from the committed ones "
                            f"(no forward_queries); ASSD needs an any-subset model such as AnyOrderGPT")
        self.model = model

    def start(self, batch_size, num_tokens, sampling):
        self.sampling = sampling

    def propose(self, tokens, n, k, generator=None):
        if k == 0:
            return tokens.new_empty(len(n), 0), None
        last = tokens.gather(1, (n - 1).clamp(min=0)[:, None])
        logits = self.model.forward_queries(self.sampling.model_batch(last), self.sampling.model_batch(n), k)
        probs = self.sampling.probs(logits)
        return self.sampling.draw(probs, generator), probs

    def select(self, rows):
        pass  # no state of its own: the target keeps each row's order

    def reset(self, rows, requests):
        pass
