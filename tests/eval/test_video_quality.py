"""The open-loop rollout measure counts what it claims: player distance and frames without a ball."""

from types import SimpleNamespace

import numpy as np

from visualspec.eval.video import rollout_player_error, simulator_rollout
from visualspec.video import VideoStats
from visualspec.worlds import arena


class SimulatorAsModel:
    """A 'world model' that plays the simulator exactly, except that it can hide the ball."""

    config = SimpleNamespace(opening_frames=2, default_steps=1, default_teacher_steps=8)

    def __init__(self, hide=range(0)):
        self.hide = set(hide)

    def __call__(self, actions, seed, **kwargs):
        frames = []
        for t, state in enumerate(simulator_rollout(seed, actions, self.config.opening_frames)):
            frame = arena.render(state)
            if t in self.hide:
                x, y = state.ball
                frame[y:y + arena.BALL_SIZE, x:x + arena.BALL_SIZE] = arena.BACKGROUND
            frames.append(frame)
        return SimpleNamespace(frames=frames, stats=VideoStats(frames=len(frames)))


def test_the_simulator_itself_never_loses_player_or_ball():
    r = rollout_player_error(SimulatorAsModel(), episodes=3, frames=30)
    assert r["frames_within_tolerance"] == 1.0 and r["median_error_px"] == 0.0
    assert r["ball_not_found"] == 0 and r["longest_run_without_ball"] == 0


def test_frames_without_the_ball_are_counted_with_their_longest_run():
    r = rollout_player_error(SimulatorAsModel(hide=list(range(5, 12)) + [20, 21]), episodes=3, frames=30)
    assert r["ball_not_found"] == 3 * 9 and r["longest_run_without_ball"] == 7
    assert np.isclose(r["ball_not_found_share"], 9 / 30)
    assert r["frames_within_tolerance"] == 1.0  # the player is untouched
