"""Training a judge for judge decoding on the shapes world, with labels mined from the outcome.

AutoJudge's idea (Garipov et al., 2025) with the world's exact scorer in place of a final answer:

1. **Drafts the judge will see.** Decode training prompts with SJD (the pipeline's own Jacobi
   drafts and window) and record, at every step of every row, the first draft the exact rule
   rejected: its position t, the token d, the target's feature at d's column and the target's
   distribution there (what :class:`visualspec.core.judge.JudgeRule` hands a judge).
2. **What keeping it would change.** For a few of those per image, finish the image twice from the
   same committed prefix: once from the token the target emitted at t, once from d, both drawing
   every later token by inverse CDF from the same per-position uniforms (common random numbers, so
   the two images differ only by what d sets off). The label is *harmless* when the GenEval-shapes
   verdict on the prompt is the same for both images, *important* when it flips.
3. **The head.** :class:`visualspec.models.judge.JudgeHead` (standardised inputs, logistic
   regression by default) fitted to those labels, validated on prompts held out of the fit.
4. **The threshold**, by the rule written before measuring
   (docs/experiments/2026-11-28-judge-decoding-shapes.md): the candidates are the scores above
   which the judge keeps 90 %, 75 %, 50 % and 25 % of the validation drafts; on tuning prompts no
   table uses, the lowest candidate whose GenEval-shapes is within ``max_drop`` of SJD's on the
   same prompts and seeds; 1.0 (exact) when none is.

Every stage keeps its results in the work folder and a rerun resumes after the last finished chunk.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from ..core.engine import decode
from ..core.sampling import SamplingConfig, inverse_cdf
from .common import claim_work_dir, write_training_record


@dataclass
class JudgeConfig:
    prompts_per_task: int = 100  # 600 training prompts, one image each
    prompt_seed: int = 7100  # no table uses it (tables: 0 and 2000; threshold tuning: tune_seed)
    drafts_per_image: int = 6  # rejected drafts labelled per image
    batch: int = 16  # images decoded at once while recording drafts
    window: int = 8  # SJD's window while recording
    rows: int = 48  # continuations finished at once (two per label)
    hidden: int = 0  # 0: logistic regression on the standardised inputs
    steps: int = 300
    lr: float = 0.01
    l2: float = 0.1  # squared-weight penalty (the lowest validation loss of 0.001, 0.01, 0.1)
    held_out: float = 0.2  # share of training prompts kept out of the fit, for validation
    tune_per_task: int = 50  # 300 tuning prompts
    tune_seed: int = 7300
    keep_shares: tuple = (0.9, 0.75, 0.5, 0.25)  # candidate thresholds: the judge keeps these shares of
    max_drop: float = 0.02  # the validation drafts; GenEval-shapes it may lose against SJD when tuning
    seed: int = 0


# ---------------------------------------------------------------------------------- recording


class RecordingDrafter:
    """Wraps a drafter and records, each step, the first draft of every row that the rule rejected,
    with the target's feature at its column and distribution at its position. It asks the engine
    for the target's features (``wants_features``) and passes everything else through."""

    wants_features = True

    def __init__(self, inner):
        self.inner = inner
        self.records: list[dict] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def start(self, batch_size, num_tokens, sampling):
        self.requests = torch.arange(batch_size)
        self.num_tokens = num_tokens
        self.inner.start(batch_size, num_tokens, sampling)

    def prefix_features(self, features, rows=None):
        pass

    def propose(self, tokens, n, k, generator=None):
        drafts, probs = self.inner.propose(tokens, n, k, generator)
        self._drafts = drafts
        return drafts, probs

    def observe(self, n, committed, target_probs, generator=None, features=None):
        self.inner.observe(n, committed, target_probs, generator)
        from ..models.judge import distribution_inputs

        drafts, rows = self._drafts, len(n)
        a = committed - 1  # accepted drafts: the first rejected one is at index a
        # (not in a step that ended its row: there the count may be cut to the tokens left)
        stop = (a < drafts.shape[1]) & (n + committed < self.num_tokens)
        b = stop.nonzero()[:, 0]
        if len(b) == 0:
            return
        d = drafts[b, a[b]]
        self.records.append({
            "request": self.requests[b.cpu()], "position": (n + a)[b].cpu(), "draft": d.cpu(),
            "feature": features[:rows][b, a[b] + 1].float().cpu(),
            "distribution": distribution_inputs(d, target_probs[b, a[b]]).cpu()})

    def select(self, rows):
        self.requests = self.requests[rows.cpu()]
        self.inner.select(rows)

    def reset(self, rows, requests):
        self.requests[rows.cpu()] = torch.as_tensor(requests)
        self.inner.reset(rows, requests)


