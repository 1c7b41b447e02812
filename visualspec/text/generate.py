"""Speculative decoding for Hugging Face causal language models, on the image pipelines' core.

    out = generate_text(model, tokenizer, "def fib(n):", drafter="ngram", max_new_tokens=64, temperature=0)
    out.text, out.token_ids, out.stats

The target is wrapped as a token model (:class:`visualspec.models.hf.HFCausalLM`) and decoded by the one
engine (:func:`visualspec.core.engine.decode`) with the verification rules of :mod:`visualspec.core.verify`;
nothing here re-implements a rule. Drafters:

- a transformers model (a smaller one with the same vocabulary): :class:`DraftModelDrafter`; with
  ``draft_vocab`` its LM head is trimmed to a kept set of tokens (VocabTrim,
  :class:`visualspec.drafters.VocabTrimDrafter`);
- ``"ngram"``: prompt lookup (:class:`visualspec.drafters.NGramDrafter`), deterministic drafts;
- ``"jacobi"``: Jacobi self-drafting (:class:`visualspec.drafters.JacobiDrafter`);
- ``"stand"``: stochastic drafts from an n-gram memory of the target's own distributions (STAND,
  :class:`visualspec.drafters.StandDrafter`);
- a feature drafter trained for the target (:class:`visualspec.models.feature_drafter.FeatureDraftModel`,
  ``visualspec train-drafter``): EAGLE-style drafts from the target's own features
  (:class:`visualspec.drafters.FeatureDrafter`), or a Chimera drafter
  (:class:`visualspec.models.chimera.ChimeraDraftModel`, ``--kind chimera``), whose heads draft
  several tokens from one pass over them (:class:`visualspec.drafters.ChimeraDrafter`);
- a Kangaroo adapter folder (``visualspec train-drafter --kind kangaroo``): the target's first
  layers and a trained adapter as a draft model (:mod:`visualspec.models.kangaroo`), which stops
  drafting below the folder's exit threshold unless ``draft_stop_below`` says otherwise.

``acceptance="exact"`` is lossless speculative sampling (greedy matching at ``temperature=0``);
``"typical"`` is Medusa's typical acceptance (lossy); ``"judge"`` is judge decoding (lossy): a judge
trained for the target (``visualspec train-judge --pair``) also keeps drafts it scores harmless.

A row stops at its first end-of-sequence token or after ``max_new_tokens``, as transformers'
``generate`` does; the text and ``token_ids`` end there.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from ..drafters import (ChimeraDrafter, DraftModelDrafter, FeatureDrafter, JacobiDrafter, LookupFeatureDrafter,
                        NGramDrafter, StandDrafter, VocabTrimDrafter, frequent_tokens, kept_token_ids)
from ..core.checks import check_positive_int
from ..core.compiled import check_compile, compiled_step
from ..core.engine import decode, precompile_decode
from ..models.feature_drafter import FeatureDraftModel, check_target, load_draft_model, weights_hash
from ..models.hf import HFCausalLM
from ..models.judge import JudgeHead, check_judge
from ..models.kangaroo import check_hash, is_kangaroo_folder, kangaroo_info, load_kangaroo
from ..core.multidraft import greedy_multidraft_verify, recursive_iid_verify, rsd_verify, spectr_verify
from ..core.sampling import SamplingConfig, check_sampling_args, make_generator
from ..core.stats import DecodeStats
from ..core.rows import feature_request
from ..core.dynamic_tree import check_tree_shape, decode_dynamic_tree
from ..core.tree import decode_tree
from ..core.judge import JudgeRule
from ..core.verify import default_rule, typical_verify
from ..core.window import WINDOWS
from ..core.window_costs import step_policy, step_tag

DRAFTERS = ("ngram", "jacobi", "stand")
LOOKUP_LONGEST = 8  # the longest match of the context's end that lookup= searches for (longest, then latest)
# with lookup=, the most drafts a step the feature drafter makes (None: the window's); chosen with lookup 3 and
# window 8 by the rule of docs/experiments/2026-12-07-lookup-feature-drafter.md
LOOKUP_FEATURE_DRAFTS = 3
ACCEPTANCE = ("exact", "typical", "judge")
STAND_STOP_BELOW = 0.5  # drafter="stand"'s default draft_stop_below (docs/experiments/2026-12-07-stand-stop-below.md)


@dataclass
class TextOutput:
    """``text``: the new text (a string, or a list for a list of prompts); ``token_ids``: the new
    tokens of each row up to and including the first EOS; ``stats``: the decode statistics."""

    text: str | list[str]
    token_ids: list[list[int]]
    stats: DecodeStats


def _vocab_size(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


def encode_prompts(tokenizer, prompt):
    """``(prompts, input_ids, attention_mask)`` of a prompt or a list of prompts, left-padded (every row
    continues from its last real token); the tokenizer's padding side and pad token are left as they were."""
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    if not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ValueError("prompt must be a non-empty string or a non-empty list of non-empty strings")
    side, pad = tokenizer.padding_side, tokenizer.pad_token
    tokenizer.padding_side = "left"  # generation continues every row from its last real token
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    try:
        enc = tokenizer(prompts, return_tensors="pt", padding=True)
    finally:
        tokenizer.padding_side, tokenizer.pad_token = side, pad
    return prompts, enc.input_ids, enc.attention_mask


