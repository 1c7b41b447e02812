"""The arena world follows its fixed specification, and its detectors read states back off frames."""

import numpy as np
import pytest

from visualspec.worlds import arena
from visualspec.worlds.arena import ArenaState


def _box_blur(frame):
    """3x3 box blur with edge replication, float output."""
    padded = np.pad(frame.astype(np.float64), ((1, 1), (1, 1), (0, 0)), mode="edge")
    return sum(padded[i:i + 64, j:j + 64] for i in range(3) for j in range(3)) / 9


def _to_uint8(image):
    return np.clip(np.round(image), 0, 255).astype(np.uint8)


def _touching(state):
    """Ball and player boxes share an edge or a corner (gap <= 0 on both axes)."""
    return all(arena._gap(b, p) <= 0 for b, p in zip(state.ball, state.player))


def _far_state(player=(28, 28)):
    return ArenaState(player=player, ball=(2, 2) if player[0] > 20 else (58, 58), velocity=(1, 1))


# ------------------------------------------------------------------------------------ spec and rendering


def test_constants_and_rendering_follow_the_spec():
    assert arena.FPS == 30 and arena.CANVAS == 64
    assert arena.BACKGROUND == (16, 16, 24)
    assert arena.PLAYER_COLOR == (60, 200, 255) and arena.BALL_COLOR == (255, 200, 60)
    assert arena.ACTIONS == ("none", "up", "down", "left", "right")
    state = ArenaState(player=(10, 20), ball=(40, 5), velocity=(2, -1))
    frame = arena.render(state)
    assert frame.shape == (64, 64, 3) and frame.dtype == np.uint8
    player = (frame == arena.PLAYER_COLOR).all(2)
    ball = (frame == arena.BALL_COLOR).all(2)
    background = (frame == arena.BACKGROUND).all(2)
    assert player.sum() == 64 and player[20:28, 10:18].all()
    assert ball.sum() == 16 and ball[5:9, 40:44].all()
    assert (player | ball | background).all()
    # the player is drawn on top (only visible in a state the game never produces)
    frame = arena.render(ArenaState(player=(10, 10), ball=(12, 12), velocity=(1, 1)))
    assert (frame == arena.PLAYER_COLOR).all(2).sum() == 64 and (frame == arena.BALL_COLOR).all(2).sum() == 0
    assert arena.player_center(state) == (13.5, 23.5) and arena.ball_center(state) == (41.5, 6.5)


@pytest.mark.parametrize("action", arena.ACTIONS)
def test_player_moves_two_pixels_per_action_and_is_clamped(action):
    dx, dy = {"none": (0, 0), "up": (0, -2), "down": (0, 2), "left": (-2, 0), "right": (2, 0)}[action]
    state = _far_state()
    for by_index in (False, True):
        new = arena.step(state, arena.ACTIONS.index(action) if by_index else action)
        assert new.player == (28 + dx, 28 + dy)
    # walls: clamped at 0 and 56, also from one pixel away
    for x, y in [(0, 0), (1, 1), (56, 56), (55, 55), (0, 56), (56, 0)]:
        new = arena.step(_far_state((x, y)), action)
        assert new.player == (min(max(x + dx, 0), 56), min(max(y + dy, 0), 56))


def test_ball_moves_by_its_velocity_and_bounces_off_walls():
    free = arena.step(ArenaState(player=(0, 0), ball=(30, 30), velocity=(2, -1)), "none")
    assert free.ball == (32, 29) and free.velocity == (2, -1)
    right = arena.step(ArenaState(player=(0, 0), ball=(59, 30), velocity=(2, 1)), "none")
    assert right.ball == (60, 31) and right.velocity == (-2, 1)
    top_left = arena.step(ArenaState(player=(30, 30), ball=(0, 1), velocity=(-1, -2)), "none")
    assert top_left.ball == (0, 0) and top_left.velocity == (1, 2)
    again = arena.step(top_left, "none")
    assert again.ball == (1, 2) and again.velocity == (1, 2)