def _sampling(pipe) -> SamplingConfig:
    """The pipeline's default sampling (temperature 1), which the judge is trained for."""
    c = pipe.config
    return SamplingConfig(temperature=1.0, top_k=c.default_top_k, guidance_scale=c.default_guidance_scale,
                          epsilon_cutoff=c.default_epsilon_cutoff)


@torch.no_grad()
def record_rejections(pipe, prompts: list[str], seeds: list[int], window: int) -> tuple[torch.Tensor, dict]:
    """SJD images of ``prompts`` (one each, generator seeded ``seeds[i]``) and the first rejected
    draft of every row-step: ``(tokens (B, N), records)`` with records' tensors concatenated."""
    model, sampling = pipe.transformer, _sampling(pipe)
    cond = pipe._conditions(prompts, None, 1)
    c = pipe.config
    drafter, rule = pipe.token_decoding("sjd", sampling, vocab_size=model.config.vocab_size,
                                        grid_width=model.grid_size, jacobi_init=c.default_jacobi_init,
                                        coupling=c.default_coupling)
    recorder = RecordingDrafter(drafter)
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    tokens, _ = decode(model, pipe._prefix(model, cond, sampling), model.config.block_size, sampling,
                       drafter=recorder, rule=rule, window=window, generator=gens)
    records = {k: torch.cat([r[k] for r in recorder.records]) for k in recorder.records[0]}
    return tokens.cpu(), records


@torch.no_grad()
def coupled_continuations(model, prefix, sampling: SamplingConfig, forced: torch.Tensor, upto: torch.Tensor,
                          uniforms: torch.Tensor) -> torch.Tensor:
    """Finish R images: row r keeps ``forced[r, :upto[r] + 1]`` and draws every later token j by
    inverse CDF at ``uniforms[r, j]`` (common random numbers: rows given the same uniforms differ
    only by what their forced tokens set off). ``prefix`` is the model prefix of the R rows.
    Returns the tokens (R, N)."""
    R, N = forced.shape
    device = forced.device
    out = forced.clone()
    logits = model.prefill(prefix, N)  # token 0's
    first = int(upto.min())  # tokens 0..first are forced in every row: one window
    window = sampling.model_batch(out[:, :first + 1])
    logits = model.forward_window(window, sampling.model_batch(torch.zeros(R, dtype=torch.long, device=device)))[:, -1]
    for j in range(first + 1, N):
        drawn = inverse_cdf(sampling.probs(logits), uniforms[:, j])
        out[:, j] = torch.where(upto >= j, forced[:, j], drawn)
        if j + 1 < N:
            start = sampling.model_batch(torch.full((R,), j, dtype=torch.long, device=device))
            logits = model.forward_window(sampling.model_batch(out[:, j:j + 1]), start)[:, 0]
    return out


@torch.no_grad()
def verdicts(pipe, tokens: torch.Tensor, metadata: list[dict], detector) -> np.ndarray:
    """GenEval-shapes verdicts (bool per image) of token images under their prompts' metadata."""
    from ..eval.geneval import evaluate_image

    images = pipe.postprocess(pipe.decode_images(tokens.to(pipe.device)), "pil")
    return np.array([evaluate_image(img, meta, detector)["correct"] for img, meta in zip(images, metadata)])