def _draft_vocab(draft_vocab, vocab_size: int, prompt_rows, eos) -> torch.Tensor:
    """The kept token ids of ``draft_vocab``: ids as given, or for an int K the K ids described in
    :func:`generate_text`."""
    if isinstance(draft_vocab, int) and not isinstance(draft_vocab, bool):
        if not 1 <= draft_vocab <= vocab_size:
            raise ValueError(f"draft_vocab={draft_vocab} must be between 1 and the vocabulary size {vocab_size}")
        always = () if eos is None else (eos,)
        kept = frequent_tokens(prompt_rows, draft_vocab, always=always).tolist()
        chosen = set(kept)
        kept += [t for t in range(vocab_size) if t not in chosen][: draft_vocab - len(kept)]
        return kept_token_ids(kept, vocab_size)
    if isinstance(draft_vocab, (str, bytes, float, bool)):
        raise ValueError(f"draft_vocab must be an int or a list of token ids, not {draft_vocab!r}")
    return kept_token_ids(draft_vocab, vocab_size)


def _token_model(model, compile: bool, **kw) -> HFCausalLM:
    """``model`` as a token model: with ``compile``, on a static cache with its window forward compiled."""
    lm = HFCausalLM(model, static=compile, **kw)
    if compile:
        lm.compile_step()
    return lm


def _drafter(drafter, model, prefix, input_ids, attention_mask, ngram: int, draft_vocab=None, eos=None,
             stop_below=None, compile: bool = False, target: HFCausalLM | None = None, lookup: int | None = None):
    if isinstance(drafter, str) and drafter not in DRAFTERS:
        if not (Path(drafter) / "config.json").is_file():
            raise ValueError(f"unknown drafter {drafter!r}; choose one of {DRAFTERS}, a feature drafter folder or a "
                             f"Kangaroo folder (visualspec train-drafter) or pass a draft model")
        drafter = load_draft_model(drafter, torch_dtype=next(model.parameters()).dtype).eval()
    if lookup is not None and not isinstance(drafter, FeatureDraftModel):
        raise ValueError(f"lookup= copies drafts where the context repeats and lets a feature drafter draft "
                         f"elsewhere; it needs a feature drafter, not drafter={drafter!r}")
    model_free = drafter is None or (isinstance(drafter, (str, FeatureDraftModel)) and drafter != "stand")
    if draft_vocab is not None and (drafter is None or isinstance(drafter, str)):
        raise ValueError(f"draft_vocab trims the drafts' LM head; it needs a draft model or a feature drafter, "
                         f"not drafter={drafter!r}")
    if model_free and stop_below is not None:
        raise ValueError(f"draft_stop_below ends a draft model's or STAND's drafts early; it needs a draft model or "
                         f"drafter='stand', not drafter={drafter!r}")
    if drafter is None:
        return None
    rows = [ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask)]
    keep = None if draft_vocab is None else _draft_vocab(draft_vocab, _vocab_size(model), rows, eos)
    if isinstance(drafter, str):
        if drafter == "ngram":
            return NGramDrafter(rows, max_ngram=ngram)
        if drafter == "stand":
            return StandDrafter(rows, _vocab_size(model), max_ngram=ngram, stop_below=stop_below)
        return JacobiDrafter(_vocab_size(model), "repeat_left")
    if isinstance(drafter, FeatureDraftModel):
        check_target(drafter, model, target.feature_size)
        feature = FeatureDrafter.for_model(drafter, target, prefix, keep=keep)
        if lookup is None:
            return feature
        check_positive_int("lookup (the shortest match of the context's end that copies)", lookup)
        return LookupFeatureDrafter(NGramDrafter(rows, max_ngram=max(LOOKUP_LONGEST, lookup), min_ngram=lookup),
                                    feature, LOOKUP_FEATURE_DRAFTS)
    if not hasattr(drafter, "get_output_embeddings"):
        raise TypeError(f"drafter must be a transformers model, a feature drafter or one of {DRAFTERS}, "
                        f"not {type(drafter).__name__}")
    if _vocab_size(drafter) != _vocab_size(model):
        raise ValueError(f"the draft model's vocabulary ({_vocab_size(drafter)} tokens) differs from the target's "
                         f"({_vocab_size(model)}); draft and target must share one tokenizer")
    if kangaroo_info(drafter) is not None:
        check_hash(kangaroo_info(drafter)["target_hash"], model)
    if draft_vocab is None:
        return DraftModelDrafter(_token_model(drafter, compile), prefix, stop_below=stop_below)
    return VocabTrimDrafter(_token_model(drafter, compile, head_rows=keep), prefix, keep, stop_below=stop_below)