def test_ball_bounces_off_a_standing_player():
    player = (20, 20)
    from_left = arena.step(ArenaState(player=player, ball=(15, 22), velocity=(2, 1)), "none")
    assert from_left.ball == (16, 23) and from_left.velocity == (-2, 1)  # flush against the left side
    from_above = arena.step(ArenaState(player=player, ball=(22, 15), velocity=(-1, 2)), "none")
    assert from_above.ball == (21, 16) and from_above.velocity == (-1, -2)
    from_right = arena.step(ArenaState(player=player, ball=(29, 25), velocity=(-2, -2)), "none")
    assert from_right.ball == (28, 23) and from_right.velocity == (2, -2)
    from_below = arena.step(ArenaState(player=player, ball=(18, 29), velocity=(1, -2)), "none")
    assert from_below.ball == (19, 28) and from_below.velocity == (1, 2)
    # corner hit with equal entry times: resolved along x
    corner = arena.step(ArenaState(player=player, ball=(15, 15), velocity=(2, 2)), "none")
    assert corner.ball == (16, 17) and corner.velocity == (-2, 2)
    # corner hit entering later along y: resolved along y
    late_y = arena.step(ArenaState(player=player, ball=(16, 15), velocity=(2, 2)), "none")
    assert late_y.ball == (18, 16) and late_y.velocity == (2, -2)


def test_player_pushes_the_ball_and_is_blocked_against_a_wall():
    # pushing a ball that moves towards the player: it bounces off, flush with the player's new side
    hit = arena.step(ArenaState(player=(20, 20), ball=(28, 22), velocity=(-1, 1)), "right")
    assert hit.player == (22, 20) and hit.ball == (30, 23) and hit.velocity == (1, 1)
    # catching up with a ball that moves away: pushed along the player's motion, velocity kept
    push = arena.step(ArenaState(player=(20, 30), ball=(22, 26), velocity=(1, -1)), "up")
    assert push.player == (20, 28) and push.ball == (23, 24) and push.velocity == (1, -1)
    # squeezed against the right wall: the ball stays at the wall and the player is blocked
    squeezed = arena.step(ArenaState(player=(51, 20), ball=(59, 22), velocity=(1, 1)), "right")
    assert squeezed.ball == (60, 23) and squeezed.player == (52, 20) and squeezed.velocity == (1, 1)
    held = arena.step(squeezed, "right")
    assert held.ball == (60, 24) and held.player == (52, 20)
    # squeezed against the top wall
    top = arena.step(ArenaState(player=(30, 5), ball=(31, 0), velocity=(2, -1)), "up")
    assert top.ball == (33, 0) and top.player == (30, 4) and top.velocity == (2, -1)


def test_invariants_hold_over_thousands_of_random_frames():
    touches = player_bounces = blocked = 0
    for seed in range(8):  # 8000 frames; seeds 6 and 7 squeeze the ball against a wall
        ep = arena.episode(seed, 1000)
        speeds = tuple(abs(v) for v in ep.states[0].velocity)
        for old, new, action in zip(ep.states, ep.states[1:], ep.actions):
            px, py = new.player
            bx, by = new.ball
            assert 0 <= px <= 56 and 0 <= py <= 56 and 0 <= bx <= 60 and 0 <= by <= 60
            assert all(v in (-2, -1, 1, 2) for v in new.velocity)
            assert tuple(abs(v) for v in new.velocity) == speeds  # only signs ever change
            assert not arena.overlaps(new.ball, new.player)
            dx, dy = arena.MOVES[arena.ACTIONS[action]]
            wanted = (min(max(old.player[0] + 2 * dx, 0), 56), min(max(old.player[1] + 2 * dy, 0), 56))
            if new.player != wanted:  # blocked by the ball: moves less, in the action's direction
                blocked += 1
                moved = np.subtract(new.player, old.player)
                assert 0 <= moved @ (dx, dy) < 2 and moved @ (dy, dx) == 0
            at_wall = bx in (0, 60) or by in (0, 60)
            if _touching(new):
                touches += 1
                player_bounces += new.velocity != old.velocity and not at_wall
            elif not at_wall:  # nothing to bounce off: the ball moved freely
                assert new.ball == (old.ball[0] + old.velocity[0], old.ball[1] + old.velocity[1])
                assert new.velocity == old.velocity
    assert touches > 20 and player_bounces > 5 and blocked >= 1  # the collision rules were exercised


def test_reset_places_non_overlapping_objects_with_random_velocity():
    rng = np.random.default_rng(0)
    states = [arena.reset(rng) for _ in range(2000)]
    for s in states:
        assert 0 <= min(s.player) and max(s.player) <= 56 and 0 <= min(s.ball) and max(s.ball) <= 60
        assert not arena.overlaps(s.ball, s.player)
        assert all(isinstance(v, int) for v in (*s.player, *s.ball, *s.velocity))
    assert {s.velocity for s in states} == {(a, b) for a in (-2, -1, 1, 2) for b in (-2, -1, 1, 2)}
    assert {s.player[0] for s in states} == set(range(57))