# ---------------------------------------------------------------------------------- mining


def labelled_chunks(work: Path, total: int, batch: int, label_chunk) -> dict:
    """Stage 2's resumable loop: ``label_chunk(start)`` labels prompts ``start .. start + batch - 1``
    and returns their chunk (a dict of tensors), saved as ``work/labels-<start>.pt`` (atomically)
    and read back on a rerun. Returns every chunk's tensors concatenated."""
    chunks = []
    for start in range(0, total, batch):
        path = work / f"labels-{start:05d}.pt"
        if not path.is_file():
            tmp = path.with_name(path.name + ".tmp")
            torch.save(label_chunk(start), tmp)
            tmp.replace(path)
        chunks.append(torch.load(path, weights_only=True))
    return {k: torch.cat([c[k] for c in chunks]) for k in chunks[0]}


def sample_rejections(records: dict, requests: int, per_request: int, rng) -> torch.Tensor:
    """Up to ``per_request`` of the recorded rejections of each request 0 .. ``requests - 1``, drawn
    without replacement by ``rng``: their indices into ``records`` (long), request by request."""
    keep = []
    for i in range(requests):
        mine = (records["request"] == i).nonzero()[:, 0].numpy()
        keep.extend(rng.choice(mine, min(per_request, len(mine)), replace=False).tolist())
    return torch.tensor(keep, dtype=torch.long)


def mine_labels(pipe, cfg: JudgeConfig, work: Path, progress: bool = True) -> dict:
    """Stages 1 and 2 over the training prompts, a chunk of ``cfg.batch`` prompts at a time
    (:func:`labelled_chunks`: saved in ``work``, a rerun resumes). Returns every chunk's labelled
    drafts: ``feature``, ``distribution``, ``harmless`` (float), ``prompt`` (index), ``position``."""
    from ..eval.detectors import ShapesDetector
    from ..worlds.shapes import evaluation_prompts

    prompts = evaluation_prompts(cfg.prompts_per_task, seed=cfg.prompt_seed)
    detector, model, sampling = ShapesDetector(), pipe.transformer, _sampling(pipe)

    def label_chunk(start: int) -> dict:
        t0 = time.time()
        metas = prompts[start:start + cfg.batch]
        texts = [m["prompt"] for m in metas]
        tokens, rec = record_rejections(pipe, texts, [cfg.seed * 100_003 + start + i for i in range(len(texts))],
                                        cfg.window)
        keep = sample_rejections(rec, len(texts), cfg.drafts_per_image, np.random.default_rng([cfg.seed, start]))
        keep = keep[rec["position"][keep].argsort(stable=True)]  # by position: continuations of like length
        req, pos, draft = rec["request"][keep], rec["position"][keep], rec["draft"][keep]
        harmless = []
        per = cfg.rows // 2
        for s in range(0, len(keep), per):
            r, t, d = req[s:s + per], pos[s:s + per], draft[s:s + per]
            base = tokens[r]
            swap = base.clone()
            swap[torch.arange(len(r)), t] = d
            u = torch.rand(len(r), tokens.shape[1], generator=torch.Generator().manual_seed(
                cfg.seed * 7_919 + start * 1_000 + s))
            forced = torch.cat([base, swap]).to(pipe.device)
            cond = pipe._conditions([texts[i] for i in r.tolist()] * 2, None, 1)
            images = coupled_continuations(model, pipe._prefix(model, cond, sampling), sampling, forced,
                                           torch.cat([t, t]).to(pipe.device), torch.cat([u, u]).to(pipe.device))
            v = verdicts(pipe, images, [metas[i] for i in r.tolist()] * 2, detector)
            harmless.extend((v[:len(r)] == v[len(r):]).tolist())
        chunk = {"feature": rec["feature"][keep], "distribution": rec["distribution"][keep],
                 "harmless": torch.tensor(harmless, dtype=torch.float32), "prompt": req + start, "position": pos}
        if progress:
            print(f"judge labels: prompts {start + len(texts)}/{len(prompts)}, {len(keep)} drafts, "
                  f"{float(chunk['harmless'].mean()):.2f} harmless, {time.time() - t0:.0f} s", flush=True)
        return chunk

    return labelled_chunks(work, len(prompts), cfg.batch, label_chunk)


