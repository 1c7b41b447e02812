"""Training a judge for text judge decoding on a trained pair (``visualspec train-text``), with
labels mined from an outcome on held-out Python source.

The shapes recipe (:mod:`visualspec.training.judge`) with code in place of images:

1. **Drafts the judge will see.** The pair's draft model drafts for its target (greedy, exact
   rule, a fixed window) on prompts cut at line starts of the held-out files the judge owns
   (:data:`visualspec.eval.code.JUDGE_FILES`; reported tables use the others). At every step of
   every row the first draft the rule rejected is recorded with the target's feature at its column.
2. **What keeping it would change.** For a few of those per prompt, the target continues greedily
   twice from the same committed tokens: once after the token it chose, once after the draft. The
   label is *harmless* when the draft's continuation is still valid Python in its file
   (:func:`visualspec.eval.code.is_valid`) through the statement after the draft's line, and that
   statement is the target's own (:func:`visualspec.eval.code.next_statement`: code compared,
   comments and spacing not); *important* otherwise. A draft whose continuation, or the
   target's, holds no complete next statement within ``continuation`` tokens is not labelled.
3. **The head**: :class:`visualspec.models.judge.JudgeHead`, fitted as the shapes judge is
   (:func:`visualspec.training.judge.fit_head`) with each squared-weight penalty of ``l2``; the one
   with the lowest validation loss is kept (:func:`fit_best`).
4. **The threshold**, by the rule written before measuring
   (docs/experiments/2026-11-30-text-judge.md): the candidates are the scores above which the
   judge keeps 90 %, 75 %, 50 % and 25 % of the validation drafts; on tuning prompts (the judge's
   files, another seed), the lowest candidate whose continuations write as much of the real files
   (:func:`visualspec.eval.code.kept_outcome` against each file's next lines: 0 when invalid) as
   the exact decode's, less ``max_drop``; 1.0 (exact) when none is. Validity and how much of the
   target's own code each keeps are reported beside it.

Every stage keeps its results in the work folder, and a rerun resumes after the last finished chunk.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from ..core.engine import decode
from ..core.sampling import SamplingConfig
from ..drafters import DraftModelDrafter
from ..eval.code import JUDGE_FILES, held_out_code, is_valid, kept_outcome, next_statement
from ..models.hf import HFCausalLM
from ..text import generate_text
from ..text.generate import encode_prompts
from .common import claim_work_dir, write_training_record
from .judge import RecordingDrafter, fit_head, labelled_chunks, pick_threshold, sample_rejections

OUTCOME = ("the continuation stays valid Python in its file through the next statement, and that statement "
           "is the target's (visualspec.eval.code)")


@dataclass
class TextJudgeConfig:
    prompts: int = 320  # training prompts, cut at line starts of the judge's held-out files
    prompt_seed: int = 7100  # no table uses it (bench-text's prompts: seeds 0 and 1, every file)
    prompt_tokens: int = 96
    new_tokens: int = 96  # greedy tokens decoded per prompt while recording drafts
    window: int = 6  # the draft model's fixed window while recording and tuning
    drafts_per_prompt: int = 8  # rejected drafts labelled per prompt
    continuation: int = 64  # tokens each labelling continuation runs
    batch: int = 16  # prompts decoded at once
    rows: int = 64  # continuations run at once (two per label)
    hidden: int = 0  # 0: logistic regression on the standardised inputs
    steps: int = 300
    lr: float = 0.01
    l2: tuple = (0.1, 1.0, 10.0)  # squared-weight penalties tried; the lowest validation loss is kept
    held_out: float = 0.2  # share of training prompts kept out of the fit, for validation
    tune_prompts: int = 192
    tune_seed: int = 7300
    keep_shares: tuple = (0.9, 0.75, 0.5, 0.25)
    max_drop: float = 0.01  # outcome the judge may lose against the exact rule (the 1 point)
    seed: int = 0


def left_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id lists as a left-padded ``(input_ids, attention_mask)`` prefix."""
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


@torch.no_grad()
def greedy_continuations(target: HFCausalLM, rows: list[list[int]], tokens: int, pad: int) -> list[list[int]]:
    """The target's greedy ``tokens`` tokens after each token id list of ``rows``."""
    out, _ = decode(target, left_padded(rows, pad), tokens, SamplingConfig(temperature=0.0))
    return out.tolist()