# ------------------------------------------------------------------------------------ episodes and actions


def test_episodes_are_seeded_and_consistent():
    a, b = arena.episode(7, 50), arena.episode(7, 50)
    assert a.frames.shape == (51, 64, 64, 3) and a.frames.dtype == np.uint8
    assert a.actions.shape == (50,) and np.issubdtype(a.actions.dtype, np.integer) and len(a.states) == 51
    assert np.array_equal(a.frames, b.frames) and np.array_equal(a.actions, b.actions) and a.states == b.states
    assert not np.array_equal(a.frames, arena.episode(8, 50).frames)
    for i, action in enumerate(a.actions):
        assert a.states[i + 1] == arena.step(a.states[i], int(action))
        assert np.array_equal(a.frames[i], arena.render(a.states[i]))
    assert np.array_equal(a.frames[50], arena.render(a.states[50]))
    from_rng = arena.episode(np.random.default_rng(7), 50)
    assert np.array_equal(from_rng.frames, a.frames)
    # given actions, by name or index, are the ones used
    names = ["right"] * 3 + ["down", "none"]
    given = arena.episode(3, 5, actions=names)
    assert given.actions.tolist() == [4, 4, 4, 2, 0]
    assert given.states == arena.episode(3, 5, actions=np.array([4, 4, 4, 2, 0])).states
    assert given.states[0] == arena.episode(3, 5).states[0]  # same seed, same initial state


def test_batch_episodes_are_stacked_and_seeded():
    frames, actions = arena.batch_episodes(5, 3, 10)
    assert frames.shape == (3, 11, 64, 64, 3) and frames.dtype == np.uint8 and actions.shape == (3, 10)
    again_frames, again_actions = arena.batch_episodes(5, 3, 10)
    assert np.array_equal(frames, again_frames) and np.array_equal(actions, again_actions)
    fewer_frames, _ = arena.batch_episodes(5, 2, 10)
    assert np.array_equal(fewer_frames, frames[:2])  # episode k does not depend on count
    assert not np.array_equal(frames[0], frames[1])


@pytest.mark.parametrize("persistence", [0.9, 0.5, 0.0])
def test_random_actions_repeat_as_often_as_persistence_says(persistence):
    n = 200_000
    actions = arena.random_actions(np.random.default_rng(1), n, persistence)
    assert actions.shape == (n,) and actions.min() == 0 and actions.max() == 4
    repeats = (actions[1:] == actions[:-1]).mean()
    expected = persistence + (1 - persistence) / 5
    standard_error = np.sqrt(expected * (1 - expected) / (n - 1))
    assert abs(repeats - expected) < 5 * standard_error
    counts = np.bincount(actions, minlength=5) / n  # every action equally likely in the long run
    assert np.abs(counts - 0.2).max() < 0.02
    always = arena.random_actions(np.random.default_rng(2), 100, persistence=1.0)
    assert (always == always[0]).all()
    assert arena.random_actions(np.random.default_rng(2), 0).shape == (0,)


# ------------------------------------------------------------------------------------ detection


def _detector_states():
    """Random game states plus the ball touching each side and corner of the player, walls included."""
    states = [s for seed in range(3) for s in arena.episode(100 + seed, 100).states]
    for px, py in [(20, 30), (0, 0), (56, 56), (4, 52), (52, 4)]:
        for bx, by in [(px - 4, py), (px + 8, py + 4), (px + 2, py - 4), (px + 4, py + 8),
                       (px - 4, py - 4), (px + 8, py + 8), (px - 4, py + 8), (px + 8, py - 4)]:
            if 0 <= bx <= 60 and 0 <= by <= 60:
                states.append(ArenaState(player=(px, py), ball=(bx, by), velocity=(1, 1)))
    return states


def test_detectors_are_exact_on_clean_frames():
    for state in _detector_states():
        frame = arena.render(state)
        assert arena.detect_player(frame) == arena.player_center(state)
        assert arena.detect_ball(frame) == arena.ball_center(state)
        assert arena.detect_player(frame.astype(np.float32)) == arena.player_center(state)