# ---------------------------------------------------------------------------------- fitting


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve: P(score of a positive > score of a negative), ties half."""
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).mean()
    ties = (pos[:, None] == neg[None, :]).mean()
    return float(greater + 0.5 * ties)


def fit_head(head, data: dict, cfg: JudgeConfig) -> dict:
    """Fit ``head`` to the labelled drafts (prompts split: ``cfg.held_out`` of them validate) by
    full-batch Adam on the binary cross-entropy plus ``cfg.l2`` times the squared weights, from a
    head that predicts the training labels' base rate; returns the validation numbers and the
    candidate thresholds: the scores above which the judge keeps ``cfg.keep_shares`` of the
    validation drafts."""
    x = torch.cat([data["feature"], data["distribution"]], -1)
    y = data["harmless"]
    prompts = data["prompt"].unique()
    rng = np.random.default_rng(cfg.seed)
    held = torch.tensor(rng.choice(prompts.numpy(), int(len(prompts) * cfg.held_out), replace=False))
    val = torch.isin(data["prompt"], held)
    head.set_scaler(x[~val])
    torch.manual_seed(cfg.seed)
    last = head.net if isinstance(head.net, torch.nn.Linear) else head.net[-1]
    base = float(y[~val].mean().clamp(1e-3, 1 - 1e-3))
    with torch.no_grad():
        last.weight.zero_()
        last.bias.fill_(float(np.log(base / (1 - base))))
    weights = [p for name, p in head.net.named_parameters() if name.endswith("weight")]
    opt = torch.optim.Adam(head.net.parameters(), lr=cfg.lr)
    for _ in range(cfg.steps):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(head(x[~val]), y[~val])
        loss = loss + cfg.l2 * sum(w.pow(2).sum() for w in weights)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        logits = head(x)
        val_loss = float(torch.nn.functional.binary_cross_entropy_with_logits(logits[val], y[val]))
        scores = torch.sigmoid(logits).numpy()
    base = float(y[val].mean())
    constant = -(base * np.log(max(base, 1e-9)) + (1 - base) * np.log(max(1 - base, 1e-9)))
    return {"labels": int(len(y)), "harmless_share": round(float(y.mean()), 4), "validation_labels": int(val.sum()),
            "validation_auc": round(auc(scores[val.numpy()], y[val].numpy()), 4),
            "train_auc": round(auc(scores[~val.numpy()], y[~val].numpy()), 4),
            "validation_bce": round(val_loss, 4), "constant_bce": round(float(constant), 4),
            "thresholds": [round(float(np.quantile(scores[val.numpy()], 1 - share)), 4) for share in cfg.keep_shares]}


# ---------------------------------------------------------------------------------- threshold


def pick_threshold(scores: dict, exact: float, max_drop: float) -> float:
    """The threshold rule: ``min {t : scores[t] >= exact - max_drop}`` (the judge keeps most drafts
    at the lowest threshold), or 1.0 (the exact rule) where no candidate passes. ``scores`` maps each
    candidate threshold to its outcome, ``exact`` is the exact rule's on the same prompts and seeds:
    GenEval-shapes against SJD's for the shapes judge, the real files' statements written for the
    text judge (:mod:`visualspec.training.text_judge`)."""
    passing = [t for t, score in scores.items() if score >= exact - max_drop]
    return min(passing) if passing else 1.0


def tune_threshold(pipe, cfg: JudgeConfig, thresholds, work: Path, progress: bool = True) -> dict:
    """Stage 4: GenEval-shapes of SJD and of the judge at each candidate threshold on the tuning
    prompts (one image each, seeds 0..; the recording window, eager: no window costs are timed
    here), and the threshold the rule picks (see the module docstring). Each decoding's result is
    kept in ``work`` (resumable)."""
    from ..eval.detectors import ShapesDetector
    from ..worlds.shapes import evaluation_prompts

    prompts = evaluation_prompts(cfg.tune_per_task, seed=cfg.tune_seed)
    detector = ShapesDetector()
    results = {}
    for name, kwargs in [("sjd", {"decoding": "sjd"})] + [
            (f"judge@{t}", {"decoding": "judge", "judge_threshold": t}) for t in thresholds]:
        path = work / f"tune-{name}.json"
        if path.is_file():
            results[name] = json.loads(path.read_text())
            continue
        correct, forwards, tokens = [], 0.0, 0
        for start in range(0, len(prompts), cfg.batch):
            metas = prompts[start:start + cfg.batch]
            out = pipe([m["prompt"] for m in metas], generator=[torch.Generator().manual_seed(start + i)
                                                                 for i in range(len(metas))],
                       window=cfg.window, compile=False, output_type="latent", **kwargs)
            correct.extend(verdicts(pipe, out.images, metas, detector).tolist())
            forwards += out.stats.forwards_per_sequence * len(metas)
            tokens += len(metas)
        results[name] = {"geneval": float(np.mean(correct)), "forwards_per_image": forwards / tokens}
        path.write_text(json.dumps(results[name]))
        if progress:
            print(f"judge tuning: {name}: GenEval-shapes {results[name]['geneval']:.3f}, "
                  f"{results[name]['forwards_per_image']:.1f} forwards an image", flush=True)
    scores = {t: results[f"judge@{t}"]["geneval"] for t in thresholds}
    return {"results": results, "threshold": pick_threshold(scores, results["sjd"]["geneval"], cfg.max_drop)}


def train_judge(model: str | None, out: str, work_dir: str, cfg: JudgeConfig | None = None,
                progress: bool = True) -> Path:
    """Run (or resume) the judge's recipe for a shapes-world LlamaGen pipeline ``model`` (default:
    the shipped ``assets/shapes-t2i``) and write the judge folder ``out``."""
    from ..assets import SHAPES_T2I
    from ..models.feature_drafter import weights_hash
    from ..models.judge import JudgeHead
    from ..pipelines.llamagen import LlamaGenPipeline

    cfg = cfg or JudgeConfig()
    folder = Path(model) if model is not None else SHAPES_T2I
    work = claim_work_dir(work_dir, {**asdict(cfg), "model": str(folder)})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.time()
    pipe = LlamaGenPipeline.from_pretrained(folder).to(device)
    pipe.set_progress_bar_config(disable=True)
    gpt = pipe.transformer.eval()
    data = mine_labels(pipe, cfg, work, progress)
    head = JudgeHead(feature_size=gpt.config.dim, hidden=cfg.hidden, target_hash=weights_hash(gpt),
                     outcome="GenEval-shapes verdict on the prompt (visualspec.eval.detectors.ShapesDetector)")
    fit = fit_head(head, data, cfg)
    if progress:
        print(f"judge fit: {fit}", flush=True)
    pipe.register_modules(judge=head.eval())
    tuned = tune_threshold(pipe, cfg, fit["thresholds"], work, progress)
    head.register_to_config(threshold=tuned["threshold"])
    out = Path(out)
    head.save_pretrained(out)
    write_training_record(out, "visualspec train-judge", {**asdict(cfg), "model": str(folder)}, t0, device,
                          fit=fit, tuning=tuned)
    return out
