"""The continuous-token training command: it writes an autoencoder, a target and a draft that
decode together (CSpD), and an interrupted run resumes to the same weights."""

import json

import pytest
import torch

from visualspec.pipelines import ContinuousARPipeline, VisualSpecPipeline
from visualspec.training.continuous import ContinuousShapesConfig, latent_tokens, train_continuous_shapes
from visualspec.training.shapes import world_batch

TINY = dict(token_dim=4, kl_steps=2, kl_batch=2, target_init="scratch", target_dim=32, target_layers=1, target_heads=2, target_head_depth=1,
            target_head_width=32, target_steps=2, draft_dim=32, draft_layers=1, draft_heads=2, draft_head_depth=1,
            draft_head_width=32, draft_steps=2, ar_batch=2, warmup_steps=1, head_batch_mul=2, num_sampling_steps=5,
            checkpoint_seconds=0.0)


def test_training_writes_a_folder_that_generates_and_an_interrupted_run_resumes(tmp_path, monkeypatch):
    cfg = ContinuousShapesConfig(**TINY)
    train_continuous_shapes(str(tmp_path / "straight"), str(tmp_path / "w1"), cfg, progress=False)
    pipe = VisualSpecPipeline.from_pretrained(tmp_path / "straight")
    assert isinstance(pipe, ContinuousARPipeline) and pipe.draft_model is not None
    tokens = latent_tokens(pipe.vae, world_batch(5, 0, 64)[0])
    assert tokens.shape == (64, 256, 4) and abs(float(tokens.std()) - 1) < 0.2  # the scale gives unit latents
    out = pipe("a photo of a red circle", seed=0, gamma=4)  # CSpD with the trained draft
    assert out.images[0].size == (64, 64) and out.stats.mode == "cspd" and out.stats.target_forwards <= 256
    record = json.loads((tmp_path / "straight" / "training.json").read_text())
    assert record["config"]["target_steps"] == 2 and record["command"] == "visualspec train-continuous"
    import visualspec.training.continuous as train

    real, calls = train.caption_batch, {"n": 0}

    def interrupted(seed, step, *args):
        calls["n"] += 1
        if calls["n"] == 4:  # the draft's stage (after the target's two steps), after one step
            raise KeyboardInterrupt
        return real(seed, step, *args)

    monkeypatch.setattr(train, "caption_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_continuous_shapes(str(tmp_path / "resumed"), str(tmp_path / "w2"), cfg, progress=False)
    monkeypatch.setattr(train, "caption_batch", real)
    train_continuous_shapes(str(tmp_path / "resumed"), str(tmp_path / "w2"), cfg, progress=False)
    a, b = (VisualSpecPipeline.from_pretrained(tmp_path / run) for run in ("straight", "resumed"))
    for part in ("vae", "transformer", "draft_model"):
        x, y = getattr(a, part).state_dict(), getattr(b, part).state_dict()
        assert all(torch.equal(x[k], y[k]) for k in x), part


def test_a_target_started_from_the_token_model_reads_its_inputs_and_keeps_its_layers(tmp_path):
    """The shipped token model's transformer is copied, tokens go in through a lookup of its codes
    fitted to classify latents (better than naming the commonest code), and with the frozen trunk
    a training step changes the head alone."""
    from visualspec.assets import SHAPES_T2I
    from visualspec.training.continuous import build_ar, start_from_token_model, train_ar, train_autoencoder

    text = VisualSpecPipeline.from_pretrained(SHAPES_T2I)
    cfg = ContinuousShapesConfig(**{**TINY, "target_init": "token_model", "target_dim": 192, "target_layers": 8,
                                    "target_heads": 3, "target_steps": 0, "input_fit_images": 4,
                                    "input_fit_steps": 20})
    kl = train_autoencoder(cfg, tmp_path, torch.device("cpu"), progress=False)
    gpt = text.transformer
    model = build_ar(cfg, "target", 128, 16, gpt.config.vocab_size)
    accuracy = start_from_token_model(model, text, kl, seed=3, images=4, fit_steps=20)
    codes = text.vq_model.encode(world_batch(3, 0, 4)[0])[1].flatten()
    assert accuracy > float((codes == codes.mode().values).float().mean())
    assert torch.equal(model.backbone.layers[3].attention.wqkv.weight, gpt.layers[3].attention.wqkv.weight)
    assert torch.equal(model.backbone.tok_embeddings.embedding, gpt.tok_embeddings.weight)
    start = train_ar(cfg, "target", kl, text, tmp_path / "zero", torch.device("cpu"), progress=False).state_dict()
    cfg = ContinuousShapesConfig(**{**cfg.__dict__, "target_steps": 1})
    one = train_ar(cfg, "target", kl, text, tmp_path / "one", torch.device("cpu"), progress=False).state_dict()
    changed = {k for k in one if not torch.equal(start[k], one[k])}
    assert changed and all(k.startswith("diffloss.") for k in changed), sorted(changed)[:3]
    with pytest.raises(ValueError, match="the target's dim is 32, the token model's 192"):
        start_from_token_model(build_ar(ContinuousShapesConfig(**TINY), "target", 128, 16, gpt.config.vocab_size),
                               text, kl, seed=3, images=2, fit_steps=1)
