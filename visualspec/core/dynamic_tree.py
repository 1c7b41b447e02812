"""Dynamic draft trees (EAGLE-2's idea), grown where the drafter is confident and verified exactly.

Each step the drafter grows a tree of ``depth`` levels with ``width`` nodes at every level (fixed
shapes: one target forward over ``1 + depth * width`` nodes with tree attention). Level 1 holds
the root's ``width`` most likely children; below, the ``width`` slots of a level go to the nodes of
the level above by :func:`allocate_children`: the best estimates of path probability, so a
confident path grows deep and wide and an unlikely one stops.

**Lossless.** EAGLE-2 reranks the finished tree by the drafted tokens' own probabilities, which
makes how many children a node keeps depend on what those children are; verification then sees
candidates that are not draws from q, and the output law shifts. Here a node's child count is
fixed before its children are drawn, from its path probability and its ranked draft law only
(:func:`allocate_children`), and its children are the first ``count`` of a without-replacement
draw sequence from that law (Gumbel top-k keys: :func:`draw_children`). Verification walks from
the root: at the current node, recursive rejection sampling among its children
(:func:`visualspec.core.multidraft.rsd_verify` with the node's count) against the target's law
after the node; the accepted child becomes the current node, a rejection of all emits RSD's
residual sample and ends the step; after ``depth`` accepted levels one token is sampled from the
target's law after the last node. By induction over the levels each emitted token has the
target's law given the tokens before it: RSD emits p exactly for candidates that are a
without-replacement sequence from q of a length fixed independently of them, and what the
deeper levels drafted is drawn afresh given the accepted node. Greedy decoding ranks the
children by the drafter's softmax and accepts the child equal to the target's argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .checks import check_positive_int
from .multidraft import greedy_multidraft_verify, gumbel_top_k, rsd_verify
from .rows import _Run
from .sampling import Generator, SamplingConfig, sample
from .stats import DecodeStats
from .verify import default_rule


def check_tree_shape(depth, width) -> tuple[int, int]:
    """``depth`` (levels of drafts) and ``width`` (nodes per level, the tree's budget per level),
    each at least 1."""
    return int(check_positive_int("tree depth", depth)), int(check_positive_int("tree width (nodes per level)", width))


def allocate_children(path_probs: torch.Tensor, ranked_q: torch.Tensor, width: int) -> torch.Tensor:
    """How many children each of F nodes gets, from what is known before any child is drawn:
    the ``width`` largest estimates ``e[i, j] = path_probs[i] * ranked_q[i, j]`` over nodes i and
    ranks j < width (``ranked_q[i]``: node i's draft law sorted in decreasing order, its first
    ``width`` entries), node i getting ``c_i = #{j : (i, j) among them}``; ``sum_i c_i = width``.
    (B, F), (B, F, >= width) -> counts (B, F) long."""
    B, F = path_probs.shape
    estimates = (path_probs[..., None] * ranked_q[..., :width]).reshape(B, -1)
    chosen = torch.zeros_like(estimates).scatter_(1, estimates.topk(width, dim=1).indices, 1.0)
    return chosen.view(B, F, -1).sum(-1).long()


def draw_children(q: torch.Tensor, width: int, generator: Generator = None, greedy: bool = False) -> torch.Tensor:
    """``width`` distinct candidate children per node, in draw order: ``q`` (B, F, V) -> (B, F, width).
    Sampled: :func:`visualspec.core.multidraft.gumbel_top_k`, a without-replacement draw sequence
    from q (its first c are what a node with c children keeps). ``greedy``: the ``width`` most
    likely tokens of q, in order."""
    return q.topk(width, dim=-1).indices if greedy else gumbel_top_k(q.double().log(), width, generator)


@dataclass
class DynamicTree:
    """One step's draft tree, in slots: ``tokens`` (B, depth, width), level l's slot s holding a
    node whose parent is slot ``parents[:, l, s]`` of level l - 1 (level 0's parents are the root,
    0); a parent's children are in draw order. ``q`` (B, 1 + (depth - 1) * width, V): the law the
    children of the root and of every node above the last level were drawn from, in node order."""

    tokens: torch.Tensor
    parents: torch.Tensor
    q: torch.Tensor

    @property
    def depth(self) -> int:
        return self.tokens.shape[1]

    @property
    def width(self) -> int:
        return self.tokens.shape[2]

    def layout(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The flattened tree ``[root, level 1 slots, level 2 slots, ...]``: depths (N,) and the
        ancestor mask (B, N, N) bool, where node i attends to node j iff j is i or an ancestor."""
        B, D, w = self.tokens.shape
        device = self.tokens.device
        N = 1 + D * w
        depths = torch.cat([torch.zeros(1, dtype=torch.long), torch.arange(1, D + 1).repeat_interleave(w)]).to(device)
        ancestors = torch.eye(N, dtype=torch.bool, device=device).expand(B, N, N).clone()
        ancestors[:, :, 0] = True
        for level in range(D):
            nodes = 1 + level * w + torch.arange(w, device=device)
            parents = self.parents[:, level] + (1 + (level - 1) * w if level else 0)  # node index of each parent
            ancestors[:, nodes] |= ancestors.gather(1, parents[..., None].expand(B, w, N))
        return depths, ancestors


def grow_level(path_probs: torch.Tensor, q: torch.Tensor, rank_q: torch.Tensor, width: int,
               generator: Generator = None, greedy: bool = False):
    """One level of a dynamic tree from the F nodes above it (their path probabilities (B, F),
    the laws their children are drawn from, q (B, F, V), and the laws they are ranked by, rank_q:
    q itself, or the drafter's softmax when decoding greedily): the counts of
    :func:`allocate_children`, the children of :func:`draw_children`, each node's first ``count``
    kept in parent order. Returns ``(tokens (B, width), parents (B, width), path_probs (B, width))``."""
    B, F, _ = q.shape
    ranked = rank_q.topk(width, dim=-1).values
    counts = allocate_children(path_probs, ranked, width)
    children = draw_children(rank_q if greedy else q, width, generator, greedy)  # (B, F, width)
    keep = (torch.arange(width, device=q.device) < counts[..., None]).flatten(1)  # exactly width a row
    tokens = children.flatten(1)[keep].view(B, width)
    parents = torch.arange(F, device=q.device).repeat_interleave(width).expand(B, -1)[keep].view(B, width)
    law = rank_q.gather(2, children).flatten(1)[keep].view(B, width)
    return tokens, parents, path_probs.gather(1, parents) * law


def verify_dynamic_tree(tree: DynamicTree, p: torch.Tensor, greedy: bool, generator: Generator = None):
    """The exact walk down ``tree`` (see the module docstring) with the target's laws ``p``
    (B, N, V) after every node. Returns ``(accepted (B,), emitted (B,), tokens (B, depth), path
    (B, depth))``: the committed drafts in order (valid up to ``accepted``), the token emitted after
    them, and the node index of each committed draft."""
    B, D, w = tree.tokens.shape
    device = p.device
    rows = torch.arange(B, device=device)
    node = torch.zeros(B, dtype=torch.long, device=device)  # the current node: the root
    slot = torch.zeros(B, dtype=torch.long, device=device)  # its slot in its level (the root: 0)
    alive = torch.ones(B, dtype=torch.bool, device=device)
    accepted = torch.zeros(B, dtype=torch.long, device=device)
    emitted = torch.zeros(B, dtype=torch.long, device=device)
    tokens = tree.tokens[:, :, 0].clone()
    path = (1 + torch.arange(D, device=device) * w).expand(B, D).clone()  # distinct placeholders past the accepted
    for level in range(D):
        mine = tree.parents[:, level] == slot[:, None]  # (B, w): the current node's children
        counts = mine.sum(1)
        order = (~mine).long().argsort(dim=1, stable=True)  # its children first, in draw order
        candidates = tree.tokens[:, level].gather(1, order)
        q = tree.q[rows, node]
        if greedy:
            verdict = greedy_multidraft_verify(candidates, q, p[rows, node], counts=counts)
        else:
            verdict = rsd_verify(candidates, q, p[rows, node], generator, counts=counts)
        hit = verdict.index >= 0
        emitted = torch.where(alive & ~hit, verdict.token, emitted)
        alive = alive & hit
        slot = torch.where(alive, order.gather(1, verdict.index.clamp(min=0)[:, None])[:, 0], slot)
        node = torch.where(alive, 1 + level * w + slot, node)
        tokens[:, level] = torch.where(alive, tree.tokens[rows, level, slot], tokens[:, level])
        path[:, level] = torch.where(alive, node, path[:, level])
        accepted += alive.long()
    last = p[rows, node].argmax(-1) if greedy else sample(p[rows, node], generator)
    return accepted, torch.where(alive, last, emitted), tokens, path


@torch.no_grad()
def decode_dynamic_tree(target, prefix, num_tokens: int, sampling: SamplingConfig, drafter, *, depth: int,
                        width: int, generator: Generator = None, mode: str = "",
                        stop_token: int | None = None) -> tuple[torch.Tensor, DecodeStats]:
    """Decoding with a dynamic draft tree each step (see the module docstring): ``drafter``'s
    ``propose_dynamic_tree`` grows it, the target (a :class:`visualspec.core.engine.TreeTokenModel`)
    scores all its nodes in one forward, :func:`verify_dynamic_tree` walks it. A drafter that reads
    the target's features gets those of the accepted path. Lossless for any sampling without
    guidance; rows commit their own counts; ``stop_token`` ends a row as in
    :func:`visualspec.core.engine.decode`."""
    depth, width = check_tree_shape(depth, width)
    if sampling.uses_guidance:
        raise ValueError("tree decoding does not support classifier-free guidance")
    if not hasattr(drafter, "propose_dynamic_tree"):
        raise TypeError(f"{type(drafter).__name__} cannot grow a dynamic draft tree (no propose_dynamic_tree)")
    drafter.use_tree(depth, width)  # its scratch columns, before the prefill sizes its cache
    run = _Run(target, prefix, num_tokens, sampling, drafter=drafter, rule=default_rule(sampling), generator=generator,
               mode=mode or f"dynamic tree {depth}x{width}", stop_token=stop_token)
    features = run.features
    while run.live():
        rows = run.rows
        n, gens = rows.n, rows.generator
        tree = drafter.propose_dynamic_tree(rows.seq, n, depth, width, gens)
        depths, ancestors = tree.layout()
        flat = torch.cat([rows.last(), tree.tokens.flatten(1)], dim=1)
        out = target.forward_tree(flat, depths, ancestors, n - 1, **run._feature_flag)
        logits, feats = out if features else (out, None)
        p = sampling.probs(logits)  # (b, N, V)
        run.step_done()
        accepted, emitted, tokens, path = verify_dynamic_tree(tree, p, sampling.greedy, gens)
        counts = run.commit(tokens, accepted, emitted)
        run.keep(path, counts)
        nodes = torch.cat([torch.zeros_like(path[:, :1]), path], 1)  # the root, then the accepted path
        idx = torch.arange(len(rows), device=flat.device)[:, None]
        drafter.observe(n, counts, p[idx, nodes], gens, **({"features": feats[idx, nodes]} if features else {}))
        run.finish_rows()
    return run.result()
