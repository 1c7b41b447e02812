"""The next-frame video stack: block-causal transformer with a frame cache, the samplers, NFD
speculation bookkeeping, the pipeline's API and errors, export, and the training command."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from visualspec.models.frame_autoencoder import FrameAutoencoder
from visualspec.models.nfd import NextFrameDiT
from visualspec.pipelines import NextFramePipeline, VisualSpecPipeline, export_video
from visualspec.video import VideoStats, WorldSession, denoise_frames, time_grid
from visualspec.worlds import arena


def tiny_dit(context_frames=3, seed=0):
    torch.manual_seed(seed)
    model = NextFrameDiT(latent_channels=4, latent_size=4, dim=32, depth=2, num_heads=2, context_frames=context_frames)
    for p in model.parameters():  # adaLN-zero starts as the identity; make every path matter
        torch.nn.init.normal_(p, std=0.1)
    return model.eval()


def test_cached_generation_equals_the_training_forward():
    model = tiny_dit(context_frames=3)
    B, F = 2, 7  # longer than the window, so the sliding window is exercised
    x, taus, acts = torch.randn(B, F, 4, 4, 4), torch.rand(B, F), torch.randint(0, 6, (B, F))
    with torch.no_grad():
        full = model(x, taus, acts)
        cache = model.new_cache()
        one_by_one = torch.cat([model(x[:, f:f + 1], taus[:, f:f + 1], acts[:, f:f + 1], cache=cache, write=1)
                                for f in range(F)], dim=1)
        cache = model.new_cache()
        first = model(x[:, :4], taus[:, :4], acts[:, :4], cache=cache, write=4)
        rest = model(x[:, 4:], taus[:, 4:], acts[:, 4:], cache=cache, write=0)
    torch.testing.assert_close(one_by_one, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat([first, rest], 1), full, atol=1e-5, rtol=1e-5)
    assert cache.frames == 3 and cache.next_frame == 4  # the cache holds only the window


def test_attention_is_block_causal_with_a_window():
    model = tiny_dit(context_frames=2)
    x, taus, acts = torch.randn(1, 5, 4, 4, 4), torch.rand(1, 5), torch.zeros(1, 5, dtype=torch.long)
    with torch.no_grad():
        base = model(x, taus, acts)
        later = x.clone()
        later[:, 3, :, 0, 0] += 1.0  # one token of frame 3
        changed = (model(later, taus, acts) - base).abs().amax(dim=(2, 3, 4))[0]
        early = x.clone()
        early[:, 0] += 1.0
        from_first = (model(early, taus, acts) - base).abs().amax(dim=(2, 3, 4))[0]
    assert torch.all(changed[:3] == 0) and torch.all(changed[3:] > 0)  # earlier frames never see later ones
    tokens = (model(later, taus, acts) - base).abs().amax(dim=2)[0, 3]
    assert torch.all(tokens > 0)  # bidirectional inside the frame: every token of frame 3 moved
    assert torch.all(from_first > 0)  # through two layers frame 0 reaches frame 4 (window 2 per layer)
    one_layer = tiny_dit(context_frames=2)
    one_layer.blocks = one_layer.blocks[:1]
    with torch.no_grad():
        direct = (one_layer(early, taus, acts) - one_layer(x, taus, acts)).abs().amax(dim=(2, 3, 4))[0]
    assert torch.all(direct[:3] > 0) and torch.all(direct[3:] == 0)  # one layer: at most 2 frames back


def test_actions_and_times_condition_each_frame():
    model = tiny_dit()
    x, taus = torch.randn(1, 2, 4, 4, 4), torch.rand(1, 2)
    with torch.no_grad():
        a = model(x, taus, torch.tensor([[5, 1]]))
        b = model(x, taus, torch.tensor([[5, 2]]))
        c = model(x, taus + torch.tensor([[0.0, 0.3]]), torch.tensor([[5, 1]]))
    assert torch.equal(a[:, 0], b[:, 0]) and not torch.allclose(a[:, 1], b[:, 1])
    assert torch.equal(a[:, 0], c[:, 0]) and not torch.allclose(a[:, 1], c[:, 1])


class OracleModel(torch.nn.Module):
    """A 'model' that knows the clean frame: v = (x - target) / tau, the exact flow velocity."""

    def __init__(self, target, context_frames=4):
        super().__init__()
        self.target = target
        self.config = type("C", (), dict(latent_channels=target.shape[0], latent_size=target.shape[1],
                                         context_frames=context_frames))()
        self.calls = []
        self.no_action = 5

    device = torch.device("cpu")

    def new_cache(self):
        return {"written": 0}

    def forward(self, x, taus, actions, cache=None, write=0):
        self.calls.append((x.shape[1], write, actions.tolist()))
        cache["written"] += write
        t = taus[:, :, None, None, None].clamp(min=1e-6)
        return (x - self.target[None, None]) / t


@pytest.mark.parametrize("sampler,steps", [("flow", 1), ("flow", 5), ("consistency", 1), ("consistency", 3)])
def test_samplers_recover_the_clean_frame_with_an_exact_velocity(sampler, steps):
    target = torch.randn(2, 4, 4)
    model = OracleModel(target)
    out, forwards = denoise_frames(model, model.new_cache(), torch.zeros(1, 3, dtype=torch.long), steps, sampler,
                                   generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(out, target.expand(1, 3, -1, -1, -1), atol=1e-4, rtol=1e-4)
    assert forwards == steps


def test_time_grids_and_their_errors():
    assert time_grid(4, "flow") == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert time_grid(2, "consistency") == [1.0, 0.5]
    with pytest.raises(ValueError, match="steps"):
        time_grid(0, "flow")
    with pytest.raises(ValueError, match="sampler"):
        time_grid(1, "ddim")


def test_speculation_shows_buffered_frames_while_the_action_persists_and_discards_on_change():
    model = OracleModel(torch.zeros(2, 4, 4))
    first = (torch.zeros(1, 2, 2, 4, 4), torch.tensor([[5, 0]]))
    session = WorldSession(model, lambda z: [f"frame{i}" for i in range(len(z))], first, steps=1,
                           sampler="consistency", speculate=3, action_index=arena.action_index)
    for action in ["right", "right", "right", "right", "up", "up", "right"]:
        session.step(action)
    s = session.stats
    # calls: right x3 (frames 1-3), right (frame 4, buffers 5-6), up (discard 2; frames 5-7), right (discard 1)
    assert s.generation_calls == 4 and s.frames == 7
    assert s.hits == 3 and s.discarded == 3 and s.speculated == 8 and s.hit_rate == 0.5
    # every call commits exactly the frames shown since the previous one (the opening first)
    assert [c[1] for c in model.calls] == [2, 3, 1, 2]
    assert [c[2][0][c[1]:] for c in model.calls] == [[4] * 3, [4] * 3, [1] * 3, [4] * 3]
    assert model.new_cache is not None and s.model_forwards == 4


def test_speculation_off_generates_one_frame_per_call():
    model = OracleModel(torch.zeros(2, 4, 4))
    session = WorldSession(model, lambda z: list(z), (torch.zeros(1, 1, 2, 4, 4), torch.tensor([[5]])), steps=2,
                           sampler="flow", speculate=1, action_index=arena.action_index)
    for _ in range(4):
        session.step("none")
    assert session.stats.generation_calls == 4 and session.stats.model_forwards == 8
    assert np.isnan(session.stats.hit_rate)
    with pytest.raises(ValueError, match="speculate"):
        WorldSession(model, list, (torch.zeros(1, 1, 2, 4, 4), torch.tensor([[5]])), speculate=9)


@pytest.mark.parametrize("refuse", ["frame2", None], ids=["a frame refused", "control: none refused"])
def test_a_check_on_frames_generated_ahead_cuts_the_block_and_the_world_regenerates(refuse):
    model = OracleModel(torch.zeros(2, 4, 4))
    first = (torch.zeros(1, 2, 2, 4, 4), torch.tensor([[5, 0]]))
    checked = []

    def keep(first_frame, frame):
        checked.append(first_frame)
        return frame != refuse

    session = WorldSession(model, lambda z: [f"frame{i}" for i in range(len(z))], first, steps=1,
                           sampler="consistency", speculate=4, action_index=arena.action_index, keep=keep)
    shown = [session.step("right") for _ in range(6)]
    s = session.stats
    if refuse:  # each block of 4 shows frame0 and frame1; frame2 is refused, frame3 with it
        assert shown == ["frame0", "frame1"] * 3 and s.generation_calls == 3
        assert (s.speculated, s.refused, s.hits, s.discarded) == (3, 6, 3, 0) and s.hit_rate == 3 / 9
        assert [c[1] for c in model.calls] == [2, 2, 2]  # each generation commits the frames shown since the last
    else:
        assert shown == ["frame0", "frame1", "frame2", "frame3", "frame0", "frame1"] and s.generation_calls == 2
        assert (s.speculated, s.refused, s.hits) == (6, 0, 4)
    assert checked and set(checked) == {"frame0"}  # each frame is checked against its block's first


def test_a_frame_generated_ahead_keeps_the_ball_its_first_frame_shows():
    frame = arena.render(arena.reset(np.random.default_rng(0)))
    lost = frame.copy()
    lost[np.all(frame == np.array(arena.BALL_COLOR, dtype=frame.dtype), axis=-1)] = arena.BACKGROUND
    assert arena.detect_ball(frame) is not None and arena.detect_ball(lost) is None
    assert arena.keeps_ball(frame, frame) and not arena.keeps_ball(frame, lost)
    assert arena.keeps_ball(lost, lost) and arena.keeps_ball(lost, frame)  # no ball to lose: nothing refused


@pytest.fixture(scope="module")
def pipe():
    torch.manual_seed(0)
    ae = FrameAutoencoder(channels=(8, 8, 8), latent_channels=4)
    model = NextFrameDiT(latent_channels=4, latent_size=8, dim=32, depth=1, num_heads=2, context_frames=4)
    teacher = NextFrameDiT(latent_channels=4, latent_size=8, dim=32, depth=1, num_heads=2, context_frames=4)
    p = NextFramePipeline(transformer=model.eval(), autoencoder=ae.eval(), teacher=teacher.eval())
    p.set_progress_bar_config(disable=True)
    return p


def test_pipeline_generates_frames_with_stats(pipe):
    out = pipe(actions=["right"] * 5 + ["up"] * 3, seed=0, speculate=4)
    assert len(out.frames) == 8 and out.frames[0].shape == (64, 64, 3) and out.frames[0].dtype == np.uint8
    assert isinstance(out.stats, VideoStats) and out.stats.frames == 8 and out.stats.hits > 0
    again = pipe(actions=["right"] * 5 + ["up"] * 3, seed=0, speculate=4)
    assert all(np.array_equal(a, b) for a, b in zip(out.frames, again.frames))  # seeded
    pt = pipe(num_frames=3, seed=1, use_teacher=True, steps=2, output_type="pt")
    assert pt.frames.shape == (3, 3, 64, 64) and pt.stats.model_forwards == 6
    pil = pipe(num_frames=2, seed=1, output_type="pil")
    assert pil.frames[0].size == (64, 64)


def test_the_pipeline_guards_its_speculation_where_asked(pipe, monkeypatch):
    monkeypatch.setattr(arena, "keeps_ball", lambda first, frame: False)  # refuse every frame generated ahead
    actions = ["right"] * 6
    guarded = pipe(actions=actions, seed=0, speculate=3).stats  # guarded by default
    assert guarded.frames == 6 and guarded.generation_calls == 6 and guarded.refused == 12 and guarded.hits == 0
    plain = pipe(actions=actions, seed=0, speculate=3, guard=False).stats  # the control: the same call unguarded
    assert plain.generation_calls == 2 and plain.refused == 0 and plain.hits == 4
    world = pipe.interactive(seed=0, speculate=3)
    [world.step("left") for _ in range(3)]
    assert world.stats.refused == 6
    world = pipe.interactive(seed=0, speculate=3, guard=False)
    [world.step("left") for _ in range(3)]
    assert world.stats.refused == 0 and world.stats.hits == 2


def test_interactive_session_steps_frames(pipe):
    session = pipe.interactive(seed=3, speculate=2)
    assert len(session.opening) == 2 and np.array_equal(session.opening[0], arena.render(arena.reset(np.random.default_rng(3))))
    frames = [session.step(a) for a in ["left", "left", 0, "down"]]
    assert all(f.shape == (64, 64, 3) for f in frames) and session.stats.frames == 4


def test_players_step_together_in_the_pipeline_and_its_benchmark(pipe):
    from visualspec.pipelines.nfd import ArenaSession
    from visualspec.tools.bench import run_players_benchmark

    alone, together = [pipe.interactive(seed=s, speculate=1) for s in (1, 2)], [pipe.interactive(seed=s, speculate=1)
                                                                             for s in (1, 2)]
    for keys in (["left", "up"], ["left", "none"]):
        frames = ArenaSession.step_together(together, keys)
        for world, key, frame, other in zip(alone, keys, frames, together):
            assert np.abs(world.step(key).astype(int) - frame).max() <= 1 and other.last_frame is frame
    result = run_players_benchmark(pipe, players=2, frames=4, rounds=1, speculate=(1,))
    assert set(result["results"]["speculate 1"]) == {"fps_per_world_one_after_another", "fps_per_world_together",
                                                      "speedup"} and "2 worlds" in result["table"]


def test_pipeline_errors_name_the_problem(pipe, tmp_path):
    with pytest.raises(ValueError, match="jump"):
        pipe(actions=["left", "jump"])
    with pytest.raises(ValueError, match="num_frames"):
        pipe(num_frames=0)
    with pytest.raises(ValueError, match="num_frames"):
        pipe(actions=["left"], num_frames=3)
    with pytest.raises(ValueError, match="output_type"):
        pipe(num_frames=1, output_type="mp4")
    with pytest.raises(ValueError, match="jump"):
        pipe.interactive(seed=0).step("jump")
    with pytest.raises(ValueError, match="speculate"):
        pipe.interactive(speculate=0)
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "LlamaGenPipeline"}))
    with pytest.raises(ValueError, match="not a NextFramePipeline"):
        NextFramePipeline.from_pretrained(tmp_path)


def test_save_load_round_trip_and_export(pipe, tmp_path):
    pipe.save_pretrained(tmp_path / "world")
    loaded = VisualSpecPipeline.from_pretrained(tmp_path / "world")
    assert isinstance(loaded, NextFramePipeline) and loaded.teacher is not None
    loaded.set_progress_bar_config(disable=True)
    a = pipe(num_frames=3, seed=5).frames
    b = loaded(num_frames=3, seed=5).frames
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    for suffix in ("gif", "mp4"):
        path = export_video(a, tmp_path / f"clip.{suffix}")
        assert path.stat().st_size > 0
    import imageio.v2 as imageio

    assert len(imageio.mimread(tmp_path / "clip.gif")) == 3
    with pytest.raises(ValueError, match="mp4 or .gif"):
        export_video(a, tmp_path / "clip.avi")


def test_training_command_runs_and_resumes(tmp_path):
    from visualspec.training.arena import ArenaTrainingConfig, train_arena

    cfg = ArenaTrainingConfig(ae_channels=(8, 8, 8), latent_channels=4, ae_steps=3, ae_batch=2, episodes=4,
                              episode_frames=10, dim=32, depth=1, heads=2, steps=3, batch=2, distill_steps=2,
                              self_forcing_steps=2)
    pipe = train_arena(str(tmp_path / "out"), str(tmp_path / "work"), cfg, progress=False)
    assert isinstance(pipe, NextFramePipeline) and pipe.autoencoder.config.scaling_factor != 1.0
    for stage in ("distill", "self_forcing"):
        assert json.loads((tmp_path / "work" / stage / "meta.json").read_text())["step"] == 2
    train_arena(str(tmp_path / "out2"), str(tmp_path / "work"), cfg, progress=False)  # resumes: nothing left
    recovering = dataclasses.replace(cfg, self_forcing_recover=True)  # and with lost balls put back
    tuned = train_arena(str(tmp_path / "tuned"), str(tmp_path / "work-tuned"), recovering, progress=False,
                        start_from=str(tmp_path / "out"))  # only self forcing, from the folder's models
    assert not (tmp_path / "work-tuned" / "distill").exists()
    assert json.loads((tmp_path / "work-tuned" / "self_forcing" / "meta.json").read_text())["step"] == 2
    for name in ("autoencoder", "teacher", "transformer"):
        same = [torch.equal(a, b) for a, b in zip(getattr(pipe, name).state_dict().values(),
                                                    getattr(tuned, name).state_dict().values())]
        assert all(same) if name != "transformer" else not all(same)
    with pytest.raises(ValueError, match="another configuration"):
        train_arena(str(tmp_path / "out3"), str(tmp_path / "work"), ArenaTrainingConfig(steps=4), progress=False)


def test_loss_weights_favour_moving_cells_and_can_drop_clean_context():
    from visualspec.training.arena import ArenaTrainingConfig, loss_weights

    x0 = torch.zeros(1, 3, 2, 4, 4)
    x0[0, 1, :, 2, 3] = 1.0  # one cell appears in frame 1 (and disappears in frame 2)
    taus = torch.tensor([[0.01, 0.5, 0.7]])  # frame 0 is near-clean context
    plain = loss_weights(x0, taus, ArenaTrainingConfig(motion_weight=0.0, context_weight=1.0))
    assert plain.shape == (1, 3, 1, 4, 4) and torch.equal(plain, torch.ones_like(plain))  # the plain MSE
    w = loss_weights(x0, taus, ArenaTrainingConfig())  # the defaults: motion_weight 4, context_weight 0
    assert torch.all(w[0, 0] == 0)  # context frame: no loss
    for frame in (1, 2):
        assert w[0, frame, 0, 2, 3] == 5 and w[0, frame].sum() == 5 + 15  # the changed cell weighs 1 + 4


def test_ball_cells_mark_the_cells_the_ball_covers_and_weigh_them():
    from visualspec.training.arena import ArenaTrainingConfig, ball_cells, loss_weights
    from visualspec.worlds import arena

    state = arena.ArenaState(player=(0, 0), ball=(30, 14), velocity=(1, 1))  # 4x4 px over cells x 3..4, y 1..2
    cells = ball_cells(arena.render(state))
    assert cells.shape == (8, 8) and sorted(map(tuple, cells.nonzero().tolist())) == [(1, 3), (1, 4), (2, 3), (2, 4)]
    state = arena.ArenaState(player=(0, 0), ball=(32, 16), velocity=(1, 1))  # inside one cell
    assert ball_cells(arena.render(state)).nonzero().tolist() == [[2, 4]]

    x0, taus = torch.zeros(1, 2, 2, 8, 8), torch.tensor([[0.5, 0.5]])
    ball = torch.zeros(1, 2, 8, 8, dtype=torch.bool)
    ball[0, 1, 2, 4] = True
    w = loss_weights(x0, taus, ArenaTrainingConfig(ball_weight=8.0), ball)
    assert w[0, 1, 0, 2, 4] == 9 and w.sum() == 2 * 64 + 8
    assert torch.equal(loss_weights(x0, taus, ArenaTrainingConfig(), ball), torch.ones_like(w))  # default: off


def test_own_rollout_plays_as_the_session_does():
    """Self forcing learns from contexts made exactly as the model plays: the opening frames are
    the true ones, every later frame is the model's own sample, the same as a WorldSession's."""
    from visualspec.training.arena import ArenaTrainingConfig, own_rollout
    from visualspec.video import rollout

    model = tiny_dit(context_frames=3)
    truth, acts = torch.randn(1, 7, 4, 4, 4), torch.tensor([[model.no_action, 0, 2, 2, 2, 1, 1]])
    for speculate in (1, 3):
        # blocks of `speculate` frames while the action persists, as the session makes them
        cfg = ArenaTrainingConfig(max_speculate=speculate, context_noise=0.02)
        rng = np.random.default_rng(0)
        with torch.no_grad():
            own = own_rollout(model, truth, acts, 2, cfg, rng, torch.Generator().manual_seed(3))
        assert own.shape == truth.shape and torch.equal(own[:, :2], truth[:, :2])
        assert not torch.allclose(own[:, 2:], truth[:, 2:])
        if speculate == 1:
            frames, _ = rollout(model, lambda z: list(z), (truth[:, :2], acts[:, :2]), acts[0, 2:].tolist(),
                                speculate=1, context_noise=0.02, generator=torch.Generator().manual_seed(3))
            torch.testing.assert_close(torch.stack(frames)[None], own[:, 2:])


@pytest.mark.parametrize("speculate", [1, 2])
def test_worlds_stepped_together_show_what_each_shows_alone(speculate, monkeypatch):
    """Players' worlds batched into one forward give each the frames it would get alone: one world
    joins late (its cache holds more frames at first, and it sits at another frame index), keys
    change at different times, so speculation hits and discards differ between worlds."""
    from visualspec.models.nfd import FrameCache
    from visualspec.video import step_together

    model = tiny_dit(context_frames=3)

    def decode(z):
        return list(z)

    def world(seed):
        opening = torch.randn(1, 2, 4, 4, 4, generator=torch.Generator().manual_seed(seed))
        return WorldSession(model, decode, (opening, torch.tensor([[model.no_action, 0]])),
                            speculate=speculate, context_noise=0.02, generator=torch.Generator().manual_seed(seed))

    batches = []  # the sizes of the batched generations: the control that batching happened
    stack = FrameCache.stack
    monkeypatch.setattr(FrameCache, "stack", classmethod(lambda cls, caches: batches.append(len(caches))
                                                         or stack(caches)))
    keys = [[1, 1, 1, 2, 2, 0, 0, 0, 3, 3], [0, 0, 4, 4, 4, 4, 1, 2, 2, 2], [3, 3, 3, 3, 1, 1, 1, 1, 1, 0]]
    alone, together = [world(s) for s in range(3)], [world(s) for s in range(3)]
    for w in (alone[2], together[2]):  # the third player has played two frames already
        w.step(4), w.step(4)
    for t in range(10):
        solo = [w.step(k[t]) for w, k in zip(alone, keys)]
        batched = step_together(together, [k[t] for k in keys])
        for x, y in zip(solo, batched):
            torch.testing.assert_close(y, x, atol=1e-5, rtol=1e-5)
    for a, b in zip(alone, together):
        assert (a.stats.hits, a.stats.discarded, a.stats.model_forwards) == (b.stats.hits, b.stats.discarded,
                                                                            b.stats.model_forwards)
    assert batches and min(batches) >= 2  # worlds did share forwards
    assert speculate > 1 or 3 in batches  # without speculation all three share every forward once in step
    with pytest.raises(ValueError, match="different numbers of frames"):
        FrameCache.stack([model.new_cache(), together[0].cache])


def test_self_forcing_targets_continue_the_ball_the_model_drew():
    """The target of a rollout whose ball is off the recorded one continues the drawn ball (where
    and as it moved), with the recorded player; a rollout that lost the ball has no target."""
    from visualspec.training.arena import simulated_targets

    class Pixels(torch.nn.Module):  # an autoencoder whose latents are the frames themselves
        def __init__(self):
            super().__init__()
            self.unused = torch.nn.Parameter(torch.zeros(1))

        def encode(self, x):
            return x

        def decode(self, z):
            return z

    def pixels(state):
        return torch.from_numpy(arena.render(state)).float().permute(2, 0, 1) / 127.5 - 1

    drawn = [arena.ArenaState(player=(5, 5), ball=(20, 30), velocity=(1, 2)),
             arena.ArenaState(player=(5, 5), ball=(21, 32), velocity=(1, 2))]  # moving (+1, +2)
    recorded = arena.ArenaState(player=(40, 40), ball=(50, 10), velocity=(-2, -1))
    lost = torch.full((2, 3, 64, 64), -1.0)  # nothing drawn: no ball
    context = torch.stack([torch.stack([pixels(s) for s in drawn]), lost])
    rows = np.array([[arena.state_row(recorded)] * 2] * 2)
    target, ball, kept = simulated_targets(Pixels(), context, rows, np.zeros((2, 4), dtype=np.int64))
    assert kept.tolist() == [True, False] and target.shape == (2, 2, 3, 64, 64) and ball.shape == (2, 2, 64, 64)
    frames = ((target[0].permute(0, 2, 3, 1) + 1) * 127.5).round().byte().numpy()
    assert [arena.detect_ball(f) for f in frames] == [(23.5, 35.5), (24.5, 37.5)]  # from (21, 32) by (+1, +2)
    assert [arena.detect_player(f) for f in frames] == [(43.5, 43.5)] * 2  # the recorded player

    # drawn in two frames, then lost for two: put back where the game carried it, only with recover
    context = torch.cat([context[:1], lost[None]], 1)  # (1, 4, ...)
    rows, keys = np.array([[arena.state_row(recorded)] * 4]), np.zeros((1, 5), dtype=np.int64)
    assert simulated_targets(Pixels(), context, rows, keys)[2].tolist() == [False]
    target, _, kept = simulated_targets(Pixels(), context, rows, keys, recover=True)
    frame = ((target[0, 0].permute(1, 2, 0) + 1) * 127.5).round().byte().numpy()
    assert kept.tolist() == [True] and arena.detect_ball(frame) == (25.5, 39.5)  # three steps on from (21, 32)
    context[0, 2] = context[0, 1]  # a ball seen again alone, after a lost frame, gives no velocity: no target
    context[0, 1] = lost[0]
    assert simulated_targets(Pixels(), context[:, 1:], rows[:, 1:], keys[:, 1:], recover=True)[2].tolist() == [False]


def test_compiled_worlds_play_the_eager_frames_and_compile_nothing_while_playing():
    """compile_step + precompile (what the app's compile_worlds does): once a world's context is
    full it steps through the compiled graphs, with the eager frames (to rounding), and no shape
    compiles during play; the first frames and the other shapes run eagerly."""
    from unittest import mock

    model = tiny_dit(context_frames=3)
    opening = (torch.randn(1, 2, 4, 4, 4, generator=torch.Generator().manual_seed(0)),
               torch.tensor([[model.no_action, 0]]))
    actions = [1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 3, 3]

    def play():
        session = WorldSession(model, lambda z: list(z), opening, steps=1, speculate=2,
                               generator=torch.Generator().manual_seed(1))
        return torch.stack([session.step(a) for a in actions])

    eager = play()
    model.compile_step(True)
    model.precompile([1], [(1, 2), (2, 2)])
    graphs = dict(model._compiler.compile_s)
    assert len(graphs) == 2
    with mock.patch.object(model._compiler, "compiled", wraps=model._compiler.compiled) as compiled:
        frames = play()
    assert compiled.call_count >= 4  # the steps after the context filled
    assert model._compiler.compile_s == graphs
    torch.testing.assert_close(frames, eager, atol=1e-5, rtol=1e-5)
    model.compile_step(False)
    with mock.patch.object(model._compiler, "compiled", side_effect=AssertionError("compiled while off")):
        torch.testing.assert_close(play(), eager, atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError, match="call compile_step"):
        model.precompile([1], [(1, 1)])


def test_the_compiled_decoder_gives_the_eager_frames_and_other_batches_stay_eager():
    from unittest import mock

    torch.manual_seed(0)
    autoencoder = FrameAutoencoder(channels=(8, 8), latent_channels=4).eval()
    z2, z3 = torch.randn(2, 4, 4, 4), torch.randn(3, 4, 4, 4)
    with torch.no_grad():
        eager2, eager3 = autoencoder.decode(z2), autoencoder.decode(z3)
        autoencoder.compile_step(True)
        autoencoder.precompile([2], latent_size=4)
        assert len(autoencoder._compiler.compile_s) == 1
        torch.testing.assert_close(autoencoder.decode(z2), eager2, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(autoencoder.decode(z3), eager3, atol=1e-5, rtol=1e-5)  # not compiled: eager
    assert len(autoencoder._compiler.compile_s) == 1
    autoencoder.compile_step(False)
    with mock.patch.object(autoencoder._compiler, "compiled", side_effect=AssertionError("compiled while off")):
        with torch.no_grad():
            torch.testing.assert_close(autoencoder.decode(z2), eager2, atol=1e-5, rtol=1e-5)


def test_a_bfloat16_world_takes_float32_latents_and_plays_near_the_float32_one(pipe):
    """Loaded in bfloat16 (``--dtype``), the transformer takes float32 latents and returns float32
    velocities within bfloat16's rounding of the float32 model's, with its cache in bfloat16; a
    whole pipeline (autoencoder too) plays in it."""
    import copy

    model = tiny_dit(context_frames=3)
    half = copy.deepcopy(model).to(torch.bfloat16)
    x, taus, acts = torch.randn(2, 5, 4, 4, 4), torch.rand(2, 5), torch.randint(0, 6, (2, 5))
    with torch.no_grad():
        full = model(x, taus, acts)
        cache = half.new_cache()
        out = torch.cat([half(x[:, :3], taus[:, :3], acts[:, :3], cache=cache, write=3),
                         half(x[:, 3:], taus[:, 3:], acts[:, 3:], cache=cache, write=0)], dim=1)
    assert out.dtype == torch.float32 and cache.keys[0].dtype == torch.bfloat16
    error = ((out - full).norm() / full.norm()).item()
    assert 0 < error < 0.03  # rounded (not float32 underneath), by about bfloat16's 2**-8 a product
    world = copy.deepcopy(pipe).to(torch.bfloat16)
    frames = world(actions=["right"] * 3 + ["up"] * 2, seed=0, speculate=2).frames
    assert len(frames) == 5 and all(f.dtype == np.uint8 and f.shape == (64, 64, 3) for f in frames)