@torch.no_grad()
def record_rejections(target: HFCausalLM, draft_model, tokenizer, prompts: list[str], cfg: TextJudgeConfig):
    """Greedy decodes of ``prompts`` with the draft model's drafts: ``(prompt ids (list per row),
    tokens (B, N), records)``, the records' tensors concatenated (see
    :class:`visualspec.training.judge.RecordingDrafter`)."""
    _, ids, mask = encode_prompts(tokenizer, prompts)
    prefix = (ids, mask)
    recorder = RecordingDrafter(DraftModelDrafter(HFCausalLM(draft_model), prefix))
    tokens, _ = decode(target, prefix, cfg.new_tokens, SamplingConfig(temperature=0.0), drafter=recorder,
                       window=cfg.window)
    records = {k: torch.cat([r[k] for r in recorder.records]) for k in recorder.records[0]}
    return [row[m.bool()].tolist() for row, m in zip(ids, mask)], tokens, records


def label(context: str, tokenizer, before: list[int], chosen: int, drafted: int, chosen_after: list[int],
          drafted_after: list[int]) -> bool | None:
    """A rejected draft's label: True (harmless), False (important) or None (no complete next
    statement in one of the two continuations). ``before`` are the new tokens ahead of it,
    ``chosen``/``drafted`` the target's token and the draft, ``*_after`` each continuation."""
    found = []
    for token, after in ((chosen, chosen_after), (drafted, drafted_after)):
        text = tokenizer.decode(before + [token] + after)
        nxt = next_statement(text, max(len(tokenizer.decode(before + [token])) - 1, 0))  # after the token's line
        if nxt is None:
            return None
        found.append((text[:nxt[1]], nxt[0]))
    (_, want), (text, got) = found
    return got == want and is_valid(context, text)


def mine_labels(target: HFCausalLM, draft_model, tokenizer, folder, cfg: TextJudgeConfig, work: Path,
                progress: bool = True) -> dict:
    """Stages 1 and 2, ``cfg.batch`` prompts at a time
    (:func:`~visualspec.training.judge.labelled_chunks`: saved in ``work``, a rerun resumes).
    Returns the labelled drafts: ``feature``, ``distribution``, ``harmless`` (float), ``prompt``
    (index), ``position``."""
    prompts = held_out_code(folder, tokenizer, cfg.prompts, cfg.prompt_tokens, cfg.prompt_seed, JUDGE_FILES)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def label_chunk(start: int) -> dict:
        t0 = time.time()
        part = prompts[start:start + cfg.batch]
        prompt_ids, tokens, rec = record_rejections(target, draft_model, tokenizer, [p.prompt for p in part], cfg)
        keep = sample_rejections(rec, len(part), cfg.drafts_per_prompt, np.random.default_rng([cfg.seed, start]))
        keep = keep.sort().values
        req, pos, draft = rec["request"][keep].tolist(), rec["position"][keep].tolist(), rec["draft"][keep].tolist()
        rows = []
        for r, t, d in zip(req, pos, draft):
            before = prompt_ids[r] + tokens[r, :t].tolist()
            rows += [before + [int(tokens[r, t])], before + [d]]
        after = []
        for s in range(0, len(rows), cfg.rows):
            after += greedy_continuations(target, rows[s:s + cfg.rows], cfg.continuation, pad)
        labels = [label(part[r].context, tokenizer, tokens[r, :t].tolist(), int(tokens[r, t]), d, after[2 * j],
                        after[2 * j + 1]) for j, (r, t, d) in enumerate(zip(req, pos, draft))]
        known = torch.tensor([v is not None for v in labels])
        chunk = {"feature": rec["feature"][keep][known], "distribution": rec["distribution"][keep][known],
                 "harmless": torch.tensor([float(v) for v in labels if v is not None]),
                 "prompt": torch.tensor(req)[known] + start, "position": torch.tensor(pos)[known]}
        if progress:
            print(f"text judge labels: prompts {start + len(part)}/{len(prompts)}, {int(known.sum())} of {len(keep)} "
                  f"drafts labelled, {float(chunk['harmless'].mean()):.2f} harmless, {time.time() - t0:.0f} s",
                  flush=True)
        return chunk

    return labelled_chunks(work, len(prompts), cfg.batch, label_chunk)


def fit_best(make_head, data: dict, cfg: TextJudgeConfig):
    """``(head, fit)``: a head from ``make_head()`` fitted (:func:`~visualspec.training.judge.fit_head`)
    with each penalty of ``cfg.l2``, the one of lowest validation cross-entropy; ``fit`` also
    records every penalty's validation loss (``l2_validation_bce``) and the one kept (``l2``)."""
    fits = []
    for l2 in cfg.l2:
        head = make_head()
        fits.append((fit_head(head, data, replace(cfg, l2=l2)), l2, head))
    fit, l2, head = min(fits, key=lambda f: f[0]["validation_bce"])
    return head, {**fit, "l2": l2, "l2_validation_bce": {str(p): f["validation_bce"] for f, p, _ in fits}}