def _judge(judge, threshold, acceptance: str, model, drafter) -> JudgeRule | None:
    """The rule of ``acceptance="judge"`` (None for the other acceptances); errors name what is
    missing or does not fit: no judge, a judge of another target, no drafter, a bad threshold."""
    if acceptance != "judge":
        if judge is not None or threshold is not None:
            raise ValueError(f"judge and judge_threshold are for acceptance='judge', not {acceptance!r}")
        return None
    if judge is None:
        raise ValueError("acceptance='judge' needs a judge trained for this target: judge=FOLDER (visualspec "
                         "train-judge --pair) or a JudgeHead")
    if drafter is None:
        raise ValueError("acceptance='judge' judges drafts; give a drafter")
    if not isinstance(judge, JudgeHead):
        if not (Path(judge) / "config.json").is_file():
            raise ValueError(f"judge={str(judge)!r} is not a judge folder (no config.json); train one with "
                             f"visualspec train-judge --pair")
        judge = JudgeHead.from_pretrained(judge)
    check_judge(judge, model, model.get_output_embeddings().weight.shape[1])  # HFCausalLM.feature_size
    judge = judge.to(next(model.parameters()).device).eval()
    return JudgeRule(judge.score, judge.config.threshold if threshold is None else threshold, tag=weights_hash(judge))


MULTIDRAFT = {"rsd": (rsd_verify, "without_replacement"), "spectr": (spectr_verify, "iid"),
              "recursive_iid": (recursive_iid_verify, "iid")}


def _tree_args(branches, depth, window, multidraft, drafter, acceptance):
    """None for chain drafting, else ``(depth, rule, scheme)``; errors name the bad argument."""
    check_positive_int("branches (k, the number of drafts)", branches)
    if multidraft not in MULTIDRAFT:
        raise ValueError(f"unknown multidraft verifier {multidraft!r}; choose one of {tuple(MULTIDRAFT)}")
    if branches == 1:
        if depth is not None:
            raise ValueError("depth is for draft trees (branches > 1); a chain uses window - 1 drafts")
        return None
    if drafter is None or isinstance(drafter, FeatureDraftModel) or (isinstance(drafter, str) and drafter != "stand"):
        raise ValueError(f"a draft tree (branches={branches}) needs a draft model or drafter='stand', not {drafter!r}")
    if acceptance != "exact":
        raise ValueError("draft trees are verified exactly; acceptance must be 'exact'")
    rule, scheme = MULTIDRAFT[multidraft]
    if drafter == "stand" and scheme != "without_replacement":
        raise ValueError("drafter='stand' drafts without replacement (Gumbel-top-k); use multidraft='rsd'")
    if window == "auto" and depth is None:
        raise ValueError(f"a draft tree (branches={branches}) has a fixed shape; give its depth (depth=) or an "
                         f"integer window (window='auto' picks a chain's window)")
    depth = (window - 1) // branches if depth is None else depth
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"the draft tree needs depth >= 1; got depth={depth!r} (window={window}, branches={branches})")
    if window != "auto" and 1 + branches * depth > window:
        raise ValueError(f"a tree of {branches} x {depth} drafts plus the root is {1 + branches * depth} tokens, "
                         f"larger than the window of {window}")
    return depth, rule, scheme