@pytest.mark.parametrize("corruption", ["noise", "blur", "blur+noise"])
def test_detectors_survive_noise_and_blur(corruption):
    rng = np.random.default_rng(0)
    for state in _detector_states():
        frame = arena.render(state).astype(np.float64)
        if "blur" in corruption:
            frame = _box_blur(frame)
        if "noise" in corruption:
            frame = frame + rng.normal(0, 8, frame.shape)
        frame = _to_uint8(frame)
        for detect, center in ((arena.detect_player, arena.player_center), (arena.detect_ball, arena.ball_center)):
            found = detect(frame)
            assert found is not None
            assert np.abs(np.subtract(found, center(state))).max() < 0.5, (corruption, state)


def test_detectors_return_none_without_the_object_and_ignore_stray_pixels():
    empty = np.empty((64, 64, 3), dtype=np.uint8)
    empty[:] = arena.BACKGROUND
    assert arena.detect_player(empty) is None and arena.detect_ball(empty) is None
    noisy = _to_uint8(empty + np.random.default_rng(0).normal(0, 8, empty.shape))
    assert arena.detect_player(noisy) is None and arena.detect_ball(noisy) is None
    two_pixels = empty.copy()
    two_pixels[5, 5:7] = arena.BALL_COLOR
    assert arena.detect_ball(two_pixels) is None
    state = ArenaState(player=(10, 10), ball=(40, 40), velocity=(1, 1))
    frame = arena.render(state)
    frame[60, 2] = frame[2, 60] = arena.PLAYER_COLOR  # isolated stray pixels: not the largest blob
    assert arena.detect_player(frame) == arena.player_center(state)
    with pytest.raises(ValueError, match="RGB"):
        arena.detect_player(np.zeros((64, 64)))


# ------------------------------------------------------------------------------------ errors


def test_actions_are_validated_with_clear_errors():
    assert [arena.action_index(a) for a in arena.ACTIONS] == [0, 1, 2, 3, 4]
    assert arena.action_index(np.int64(3)) == 3
    with pytest.raises(ValueError, match=r"'jump'.*'none', 'up', 'down', 'left', 'right'"):
        arena.action_index("jump")
    with pytest.raises(ValueError, match="index 5"):
        arena.action_index(5)
    with pytest.raises(ValueError, match="index -1"):
        arena.action_index(-1)
    for bad in (True, 1.0, None):
        with pytest.raises(TypeError):
            arena.action_index(bad)
    with pytest.raises(ValueError, match=r"'jump'.*'none', 'up'"):
        arena.step(_far_state(), "jump")
    with pytest.raises(ValueError, match="overlaps"):
        arena.step(ArenaState(player=(10, 10), ball=(12, 12), velocity=(1, 1)), "none")
    with pytest.raises(ValueError, match="velocity"):
        arena.step(ArenaState(player=(10, 10), ball=(40, 40), velocity=(0, 1)), "none")


def test_episode_arguments_are_validated_with_clear_errors():
    for bad in (0, -3):
        with pytest.raises(ValueError, match="num_frames must be >= 1"):
            arena.episode(0, bad)
    with pytest.raises(ValueError, match="1-D"):
        arena.episode(0, 2, actions=[[1, 2]])
    with pytest.raises(ValueError, match="1-D"):
        arena.episode(0, 1, actions="up")
    with pytest.raises(ValueError, match="3 entries but num_frames is 2"):
        arena.episode(0, 2, actions=[1, 2, 3])
    with pytest.raises(ValueError, match=r"actions\[1\].*'jump'"):
        arena.episode(0, 2, actions=["up", "jump"])
    with pytest.raises(ValueError, match=r"actions\[0\].*index 7"):
        arena.episode(0, 2, actions=np.array([7, 1]))
    with pytest.raises(ValueError, match=r"actions\[0\]"):
        arena.episode(0, 2, actions=np.array([1.0, 2.0]))
    with pytest.raises(TypeError, match="seed_or_rng"):
        arena.episode("seed", 2)
    with pytest.raises(ValueError, match="persistence"):
        arena.random_actions(np.random.default_rng(0), 5, persistence=1.5)


def test_batch_episodes_states_are_the_states_drawn_in_their_frames():
    frames, actions, states = arena.batch_episodes(5, 3, 10, with_states=True)
    assert states.shape == (3, 11, 6) and np.array_equal(actions, arena.batch_episodes(5, 3, 10)[1])
    for e in range(3):
        for t in (0, 4, 10):
            assert np.array_equal(arena.render(arena.state_from_row(states[e, t])), frames[e, t])