@torch.no_grad()
def judged_outcomes(target_model, draft_model, tokenizer, prompts, thresholds, head, cfg: TextJudgeConfig,
                    work: Path | None = None, progress: bool = True) -> dict:
    """The exact decode and the judge at each of ``thresholds`` on ``prompts`` (code prompts, greedy,
    the draft model at ``cfg.window``, eager): ``{name: {"outcome", "valid", "kept", "tau",
    "judged_tokens"}}``, ``outcome`` :func:`~visualspec.eval.code.kept_outcome` against each prompt's
    truth, ``kept`` against the exact decode. Each decode is kept in ``work`` where given."""
    runs = [("exact", {})] + [(f"judge@{t}", {"acceptance": "judge", "judge": head, "judge_threshold": t})
                              for t in thresholds]
    texts, results = {}, {}
    for name, kwargs in runs:
        path = None if work is None else work / f"tune-{name}.json"
        if path is not None and path.is_file():
            saved = json.loads(path.read_text())
            texts[name], results[name] = saved.pop("texts"), saved
            continue
        out, forwards, tokens, judged = [], 0, 0, 0
        for s in range(0, len(prompts), cfg.batch):
            r = generate_text(target_model, tokenizer, [p.prompt for p in prompts[s:s + cfg.batch]],
                              drafter=draft_model, window=cfg.window, max_new_tokens=cfg.new_tokens, temperature=0,
                              compile=False, **kwargs)
            out += r.text
            forwards += r.stats.forwards_per_sequence * len(r.text)
            tokens += r.stats.tokens_per_sequence * len(r.text)
            judged += r.stats.judged_tokens
        texts[name] = out
        results[name] = {"tau": tokens / max(forwards, 1), "judged_tokens": judged,
                         "valid": float(np.mean([is_valid(p.context, t) for p, t in zip(prompts, out)]))}
        if path is not None:
            path.write_text(json.dumps({**results[name], "texts": out}))
    for name in results:
        r = results[name]
        r["outcome"] = float(np.mean([kept_outcome(p.context, t, p.truth) for p, t in zip(prompts, texts[name])]))
        r["kept"] = float(np.mean([kept_outcome(p.context, t, e) for p, t, e in zip(prompts, texts[name],
                                                                                    texts["exact"])]))
        if progress:
            print(f"text judge: {name}: outcome {r['outcome']:.3f}, valid {r['valid']:.3f}, kept {r['kept']:.3f}, "
                  f"tau {r['tau']:.2f}", flush=True)
    return results


def train_text_judge(folder, tokenizer, target_model, draft_model, out: str, work_dir: str,
                     cfg: TextJudgeConfig | None = None, progress: bool = True) -> Path:
    """Run (or resume) the text judge's recipe for a trained pair (its ``folder``, whose
    ``training.json`` names the held-out files, and its loaded tokenizer, target and draft model)
    and write the judge folder ``out``."""
    from ..models.feature_drafter import weights_hash
    from ..models.judge import JudgeHead

    cfg = cfg or TextJudgeConfig()
    work = claim_work_dir(work_dir, {**asdict(cfg), "pair": str(folder), "kind": "text"})
    t0 = time.time()
    target = HFCausalLM(target_model)
    data = mine_labels(target, draft_model, tokenizer, folder, cfg, work, progress)
    target_hash = weights_hash(target_model)
    head, fit = fit_best(lambda: JudgeHead(feature_size=target.feature_size, hidden=cfg.hidden, target_hash=target_hash,
                                           outcome=OUTCOME), data, cfg)
    if progress:
        print(f"text judge fit: {fit}", flush=True)
    prompts = held_out_code(folder, tokenizer, cfg.tune_prompts, cfg.prompt_tokens, cfg.tune_seed, JUDGE_FILES)
    tuned = judged_outcomes(target_model, draft_model, tokenizer, prompts, fit["thresholds"], head.eval(), cfg, work,
                            progress)
    threshold = pick_threshold({t: tuned[f"judge@{t}"]["outcome"] for t in fit["thresholds"]},
                               tuned["exact"]["outcome"], cfg.max_drop)
    head.register_to_config(threshold=threshold)
    out = Path(out)
    head.save_pretrained(out)
    write_training_record(out, "visualspec train-judge --pair", {**asdict(cfg), "pair": str(folder)}, t0,
                          torch.device("cpu"), fit=fit, tuning=tuned, threshold=threshold)
    return out