def _dynamic_tree_args(tree_width, depth, branches, window, acceptance, draft_vocab, draft_stop_below) -> bool:
    """Whether the call grows dynamic draft trees (``tree_width`` given); errors name the bad argument."""
    if tree_width is None:
        return False
    check_tree_shape(depth, tree_width)
    for bad, why in ((branches != 1, "branches (a dynamic tree picks its own)"), (window != "auto", "window (its size "
                     "is 1 + depth * tree_width)"), (acceptance != "exact", "acceptance (it is verified exactly)"),
                     (draft_vocab is not None, "draft_vocab"), (draft_stop_below is not None, "draft_stop_below")):
        if bad:
            raise ValueError(f"a dynamic draft tree (tree_width={tree_width}) takes no {why}")
    return True


@torch.no_grad()
def generate_text(model, tokenizer, prompt, drafter=None, acceptance: str = "exact", max_new_tokens: int = 64,
                  temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                  generator=None, window: int | str = "auto", ngram: int = 3, typical_epsilon: float = 0.09,
                  typical_delta: float = 0.3, draft_vocab=None, branches: int = 1, depth: int | None = None,
                  multidraft: str = "rsd", draft_stop_below: float | None = None,
                  compile="auto", tree_width: int | None = None, judge=None,
                  judge_threshold: float | None = None, lookup: int | None = None) -> TextOutput:
    """Generate ``max_new_tokens`` tokens after ``prompt`` (a string or a list of strings).

    ``drafter``: ``None`` (plain autoregressive), a draft model, ``"ngram"``, ``"jacobi"`` or
    ``"stand"``; ``ngram``: the longest n-gram of ``"ngram"`` and ``"stand"``;
    ``window``: tokens per target forward (``window - 1`` drafts), or ``"auto"`` (the default): the
    engine picks it each step from what a whole decode step of each window costs on this machine
    (the drafts, the forward, the rule and the commit, timed once per model, drafter, rule and
    batch size by real decodes of this length at each fixed window and cached on disk:
    :func:`visualspec.core.window_costs.decode_step_costs`) and the tokens a step those decodes
    committed (for one prompt, pooled with this process's earlier calls on the same table); it
    decodes plain AR (W = 1) wherever speculating would be slower.
    ``temperature=0`` is greedy.

    ``draft_vocab`` (with a draft model or a feature drafter) trims the draft LM head to a kept set
    of tokens (VocabTrim; FR-Spec for a feature drafter, whose drafts read the target's head): it
    computes only the kept token ids, and drafts are always kept tokens (still lossless). Give the
    kept ids as a list or 1-D tensor (e.g. :func:`visualspec.drafters.frequent_tokens` of text the
    target generated), or an int K: then the kept set is the EOS token, the tokens of the prompt(s)
    (most frequent first, if they do not all fit) and, up to K, the lowest token ids (in byte-level
    BPE vocabularies such as GPT-2's the lowest ids are single bytes and the earliest,
    most frequent merges).

    ``lookup`` (with a feature drafter) copies each step's drafts from the context, as prompt lookup
    does, wherever the context's end matches earlier text by at least ``lookup`` tokens, and lets
    the feature drafter draft elsewhere (:class:`visualspec.drafters.LookupFeatureDrafter`;
    SAM-Decoding's retrieval-first choice; still lossless): on text that repeats, such as code,
    copied drafts are as good and cost no drafter pass.

    ``draft_stop_below`` (with a draft model or ``"stand"``) ends each step's drafts early once the
    drafter's probability of its latest draft falls below it (transformers' assistant confidence
    threshold; lossless, see :class:`visualspec.drafters.DraftModelDrafter`), so a long ``window``
    costs draft forwards only where the draft is sure. A Kangaroo drafter's default is its
    folder's exit threshold, STAND's :data:`STAND_STOP_BELOW` (``0`` turns either off).

    ``branches`` k > 1 drafts a tree (draft model or ``"stand"``): k first tokens, each followed by
    a chain, ``depth`` tokens long in all (default ``(window - 1) // k``), so the target verifies
    ``1 + k * depth <= window`` tokens in one forward with tree attention. ``multidraft`` picks the
    verifier of the k first tokens: ``"rsd"`` (drafts without replacement, Jeon et al.),
    ``"spectr"`` (i.i.d. drafts, SpecTr's k-sequential selection) or ``"recursive_iid"``; greedy
    decoding accepts the candidate equal to the target's argmax. All are lossless.

    ``tree_width`` (with a feature drafter) grows a dynamic draft tree each step instead of a
    chain: ``depth`` levels of ``tree_width`` nodes, each level's nodes given to the likeliest
    paths before their tokens are drawn, verified exactly in one forward
    (:mod:`visualspec.core.dynamic_tree`: EAGLE-2's dynamic tree, made lossless).

    ``acceptance="judge"`` (with a drafter and ``judge``: a :class:`~visualspec.models.judge.JudgeHead`
    or its folder, trained for this target by ``visualspec train-judge --pair``) keeps, beside every
    draft the exact rule accepts, each draft the judge scores above ``judge_threshold`` (default: the
    judge's own, chosen when it was trained; 1 keeps none, the exact rule). The judge reads the
    target's last hidden state at the draft's column, from the verification forward. Lossy: the
    output is no longer the target's; the stats' ``judged_tokens`` count the drafts it kept.

    ``compile=True`` runs the target's and the draft model's window forwards on a static cache
    through ``torch.compile`` (:meth:`visualspec.models.hf.HFCausalLM.compile_step`): the same
    tokens, cheaper steps once compiled. Each window bucket compiles on its first use in a process
    (a progress line says so), so it pays on long or repeated calls, not on one short one.
    ``"auto"`` (the default) compiles where costs measured on this machine say the compile repays
    itself within the call (:func:`visualspec.core.compiled.compiled_step`; a first
    ``compile=True`` call measures them); with nothing measured it stays eager.
    """
    if acceptance not in ACCEPTANCE:
        raise ValueError(f"unknown acceptance {acceptance!r}; choose one of {ACCEPTANCE}")
    check_positive_int("max_new_tokens", max_new_tokens)
    if window != "auto":
        check_positive_int("window", window)
    check_sampling_args(temperature, top_k, top_p, 1.0)
    check_compile(compile)
    judge = _judge(judge, judge_threshold, acceptance, model, drafter)
    if isinstance(drafter, str) and is_kangaroo_folder(drafter):
        drafter = load_kangaroo(drafter, model)
    dynamic = _dynamic_tree_args(tree_width, depth, branches, window, acceptance, draft_vocab, draft_stop_below)
    tree = None if dynamic else _tree_args(branches, depth, window, multidraft, drafter, acceptance)
    if tree is not None and draft_stop_below is not None:
        raise ValueError("draft_stop_below ends chain drafts early; draft trees (branches > 1) have a fixed shape")
    if tree is None and draft_stop_below is None and kangaroo_info(drafter) is not None:
        draft_stop_below = kangaroo_info(drafter)["stop_below"]  # Kangaroo's second early exit
    if tree is None and draft_stop_below is None and drafter == "stand":
        draft_stop_below = STAND_STOP_BELOW
    if tree is not None and window == "auto":  # a tree's window is its size
        window = 1 + branches * tree[0]
    prompts, input_ids, attention_mask = encode_prompts(tokenizer, prompt)
    device = next(model.parameters()).device
    prefix = (input_ids.to(device), attention_mask.to(device))

    target = HFCausalLM(model)
    rows = input_ids.shape[0]
    compile = compiled_step(target, compile, lambda r: (prefix[0][:r], prefix[1][:r]), max_new_tokens, rows, rows)
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    if dynamic and lookup is not None:
        raise ValueError(f"a dynamic draft tree (tree_width={tree_width}) takes no lookup (it grows a tree, not a "
                         f"chain)")
    drafts = _drafter(drafter, model, prefix, input_ids, attention_mask, ngram, draft_vocab, tokenizer.eos_token_id,
                      draft_stop_below, compile, target, lookup)
    feature = drafts.feature if isinstance(drafts, LookupFeatureDrafter) else drafts  # the learned part
    if acceptance == "typical":
        rule = partial(typical_verify, epsilon=typical_epsilon, delta=typical_delta)
    elif acceptance == "judge":
        rule = judge
    else:
        rule = default_rule(sampling)
    if drafts is None:
        mode = "ar"
    elif isinstance(feature, FeatureDrafter):
        mode = "chimera" if isinstance(feature, ChimeraDrafter) else "feature drafter"
        mode += "" if feature is drafts else f"+lookup {lookup}"
    else:
        mode = drafter if isinstance(drafter, str) else "draft model" if draft_vocab is None else "vocabtrim"
        mode = f"kangaroo{'' if draft_vocab is None else ' vocabtrim'}" if kangaroo_info(drafter) else mode
    if compile:
        mode += "+compiled"
    generator = make_generator(seed, generator, device=device)
    eos = tokenizer.eos_token_id
    if drafts is None:
        window = 1
    if dynamic:
        if not isinstance(feature, FeatureDrafter):
            raise ValueError(f"a dynamic draft tree (tree_width=) needs a feature drafter, not drafter={drafter!r}")
        drafts.use_tree(depth, tree_width)
        window = depth + 1  # the drafter's catch-up feeds up to depth + 1 pairs; the target's tree runs eagerly
    windows = [w for w in WINDOWS if w <= max_new_tokens] if window == "auto" else range(1, window + 1)
    wants_features = feature_request(drafts, rule)
    if compile:  # every window bucket of the decode (a dynamic tree: its one shape), before it (announced)
        if dynamic:
            target.precompile_tree(prefix, max_new_tokens, 1 + depth * tree_width, features=wants_features)
        else:  # with the sampling and rule inside each step where they can be (and plain AR's, should it win)
            precompile_decode(target, prefix, max_new_tokens, sampling, windows, drafts=drafts is not None, rule=rule,
                              auto=window == "auto", features=wants_features, drafter=drafts,
                              stop_token=tokenizer.eos_token_id)
        if isinstance(drafts, DraftModelDrafter):
            drafts.model.precompile(prefix, max_new_tokens, windows)
        if isinstance(feature, FeatureDrafter):
            feature.model.compile_step()
            columns = input_ids.shape[1] + max_new_tokens + 1 + feature.tree_columns
            feature.model.precompile(rows, columns, {feature.model.pairs_bucket(w) for w in windows})
            if not dynamic:  # greedy chains, one graph a proposal (each window's drafts; a fixed window's alone)
                counts = sorted({w - 1 for w in (windows if window == "auto" else [window])})
                drafts.precompile_chains(rows, columns, counts, sampling, next(model.parameters()).dtype)
            if dynamic:
                feature.model.precompile_tree(rows, columns, tree_width)
    elif isinstance(feature, FeatureDrafter):
        feature.model.compile_step(False)
    if window == "auto" and tree is None:  # whole steps timed as this decode runs them: compiled or eager
        def decode_at(w, seed=0):
            return decode(target, prefix, max_new_tokens, sampling, drafter=drafts, rule=rule, window=w,
                          generator=make_generator(seed, device=device))[1]

        def ar_at():
            return decode(target, prefix, max_new_tokens, sampling, generator=make_generator(0, device=device))[1]

        # the table's best fixed window at every step (docs/experiments/2026-11-28-text-fixed-window.md)
        # one row: pooled with this process's earlier calls, as a greedy table is one prompt's yield
        # (a table of several rows holds several prompts, and its tokens a row-step count the steps
        # a row waited for the others, which a call's own row-steps do not)
        window = step_policy(target, decode_at, max_new_tokens, rows, step_tag(drafts, rule, sampling), ar_at=ar_at,
                             fixed=True, pooled=rows == 1 and not getattr(drafts, "carries_drafts", False))
    if dynamic:
        tokens, stats = decode_dynamic_tree(target, prefix, max_new_tokens, sampling, drafts, depth=depth,
                                            width=tree_width, generator=generator,
                                            mode=f"{mode} dynamic tree {depth}x{tree_width}", stop_token=eos)
    elif tree is None:
        tokens, stats = decode(target, prefix, max_new_tokens, sampling, drafter=drafts, rule=rule, window=window,
                               generator=generator, mode=mode, stop_token=eos)
    else:
        depth, multidraft_rule, scheme = tree
        if isinstance(drafts, DraftModelDrafter):
            drafts.tree_scheme = scheme
        tokens, stats = decode_tree(target, prefix, max_new_tokens, sampling, drafts, branches=branches, depth=depth,
                                    rule=greedy_multidraft_verify if sampling.greedy else multidraft_rule,
                                    generator=generator, mode=f"{mode} tree {branches}x{depth} {multidraft}",
                                    stop_token=eos)
    if hasattr(window, "pool_call"):
        window.pool_call(stats, rows)
    token_ids = []
    for row in tokens.tolist():
        if eos is not None and eos in row:
            row = row[: row.index(eos) + 1]
        token_ids.append(row)
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in token_ids]
    return TextOutput(text=texts[0] if isinstance(prompt, str) else texts, token_ids=token_ids, stats=stats)
