"""Proactive drafting (SJD-PAC's sibling tree), verified exactly.

A chain window drafts one token per position. When the first draft is wrong, the step commits a
single token, whatever the later drafts were; SJD commits one token in about half its steps.
Proactive drafting (Kang et al., "SJD-PAC", CVPR 2026) gives each of the first ``depth`` window
positions ``K`` candidates instead of one and feeds their Cartesian product as a tree: every node
at level l (position n + l - 1) has the same K children, the level-(l + 1) candidates, and the
all-first-candidates path continues as the ordinary chain of drafts. One forward with tree attention
scores every node, so a rejected first candidate can be replaced by a sibling whose own
continuation was scored in the same forward.

**Candidates.** At level l, candidate 0 is the chain's draft ``x ~ q_l`` (the drafter's own
draft and its distribution). Candidates 1..K-1 are drawn from ``q_l`` without replacement, after
x: together the K are a without-replacement sequence from ``q_l`` in draw order, which is what
:func:`visualspec.core.multidraft.rsd_verify` needs. Where the draft is a point mass (a fresh
Jacobi initialisation) no sibling has probability under ``q_l``; the siblings are then arbitrary
distinct tokens, which the rule rejects with certainty, and the level behaves as a chain.

**Verification** (:func:`verify_sibling_tree`). Walk from the root: at level l, recursive
rejection sampling (RSD) among the current node's K children against the target's distribution
after that node. The first accepted child becomes the current node; if all are rejected the
RSD residual sample is emitted and the step ends. After ``depth`` accepted levels the step goes on
with the exact chain rule along the remaining chain drafts when the path is the chain, and else
emits one token from the target's distribution after the path's last node.

**Lossless.** By induction over the levels: RSD emits exactly p_l whatever the candidates, as the
candidates are a without-replacement sequence from q_l drawn before the target was run, and the
accepted node's continuation at the next level is scored given exactly the tokens committed so
far. The chain rule after the tree is the ordinary speculative rule. With K = 1 every level is a
single speculative test and the step is plain SJD. The implementation deviations of the released
code (longest-row selection, siblings drawn from the residual but verified as draws from p,
an all-siblings residual in later columns) are not reproduced; ``tests/core/test_proactive.py``
checks the exact law with a chi-square test, and a control that tests each sibling against p
instead of the recursive residual fails it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from .multidraft import gumbel_noise, rsd_verify
from .sampling import Generator, sample
from .verify import Verdict, speculative_verify


@dataclass(frozen=True)
class SiblingLayout:
    """The flattened tree of one step: the root (the last committed token), the chain of ``k``
    drafts, then the off-chain nodes of levels 1..``depth`` (``siblings`` candidates per level).

    - ``depths`` (N,): node i sits at position ``n - 1 + depths[i]``;
    - ``ancestors`` (N, N) bool: node i attends to node j iff j is i or an ancestor of i;
    - ``choice`` (N,): the candidate index a tree node holds (-1 for the root and for chain nodes
      past the tree);
    - ``children`` (N, K): node index of each child of a node above the last level (-1 elsewhere).
    """

    k: int
    depth: int
    siblings: int
    depths: torch.Tensor
    ancestors: torch.Tensor
    choice: torch.Tensor
    children: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.depths.shape[0])


def extra_nodes(depth: int, siblings: int) -> int:
    """Nodes a sibling tree adds to a chain window: ``sum_{l=1..depth} (K^l - 1)``."""
    return sum(siblings ** level - 1 for level in range(1, depth + 1))


@lru_cache(maxsize=64)
def sibling_layout(k: int, depth: int, siblings: int) -> SiblingLayout:
    """The tree of ``k`` chain drafts whose first ``depth`` (<= k) positions have ``siblings``
    candidates each. Node 0 is the root, nodes 1..k the chain (the all-zero path), then the other
    paths of levels 1..depth in order of level, then path (lexicographic)."""
    if not 0 <= depth <= k:
        raise ValueError(f"the sibling depth must lie in 0..{k} (the drafts), got {depth}")
    paths = [()] + [(0,) * j for j in range(1, k + 1)]
    for level in range(1, depth + 1):
        every = [()]
        for _ in range(level):
            every = [p + (c,) for p in every for c in range(siblings)]
        paths += [p for p in every if any(p)]
    index = {p: i for i, p in enumerate(paths)}
    N = len(paths)
    parent = [index[p[:-1]] if p else -1 for p in paths]
    ancestors = torch.eye(N, dtype=torch.bool)
    for i in range(N):
        j = parent[i]
        while j >= 0:
            ancestors[i, j] = True
            j = parent[j]
    children = torch.full((N, siblings), -1, dtype=torch.long)
    for i, p in enumerate(paths):
        if len(p) < depth:
            for c in range(siblings):
                children[i, c] = index[p + (c,)]
    depths = torch.tensor([len(p) for p in paths], dtype=torch.long)
    choice = torch.tensor([p[-1] if p and len(p) <= depth else -1 for p in paths], dtype=torch.long)
    return SiblingLayout(k, depth, siblings, depths, ancestors, choice, children)


def draw_siblings(drafts: torch.Tensor, q: torch.Tensor, siblings: int, generator: Generator = None) -> torch.Tensor:
    """K candidates per position: the draft, then K - 1 more from q without replacement.

    ``drafts`` (B, D) long with laws ``q`` (B, D, V) -> (B, D, K). Gumbel-top-k over q with the
    draft removed: in key order the extra candidates have the law of sequential draws without
    replacement after the draft. Tokens q cannot draw rank below every possible one (any order
    among them), so all K candidates of a position are distinct whenever V >= K.
    """
    B, D = drafts.shape
    V = q.shape[-1]
    if siblings > V:
        raise ValueError(f"cannot draw {siblings} distinct candidates from a vocabulary of {V}")
    gumbel = gumbel_noise((B, D, V), generator, drafts.device)
    logq = torch.where(q > 0, q.double().clamp(min=1e-300).log(), torch.full_like(gumbel, -1e300))
    keys = (logq + gumbel).scatter(-1, drafts[..., None], float("-inf"))
    others = keys.topk(siblings - 1, dim=-1).indices
    return torch.cat([drafts[..., None], others], dim=-1)


def verify_sibling_tree(layout: SiblingLayout, candidates: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                        draft_probs: torch.Tensor | None, p: torch.Tensor, generator: Generator = None):
    """The exact walk down a sibling tree (see the module docstring).

    ``candidates`` (B, depth, K) from :func:`draw_siblings`, ``q`` (B, depth, V) their laws,
    ``drafts`` (B, k) and ``draft_probs`` (B, k, V) or None the chain, ``p`` (B, N, V) the target
    after every node of ``layout``. Returns ``(verdict, tokens, path)``: the :class:`Verdict`
    (accepted count and the emitted token), ``tokens`` (B, k) the committed candidates in window
    order (valid up to the accepted count), and ``path`` (B, k) the node holding each of them.
    """
    B, device = drafts.shape[0], drafts.device
    rows = torch.arange(B, device=device)
    children = layout.children.to(device)
    chain_nodes = torch.arange(1, layout.k + 1, device=device)
    tokens, path = drafts.clone(), chain_nodes.expand(B, -1).clone()
    node = torch.zeros(B, dtype=torch.long, device=device)  # the current node: the root
    alive = torch.ones(B, dtype=torch.bool, device=device)
    accepted = torch.zeros(B, dtype=torch.long, device=device)
    emitted = torch.zeros(B, dtype=torch.long, device=device)
    for level in range(layout.depth):
        verdict = rsd_verify(candidates[:, level], q[:, level], p[rows, node], generator)
        hit = verdict.index >= 0
        emitted = torch.where(alive & ~hit, verdict.token, emitted)
        alive = alive & hit
        pick = verdict.index.clamp(min=0)
        node = torch.where(alive, children[node, pick], node)
        tokens[:, level] = torch.where(alive, candidates[rows, level, pick], tokens[:, level])
        path[:, level] = torch.where(alive, node, path[:, level])
        accepted += alive.long()
    # the rest of the chain, for rows still on it; one exact token after an off-chain path
    d = layout.depth
    rest_q = None if draft_probs is None else draft_probs[:, d:]
    rest = speculative_verify(drafts[:, d:], rest_q, p[:, d:layout.k + 1], generator)
    on_chain = alive & (node == d)
    off_chain = sample(p[rows, node], generator)
    emitted = torch.where(on_chain, rest.next_tokens, torch.where(alive, off_chain, emitted))
    accepted = accepted + torch.where(on_chain, rest.num_accepted, torch.zeros_like(accepted))
    return Verdict(accepted, emitted), tokens, path


def tree_step_timer(model, rows_per_sample: int, siblings: int, depth: int):
    """A stand-in for one sibling-tree step with window W, to time with
    :func:`visualspec.core.window_costs.measure_window_costs` (``forward=``): called with tokens
    (model rows, W) and a start, it runs the tree's forward, the candidates, the walk and
    ``keep`` on distributions of the model's shape (the chain's own softmax, which accepts every
    draft: the walk does the same work whatever it accepts). W = 1 is a plain one-token forward.
    ``rows_per_sample`` is 2 under classifier-free guidance, else 1."""

    def step(tokens: torch.Tensor, start) -> None:
        rows, window = tokens.shape
        k = window - 1
        if k == 0:
            model.forward_window(tokens, start)
            return
        layout = sibling_layout(k, min(depth, k), siblings)
        start = torch.as_tensor(start, device=tokens.device).expand(rows)
        logits = model.forward_tree(tokens.new_zeros(rows, layout.size), layout.depths.to(tokens.device),
                                    layout.ancestors.to(tokens.device), start)
        p = torch.softmax(logits[:rows // rows_per_sample].float(), dim=-1)
        drafts, q = p[:, 1:k + 1].argmax(-1), p[:, 1:k + 1]
        d = layout.depth
        candidates = draw_siblings(drafts[:, :d], q[:, :d], siblings)
        verdict, _, path = verify_sibling_tree(layout, candidates, q[:, :d], drafts, q, p)
        nodes = torch.cat([torch.zeros_like(path[:, :1]), path], 1)
        model.keep(nodes.repeat(rows_per_sample, 1), (verdict.num_accepted + 1).repeat(rows_per_sample))

    return step
