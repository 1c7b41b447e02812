"""Drafting from the target's own features (EAGLE-style), with a trained feature drafter.

The engine hands a drafter that sets ``wants_features`` the target's features: those of the prompt
after the prefill (:meth:`FeatureDrafter.prefix_features`) and those of every verified window
(``observe(..., features=...)``); it computes none when no drafter asks.
"""

from __future__ import annotations

import dataclasses

import torch

from ..core.engine import Drafter
from ..core.rows import per_row
from ..core.window_costs import config_hash
from .draft_model import full_vocabulary, kept_token_ids


class FeatureDrafter(Drafter):
    """Drafts with a feature drafter network (:class:`visualspec.models.feature_drafter.FeatureDraftModel`)
    that reads the target's features, its token embeddings and its LM head.

    ``target`` gives ``embed_tokens(ids)`` and ``head(features)`` (the frozen embedding and head;
    :class:`visualspec.models.hf.HFCausalLM` has both). ``prefix`` is the prompt's token ids (B, T)
    or ``(ids, attention_mask)``, as the target got it: the drafter then reads the prompt's
    (token, feature) pairs too. Without it (an image model's prefix is a condition, not tokens) it
    starts from the prompt's last feature alone.

    State, per model row (twice the rows under guidance): ``real[g + 1]`` is the target's feature at
    generated position g (``real[0]``: the prompt's last), kept from the verified windows;
    ``consumed`` is the first generated position whose cache column the drafter has not yet
    written from real features. A proposal first writes positions consumed..n-1 from real features
    (the last of them predicts position n), then drafts k tokens, each step feeding back the
    feature it predicted (feature-level autoregression). Each draft is drawn from q, the sampling's
    distribution of the target's head on the predicted feature (guidance, temperature, top-k, top-p
    alike), and q is returned, so the exact rule keeps decoding lossless.

    ``keep`` (K token ids, e.g. :func:`visualspec.drafters.frequent_tokens` of text like the
    target's) restricts the drafts to those tokens (FR-Spec, Zhao et al. 2025: a frequency-ranked
    draft vocabulary): the head is computed on the K kept rows only (the target's ``kept_head``),
    so a draft's head costs K/V of the full one, and q is zero outside them, as
    :class:`visualspec.drafters.VocabTrimDrafter` does for a draft model. Still lossless: a token
    outside the kept set comes from the residual.
    """

    wants_features = True
    prices_drafts = True

    def __init__(self, model, target, prefix=None, keep=None):
        self.model, self.target, self.prefix = model, target, prefix
        self.wants_features = model.feature_request  # the head's input, or the hidden states it fuses
        self._forwards = 0
        self.keep = None
        if keep is not None:
            if not hasattr(target, "kept_head"):
                raise ValueError(f"a draft vocabulary (keep) needs a target whose LM head can be restricted to it "
                                 f"(kept_head); {type(target).__name__} has none")
            self.keep = kept_token_ids(keep, target.vocab_size)
            self._kept_head = target.kept_head(self.keep)

    @classmethod
    def for_model(cls, model, target, prefix=None, keep=None) -> "FeatureDrafter":
        """The drafter of a feature drafter network: :class:`ChimeraDrafter` for a Chimera one
        (whose heads give several features a pass), else this class."""
        return (ChimeraDrafter if hasattr(model, "head_features") else FeatureDrafter)(model, target, prefix, keep)

    @property
    def forwards(self):
        return self._forwards

    tree_columns = 0  # scratch cache columns for a dynamic tree's nodes (use_tree)

    def start(self, batch_size, num_tokens, sampling):
        self.sampling, self.batch_size, self.N = sampling, batch_size, num_tokens
        self._unguided = dataclasses.replace(sampling, guidance_scale=1.0)
        self._forwards = 0
        self.real = None

    def use_tree(self, depth: int = 0, width: int = 0) -> None:
        """Reserve cache columns for dynamic trees of ``depth`` levels and ``width`` nodes a level
        (:meth:`propose_dynamic_tree`), from the next decode on; ``use_tree()``: none."""
        if depth and self.keep is not None:
            raise ValueError("a draft vocabulary (keep) and a dynamic draft tree do not go together yet")
        self.tree_columns = max(depth - 1, 0) * width

    def _prompt(self, requests=None):
        prefix = self.prefix(requests) if callable(self.prefix) else self.prefix
        if prefix is None:
            return None, None
        ids, mask = prefix if isinstance(prefix, (tuple, list)) else (prefix, None)
        valid = (torch.ones_like(ids) if mask is None else mask).bool()
        # column c holds the pair (x_c, f_{c-1}): it exists where both columns are real prompt tokens
        return ids, torch.nn.functional.pad(valid[:, 1:] & valid[:, :-1], (1, 0))

    def prefix_features(self, features: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """The target's features (model rows, T, D) of the prompt of sample rows ``rows`` (all rows,
        after the prefill; the refilled ones, with continuous batching)."""
        ids, valid = self._prompt(list(range(self.batch_size)) if rows is None else self._requests)
        width = 0 if ids is None else ids.shape[1]
        if rows is None and self.model.fc.weight.dtype != features.dtype:
            self.model.to(features.dtype)  # it runs in its target's dtype (one saved in float16)
        features = self.model.intake(features)
        if rows is None:
            Bm = features.shape[0]
            self.P = width
            self.real = features.new_zeros(Bm, self.N + 2, features.shape[-1])
            self.consumed = torch.zeros(Bm, dtype=torch.long, device=features.device)
            self.model.reset(Bm, self.P + self.N + 1 + self.tree_columns, valid)
            model_rows = torch.arange(Bm, device=features.device)
        else:
            if width > self.P:
                raise ValueError(f"a new prompt of {width} tokens is longer than the {self.P} the feature drafter "
                                 f"started with; decode such prompts in separate calls")
            model_rows = self.sampling.model_rows(rows, self.batch_size)
            if valid is not None:
                valid = torch.nn.functional.pad(valid, (self.P - width, 0))
                ids = torch.nn.functional.pad(ids, (self.P - width, 0))
                features = torch.nn.functional.pad(features, (0, 0, self.P - width, 0))
            self.model.clear_rows(model_rows, valid)
            self.consumed[model_rows] = 0
            self.real[model_rows] = 0
        self.real[model_rows, 0] = features[:, -1]
        pairs = None if ids is None else self._prompt_inputs(ids.to(features.device), model_rows)
        if width > 1:  # the prompt's pairs (x_c, f_{c-1}), c = 1..T-1
            columns = torch.arange(1, self.P, device=features.device).expand(len(model_rows), -1)
            self._step(pairs, features[:, :-1], columns, model_rows, compiled=False)

    def _prompt_inputs(self, ids, model_rows):
        """The token part of the prompt's pairs, columns 1..T-1, from its ids (rows ``model_rows``)."""
        return ids[:, 1:]

    def _generated_inputs(self, tokens, g):
        """The token part of the pairs at generated positions ``g`` (model rows, L) of ``tokens``."""
        return tokens.gather(1, g)

    def _embed(self, tokens):
        """The target's embeddings of a pair's token part."""
        return self.target.embed_tokens(tokens)

    def _step(self, tokens, features, columns, rows=None, compiled=True):
        """One drafter forward over (token, feature) pairs at cache columns ``columns`` (all rows, or
        cache rows ``rows`` when they are a subset, eagerly); ``compiled=False``: eagerly (shapes
        that come once, as a prompt's)."""
        self._forwards += 1
        emb = self._embed(tokens).to(self.model.fc.weight.dtype)
        feats = features.to(emb.dtype)
        if rows is not None and len(rows) == self.real.shape[0]:
            rows = None
        return self.model.step(emb, feats, columns, compiled=compiled, rows=rows)

    def _draw(self, features, generator):
        """Drafts (B,) and their law q (B, V) from predicted features (model rows, D)."""
        features = features.to(self.real.dtype)
        if self.keep is None:
            q = self.sampling.probs(self.target.head(features[:, None])[:, 0])
        else:  # guidance on the K kept logits, then -inf outside them
            kept = self.sampling.guide(self._kept_head(features))
            q = self._unguided.probs(full_vocabulary(kept, self.keep, self.target.vocab_size))
        return self.sampling.draw(q, generator), q

    def _catch_up(self, tokens, n):
        """Write positions consumed..n-1 from real features (the last pair repeating to fill a
        compiled bucket); returns each model row's output at n-1, which predicts position n (model
        rows, D), and n per model row."""
        nm, consumed = self.sampling.model_batch(n), self.consumed
        need = self.model.pairs_bucket(int((nm - consumed).max()))
        g = (consumed[:, None] + torch.arange(need, device=n.device)).minimum(nm[:, None] - 1)
        seq = self._generated_inputs(self.sampling.model_batch(tokens), g)
        out = self._step(seq, self.real.gather(1, g[..., None].expand(-1, -1, self.real.shape[-1])), self.P + g)
        self.consumed = nm
        return out.gather(1, (nm - 1 - consumed)[:, None, None].expand(-1, 1, out.shape[-1]))[:, 0], nm

    #: Whether proposals may run as one compiled greedy chain (Chimera's heads draft otherwise).
    chains_drafts = True

    def chain_modules(self, k: int, sampling=None):
        """The target's ``(head, embedding)`` modules where a proposal of ``k`` drafts under
        ``sampling`` (default: the decode's, from :meth:`start`) runs as one compiled greedy chain
        (:meth:`visualspec.models.feature_drafter.FeatureDraftModel.greedy_chain`): greedy, no
        guidance, a drafter network that chains ``k`` drafts (its ``chains(k)``: compiled, k not
        too long), a target that offers them (``chain_modules``, the head restricted to ``keep``
        where there is one); else None (draft by draft)."""
        sampling = sampling or self.sampling
        if not (self.chains_drafts and sampling.greedy and sampling.model_rows_per_sample == 1
                and self.model.chains(k) and hasattr(self.target, "chain_modules")):
            return None
        return self.target.chain_modules(self.keep)

    def precompile_chains(self, rows: int, columns: int, counts, sampling, feature_dtype) -> None:
        """Compile the greedy chains of the proposals of ``counts`` drafts that would chain under
        ``sampling`` (:meth:`chain_modules`), for ``rows`` rows over a ``columns``-column cache,
        before a decode; nothing where none would."""
        counts = [k for k in counts if self.chain_modules(k, sampling) is not None]
        if counts:
            self.model.precompile_chain(rows, columns, counts, *self.chain_modules(counts[0], sampling), feature_dtype)

    def propose(self, tokens, n, k, generator=None):
        B = tokens.shape[0]
        n = per_row(n, B, tokens.device)
        drafts = tokens.new_empty(B, k)
        if k == 0:
            return drafts, None
        last, nm = self._catch_up(tokens, n)
        chain = self.chain_modules(k)
        if chain is not None:  # greedy: one compiled call for the k drafts; the rule reads no draft law
            self._forwards += k - 1
            return self.model.greedy_chain(last, self.P + nm, k, *chain, self.real.dtype).to(tokens.dtype), None
        probs = []
        for j in range(k):
            drafts[:, j], q = self._draw(last, generator)
            probs.append(q)
            if j + 1 < k:  # the drafted token at position n+j, with the feature predicted for n+j-1
                column = (self.P + nm + j)[:, None]
                last = self._step(self.sampling.model_batch(drafts[:, j:j + 1]), last[:, None], column)[:, 0]
        return drafts, torch.stack(probs, 1)

    def propose_dynamic_tree(self, tokens, n, depth: int, width: int, generator=None):
        """A dynamic draft tree (:class:`visualspec.core.dynamic_tree.DynamicTree`): after the
        catch-up, level by level, :func:`visualspec.core.dynamic_tree.grow_level` picks the level's
        ``width`` nodes from the laws of the nodes above, and one drafter pass over them (tree
        attention: each node attends the real columns and its own ancestors, written in the
        scratch columns :meth:`use_tree` reserved) gives the laws of their children. The laws are
        the sampling's of the target's head on the predicted features; greedy decoding ranks by
        the head's softmax."""
        from ..core.dynamic_tree import DynamicTree, grow_level

        if self.sampling.uses_guidance:
            raise ValueError("dynamic draft trees do not support classifier-free guidance")
        valid = self.model.valid_columns
        if self.tree_columns < (depth - 1) * width or valid.shape[1] < self.P + self.N + 1 + self.tree_columns:
            raise ValueError(f"call use_tree({depth}, {width}) before the decode starts")
        B = tokens.shape[0]
        n = per_row(n, B, tokens.device)
        last, nm = self._catch_up(tokens, n)
        laws, ranks = self._laws(last[:, None])
        path = torch.ones(B, 1, dtype=torch.float64, device=tokens.device)
        S = valid.shape[1]
        scratch = S - self.tree_columns
        key = torch.arange(S, device=tokens.device)
        real = (key < (self.P + nm)[:, None]) & valid & (key < scratch)  # (B, S)
        own = torch.eye(width, dtype=torch.bool, device=tokens.device)
        seen = None  # (B, width, S): the scratch columns of each node of the level and its ancestors
        levels, parents, qs, above = [], [], [laws[:, 0]], last[:, None]
        for level in range(depth):
            t, par, path = grow_level(path, laws.double(), ranks.double(), width, generator, self.sampling.greedy)
            levels.append(t)
            parents.append(par)
            if level + 1 == depth:
                break
            slots = scratch + level * width + torch.arange(width, device=tokens.device)
            mine = torch.zeros(B, width, S, dtype=torch.bool, device=tokens.device)
            mine[:, :, scratch + level * width:scratch + (level + 1) * width] = own
            seen = mine if seen is None else mine | seen.gather(1, par[..., None].expand(-1, -1, S))
            feats = above.gather(1, par[..., None].expand(-1, -1, above.shape[-1]))
            self._forwards += 1
            emb = self._embed(t).to(self.model.fc.weight.dtype)
            above = self.model.tree_step(emb, feats.to(emb.dtype), (self.P + nm + level)[:, None].expand(B, width),
                                         slots.expand(B, width), real[:, None] | seen)
            laws, ranks = self._laws(above)
            qs.extend(laws.unbind(1))
        q = torch.stack(qs, 1) if len(qs) > 1 else qs[0][:, None]
        return DynamicTree(torch.stack(levels, 1), torch.stack(parents, 1), q)

    def _laws(self, features):
        """The drafts' laws q (B, F, V) from predicted features (B, F, D), and the laws children
        are ranked by: q, or under greedy decoding the head's softmax."""
        logits = self.target.head(features.to(self.real.dtype))
        q = self.sampling.probs(logits)
        return q, (torch.softmax(logits.float(), -1) if self.sampling.greedy else q)

    def observe(self, n, committed, target_probs, generator=None, features=None):
        """Keep the window's real features (model rows, k+1, D) at positions n-1..n+k-1."""
        if features is None or self.real is None:
            return
        nm = self.sampling.model_batch(per_row(n, self.batch_size, features.device))
        at = (nm[:, None] + torch.arange(features.shape[1], device=nm.device)).clamp(max=self.real.shape[1] - 1)
        features = self.model.intake(features.to(self.real.dtype))
        self.real.scatter_(1, at[..., None].expand(-1, -1, features.shape[-1]), features)

    def select(self, rows):
        model_rows = self.sampling.model_rows(rows, self.batch_size)
        self.model.select(model_rows)
        self.real, self.consumed = self.real[model_rows], self.consumed[model_rows]
        self.batch_size = len(rows)

    def draft_timer(self, batch_size, num_tokens, sampling):
        """Proposals as a decode step makes them: the k + 1 pairs the step before committed caught
        up (in their compiled bucket), then k drafts (k - 1 more steps, a head and a draw each), on
        a fresh state of ``batch_size`` rows (zero features: the cost does not depend on them)."""
        self.start(batch_size, num_tokens, sampling)
        device = self.model.fc.weight.device
        ids, _ = self._prompt(list(range(batch_size)))
        width = 1 if ids is None else ids.shape[1]
        dtype = self.target.embed_tokens(torch.zeros(1, 1, dtype=torch.long, device=device)).dtype
        rows = batch_size * sampling.model_rows_per_sample
        self.prefix_features(torch.zeros(rows, width, self.model.target_width, dtype=dtype, device=device))
        tokens = torch.zeros(batch_size, num_tokens, dtype=torch.long, device=device)

        def propose(n: int, k: int) -> None:
            at = torch.full((batch_size,), n, device=device)
            self.consumed = (sampling.model_batch(at) - k - 1).clamp(min=0)
            self.propose(tokens, at, k)

        return propose

    def cost_tag(self):
        kept = "" if self.keep is None else f"|kept={len(self.keep)}"
        return f"{type(self).__name__}={config_hash(self.model)}{kept}"

    def reset(self, rows, requests):
        if self.prefix is not None and not callable(self.prefix):
            raise ValueError("continuous batching with a feature drafter needs the prompt as a function of the "
                             "request indices")
        self._requests = requests  # prefix_features() reads these rows' prompts next


class ChimeraDrafter(FeatureDrafter):
    """Drafts with a Chimera drafter (:class:`visualspec.models.chimera.ChimeraDraftModel`): after
    the same catch-up on the verified window's real features, one pass gives K predicted features
    at once, head i's for token n + i, so a step drafts min(k, K) tokens with no drafter pass per
    draft. Each draft is drawn from q_i, the sampling's law of the target's head on head i's
    feature, and q_i is returned, so the exact rule keeps decoding lossless (q_i does not depend on
    the drafts before it, which the rule allows).

    A pair's token part is the trigram (x_{c-2}, x_{c-1}, x_c): the prompt's last two tokens stand
    before generated position 0 (the first token, without a prompt).
    """

    chains_drafts = False  # one pass of its heads drafts every token already

    def start(self, batch_size, num_tokens, sampling):
        super().start(batch_size, num_tokens, sampling)
        self._before = None

    def use_tree(self, depth: int = 0, width: int = 0) -> None:
        if depth:
            raise ValueError("a Chimera drafter drafts a chain from its heads; dynamic draft trees need an EAGLE-style "
                             "feature drafter")

    def _prompt_inputs(self, ids, model_rows):
        from ..models.chimera import trigrams

        before = ids[:, -2:] if ids.shape[1] >= 2 else ids[:, -1:].expand(-1, 2)
        if self._before is None:
            self._before = before.new_zeros(self.real.shape[0], 2)
        self._before[model_rows] = before
        return trigrams(ids)[:, 1:]

    def _generated_inputs(self, tokens, g):
        before = self._before if self._before is not None else tokens[:, :1].expand(-1, 2)
        full = torch.cat([before, tokens], 1)  # generated position g at g + 2
        return torch.stack([full.gather(1, g), full.gather(1, g + 1), full.gather(1, g + 2)], -1)

    def _embed(self, tokens):
        return self.target.embed_tokens(tokens).flatten(-2)

    def propose(self, tokens, n, k, generator=None):
        B = tokens.shape[0]
        n = per_row(n, B, tokens.device)
        k = min(k, self.model.config.heads)  # a drafter may draft fewer than asked
        drafts = tokens.new_empty(B, k)
        if k == 0:
            return drafts, None
        last, nm = self._catch_up(tokens, n)
        given = self.real.gather(1, (nm - 1)[:, None, None].expand(-1, 1, self.real.shape[-1]))[:, 0]  # f_{n-2}
        heads = self.model.head_features(given.to(last.dtype), last)
        probs = []
        for j in range(k):
            drafts[:, j], q = self._draw(heads[:, j], generator)
            probs.append(q)
        return drafts, torch.stack(probs, 1)

    def select(self, rows):
        if self._before is not None:
            self._before = self._before[self.sampling.model_rows(rows, self.batch_size)]
        super().select(rows)
