"""Decoding with trees of drafts scored in one forward (tree attention).

- :func:`decode_tree`: multi-draft decoding, ``branches`` chains of ``depth`` drafts that share
  their root, a multi-draft rule (:mod:`visualspec.core.multidraft`) at the first position and the
  chain rule along the picked chain;
- :func:`_sibling_step`: one step of proactive drafting (:mod:`visualspec.core.proactive`) inside
  :func:`visualspec.core.engine.decode`, a chain whose first positions have sibling candidates.

Both run on the rows and runs of :mod:`visualspec.core.rows`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .checks import check_positive_int
from .proactive import draw_siblings, sibling_layout, verify_sibling_tree
from .rows import _Run
from .sampling import Generator, SamplingConfig
from .stats import DecodeStats
from .verify import default_rule, point_mass


def _sibling_step(run: _Run, drafts: torch.Tensor, draft_probs: torch.Tensor | None, siblings: int, depth: int):
    """One proactive-drafting step: draw the siblings, score the tree in one forward, walk it.
    Returns the verdict, the committed candidates (b, k), the target's distributions along the
    chain (b, k+1, V) for the drafter, as a chain step would give them, and the accepted path's
    nodes (b, k)."""
    rows, target, gens = run.rows, run.target, run.rows.generator
    k, device = drafts.shape[1], drafts.device
    layout = sibling_layout(k, depth, siblings)
    q = point_mass(drafts[:, :depth], target.vocab_size) if draft_probs is None else draft_probs[:, :depth]
    candidates = draw_siblings(drafts[:, :depth], q, siblings, gens)
    depths = layout.depths.to(device)
    off = slice(k + 1, None)  # the nodes after the root and the chain: level depths[i], candidate choice[i]
    flat = torch.cat([rows.last(), drafts, candidates[:, depths[off] - 1, layout.choice.to(device)[off]]], 1)
    logits = target.forward_tree(rows.model(flat), depths, layout.ancestors.to(device), rows.model(rows.n - 1))
    p = run.probs(logits, rows.n[:, None] + depths)  # (b, N, V)
    verdict, committed, path = verify_sibling_tree(layout, candidates, q, drafts, draft_probs, p, gens)
    run.stats.sibling_steps += int((path > k).any(1).sum())  # nodes past the chain are siblings
    return verdict, committed, p[:, :k + 1], path


@torch.no_grad()
def decode_tree(
    target,
    prefix: Any,
    num_tokens: int,
    sampling: SamplingConfig,
    drafter,
    *,
    branches: int,
    depth: int,
    rule: Callable,
    generator: Generator = None,
    mode: str = "",
    stop_token: int | None = None,
) -> tuple[torch.Tensor, DecodeStats]:
    """Multi-draft decoding: each step the drafter proposes ``branches`` chains of ``depth`` tokens
    (:class:`visualspec.core.multidraft.DraftTree`), the target (a
    :class:`visualspec.core.engine.TreeTokenModel`) scores the whole tree in one forward, and

    1. the multi-draft ``rule`` (:mod:`visualspec.core.multidraft`, matching the drafter's scheme) picks
       at most one of the first tokens, or emits a residual sample;
    2. the picked chain's remaining drafts are verified by the lossless chain rule
       (:func:`visualspec.core.verify.default_rule`), which emits the next token after them.

    Lossless when the rule is lossless for the drafter's scheme: the first emitted token has law p
    whatever was drafted, and given the picked first token its chain was drafted from the chain's
    own q, which step 2 verifies exactly. Rows commit their own counts, as in
    :func:`visualspec.core.engine.decode`. ``prefix`` is the model's prefix for every row;
    ``stop_token`` ends a row as there.
    """
    check_positive_int("branches (k)", branches)
    check_positive_int("depth", depth)
    if sampling.uses_guidance:
        raise ValueError("tree decoding does not support classifier-free guidance")
    chain_rule = default_rule(sampling)
    run = _Run(target, prefix, num_tokens, sampling, drafter=drafter, rule=chain_rule, generator=generator,
               mode=mode or f"tree {branches}x{depth}", stop_token=stop_token)
    while run.live():
        rows = run.rows
        n, gens = rows.n, rows.generator
        L = depth  # rows near their end draft past it (fillers): a row's draws depend on the tree alone
        tree = drafter.propose_tree(rows.seq, n, branches, L, gens)
        depths, ancestors = tree.layout()
        flat = torch.cat([rows.last(), tree.tokens.flatten(1)], dim=1)
        p = sampling.probs(target.forward_tree(flat, depths, ancestors, n - 1))  # (b, 1 + k L, V)
        run.step_done()

        first_verdict = rule(tree.tokens[:, :, 0], tree.first_q, p[:, 0], gens)
        b = len(rows)
        idx = torch.arange(b, device=flat.device)
        picked = first_verdict.index.clamp(min=0)  # rows that rejected every candidate use chain 0 (unused)
        chain = tree.tokens[idx, picked]  # (b, L)
        nodes = 1 + picked[:, None] * L + torch.arange(L, device=flat.device)  # the chain's nodes
        chain_p = p[idx[:, None], nodes]  # (b, L, V): p after each chain token
        chain_q = None if tree.chain_q is None else tree.chain_q[idx, picked]
        rest = chain_rule(chain[:, 1:], chain_q, chain_p, gens)
        hit = first_verdict.index >= 0
        accepted = torch.where(hit, 1 + rest.num_accepted, torch.zeros_like(rest.num_accepted))
        emitted = torch.where(hit, rest.next_tokens, first_verdict.token)
        counts = run.commit(chain, accepted, emitted)
        run.keep(nodes, counts)  # the root and the accepted chain nodes: positions n-1 .. n+counts-2
        drafter.observe(n, counts, torch.cat([p[:, :1], chain_p], dim=1), gens)
        run.finish_rows()
    return run.result()
