"""The arena world: a fixed, exactly checkable video game for action-conditioned next-frame models.

Specification (fixed, so anyone can check it):

- 30 frames per second (:data:`FPS`); every frame is a 64x64 RGB uint8 image on a uniform dark
  background (16, 16, 24).
- The player is a filled 8x8 px square of colour (60, 200, 255) with an integer top-left
  position, always fully inside the canvas. The actions are :data:`ACTIONS` =
  ("none", "up", "down", "left", "right"); each frame the player moves 2 px in the action's
  direction (up is -y, image rows grow downwards), clamped to the canvas.
- The ball is a filled 4x4 px square of colour (255, 200, 60) with an integer top-left position and
  an integer velocity whose components are each one of -2, -1, 1, 2 (never 0). Collisions only ever
  flip signs, so the speed of each component is fixed for a whole episode.
- Order within a frame: (1) the action moves the player; (2) the ball moves by its velocity;
  (3) collisions are resolved:

  * walls: a ball coordinate that left the canvas is clamped back to the wall and that velocity
    component is reflected (negated);
  * player: if the ball box now overlaps the player box, the ball is resolved along one axis, the
    *entry axis*. Take the positions before the frame (which never overlap) and the ball's motion
    relative to the player in this frame. The entry axis is the axis on which the two boxes were
    apart before the frame; if they were apart on both, it is the axis on which they started to
    overlap last (exactly: the larger gap / |relative motion|), and x on a tie (a corner hit).
    The ball is placed flush against the player's side it came from on that axis (touching, not
    overlapping) and that velocity component is made to point away from the player (a reflection
    when the ball was moving into the player). This one rule covers both the ball hitting the
    player and the player pushing the ball (the ball is pushed along the player's motion).
  * blocked player: if the flush place lies outside the canvas (the ball is squeezed against a
    wall), the ball is clamped to the wall and the player is put flush against the ball instead,
    i.e. the player is blocked by the ball. This only happens when the player moved towards the
    ball on the entry axis, so a blocked player moves less than 2 px but never backwards.

  At the end of every frame both squares are inside the canvas and never overlap.
- Rendering: background, then the ball, then the player (the player is drawn on top).
- :func:`reset` draws a uniformly random player position, a uniformly random non-overlapping ball
  position and a uniformly random velocity. :func:`random_actions` is a person holding keys: each
  frame keeps the previous action with probability ``persistence`` (0.9 by default), else draws
  one of the five actions uniformly.
- Centre convention: a square of size s at top-left (x, y) has centre (x + (s-1)/2, y + (s-1)/2),
  the mean of its pixel coordinates; :func:`detect_player` and :func:`detect_ball` read it off a
  frame as the centroid of the largest 8-connected blob of pixels within Euclidean RGB distance
  :data:`COLOR_TOLERANCE` of the object's colour. The tolerance is below half the distance
  between any two of the three palette colours, so a pixel matches at most one object, and a 3x3
  box blur leaves exactly the square minus its four corners (the same centre).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..core.checks import check_int, check_positive_int

FPS = 30
CANVAS = 64
BACKGROUND = (16, 16, 24)
PLAYER_COLOR = (60, 200, 255)
BALL_COLOR = (255, 200, 60)
PLAYER_SIZE = 8
BALL_SIZE = 4
PLAYER_MAX = CANVAS - PLAYER_SIZE  # largest top-left coordinate of the player
BALL_MAX = CANVAS - BALL_SIZE
PLAYER_SPEED = 2
BALL_VELOCITIES = (-2, -1, 1, 2)
ACTIONS = ("none", "up", "down", "left", "right")
MOVES = {"none": (0, 0), "up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}
DEFAULT_PERSISTENCE = 0.9
COLOR_TOLERANCE = 120.0  # Euclidean RGB distance; half the closest palette pair is ~138
MIN_PIXELS = 3  # fewer matching pixels than this: the object is not in the frame


@dataclass(frozen=True)
class ArenaState:
    player: tuple[int, int]  # top-left x, y
    ball: tuple[int, int]  # top-left x, y
    velocity: tuple[int, int]  # vx, vy of the ball


@dataclass(frozen=True)
class Episode:
    frames: np.ndarray  # (num_frames + 1, 64, 64, 3) uint8; frame 0 is the initial state
    actions: np.ndarray  # (num_frames,) int64; action i leads from frame i to frame i + 1
    states: list[ArenaState]  # num_frames + 1 states, states[i] is drawn in frames[i]


# ------------------------------------------------------------------------------------ actions


def action_index(action: int | str) -> int:
    """The index in :data:`ACTIONS` of an action given by name or index."""
    if isinstance(action, str):
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}; choose one of {ACTIONS} or an index 0..{len(ACTIONS) - 1}")
        return ACTIONS.index(action)
    if isinstance(action, (bool, np.bool_)) or not isinstance(action, (int, np.integer)):
        raise TypeError(f"an action is a name in {ACTIONS} or an int index, not {type(action).__name__} {action!r}")
    if not 0 <= action < len(ACTIONS):
        raise ValueError(f"unknown action index {int(action)}; choose 0..{len(ACTIONS) - 1} for {ACTIONS}")
    return int(action)


def random_actions(rng: np.random.Generator, num_frames: int, persistence: float = DEFAULT_PERSISTENCE) -> np.ndarray:
    """(num_frames,) int64 actions: keep the previous one with probability ``persistence``, else redraw uniformly."""
    check_int("num_frames", num_frames, 0)
    if not 0.0 <= persistence <= 1.0:
        raise ValueError(f"persistence must be in [0, 1], got {persistence}")
    redraw = rng.random(num_frames) >= persistence
    drawn = rng.integers(0, len(ACTIONS), size=num_frames)
    if num_frames:
        redraw[0] = True  # the first action is always a fresh draw
    last_redraw = np.maximum.accumulate(np.where(redraw, np.arange(num_frames), 0))
    return drawn[last_redraw].astype(np.int64)


def _action_array(actions, num_frames: int) -> np.ndarray:
    try:  # arrays and tensors keep their dtype; plain sequences may mix names and indices
        array = np.asarray(actions) if hasattr(actions, "__array__") else np.asarray(actions, dtype=object)
    except ValueError as err:
        raise ValueError(f"actions must be a 1-D sequence of {num_frames} actions: {err}") from None
    if array.ndim != 1:
        raise ValueError(f"actions must be a 1-D sequence of {num_frames} actions, got shape {array.shape}")
    if len(array) != num_frames:
        raise ValueError(f"actions has {len(array)} entries but num_frames is {num_frames}")
    out = np.empty(num_frames, dtype=np.int64)
    for i, action in enumerate(array.tolist()):
        try:
            out[i] = action_index(action)
        except (TypeError, ValueError) as err:
            raise ValueError(f"actions[{i}] is not a valid action: {err}") from None
    return out


# ------------------------------------------------------------------------------------ dynamics


def overlaps(ball: Sequence[int], player: Sequence[int]) -> bool:
    """Whether a ball and a player at these top-left corners share a pixel."""
    return all(b < p + PLAYER_SIZE and p < b + BALL_SIZE for b, p in zip(ball, player))


def _check_state(state: ArenaState) -> None:
    (px, py), (bx, by), (vx, vy) = state.player, state.ball, state.velocity
    if not (0 <= px <= PLAYER_MAX and 0 <= py <= PLAYER_MAX):
        raise ValueError(f"player {state.player} is not inside the canvas (0..{PLAYER_MAX})")
    if not (0 <= bx <= BALL_MAX and 0 <= by <= BALL_MAX):
        raise ValueError(f"ball {state.ball} is not inside the canvas (0..{BALL_MAX})")
    if vx not in BALL_VELOCITIES or vy not in BALL_VELOCITIES:
        raise ValueError(f"ball velocity {state.velocity} has a component outside {BALL_VELOCITIES}")
    if overlaps(state.ball, state.player):
        raise ValueError(f"ball {state.ball} overlaps player {state.player}")


def _wall_move(position: int, velocity: int) -> tuple[int, int]:
    """Move one ball coordinate; clamp to a wall it crossed and reflect the velocity."""
    position += velocity
    if position < 0 or position > BALL_MAX:
        return min(max(position, 0), BALL_MAX), -velocity
    return position, velocity


def _gap(ball: int, player: int) -> int:
    """Distance between the two boxes along one axis (>= 0 apart, < 0 overlapping)."""
    return max(player - (ball + BALL_SIZE), ball - (player + PLAYER_SIZE))


def _entry_axis(old_ball, old_player, ball, player) -> int:
    gaps = [_gap(b, p) for b, p in zip(old_ball, old_player)]
    motion = [abs((b - ob) - (p - op)) for b, ob, p, op in zip(ball, old_ball, player, old_player)]
    if gaps[0] >= 0 and gaps[1] >= 0:  # apart on both axes: the later entry (gap / motion) wins
        return 0 if gaps[0] * motion[1] >= gaps[1] * motion[0] else 1
    return 0 if gaps[0] >= 0 else 1


def step(state: ArenaState, action: int | str) -> ArenaState:
    """The next state: move the player, move the ball, resolve collisions (see the module docstring)."""
    dx, dy = MOVES[ACTIONS[action_index(action)]]
    _check_state(state)
    player = [min(max(p + PLAYER_SPEED * d, 0), PLAYER_MAX) for p, d in zip(state.player, (dx, dy))]
    (bx, vx), (by, vy) = (_wall_move(b, v) for b, v in zip(state.ball, state.velocity))
    ball, velocity = [bx, by], [vx, vy]
    if overlaps(ball, player):
        axis = _entry_axis(state.ball, state.player, ball, player)
        if state.ball[axis] + BALL_SIZE <= state.player[axis]:  # came from the low side (left / above)
            ball[axis] = player[axis] - BALL_SIZE
            if ball[axis] < 0:  # squeezed against the wall: the player is blocked
                ball[axis], player[axis] = 0, BALL_SIZE
            velocity[axis] = -abs(velocity[axis])
        else:  # came from the high side (right / below)
            ball[axis] = player[axis] + PLAYER_SIZE
            if ball[axis] > BALL_MAX:
                ball[axis], player[axis] = BALL_MAX, BALL_MAX - PLAYER_SIZE
            velocity[axis] = abs(velocity[axis])
    return ArenaState(player=(player[0], player[1]), ball=(ball[0], ball[1]), velocity=(velocity[0], velocity[1]))


def reset(rng: np.random.Generator) -> ArenaState:
    """A random initial state: player and ball uniformly placed, not overlapping; random velocity."""
    player = tuple(int(v) for v in rng.integers(0, PLAYER_MAX + 1, size=2))
    while True:
        ball = tuple(int(v) for v in rng.integers(0, BALL_MAX + 1, size=2))
        if not overlaps(ball, player):
            break
    velocity = tuple(int(v) for v in rng.choice(BALL_VELOCITIES, size=2))
    return ArenaState(player=player, ball=ball, velocity=velocity)


# ------------------------------------------------------------------------------------ rendering


def render(state: ArenaState) -> np.ndarray:
    """Draw a state: background, then ball, then player on top; (64, 64, 3) uint8."""
    (px, py), (bx, by) = state.player, state.ball
    if not (0 <= px <= PLAYER_MAX and 0 <= py <= PLAYER_MAX and 0 <= bx <= BALL_MAX and 0 <= by <= BALL_MAX):
        raise ValueError(f"cannot render {state}: an object is outside the canvas")
    frame = np.empty((CANVAS, CANVAS, 3), dtype=np.uint8)
    frame[:] = BACKGROUND
    frame[by:by + BALL_SIZE, bx:bx + BALL_SIZE] = BALL_COLOR
    frame[py:py + PLAYER_SIZE, px:px + PLAYER_SIZE] = PLAYER_COLOR
    return frame


def _center(position: Sequence[int], size: int) -> tuple[float, float]:
    return position[0] + (size - 1) / 2, position[1] + (size - 1) / 2


def player_center(state: ArenaState) -> tuple[float, float]:
    """Centre (x, y) of the player, the mean of its pixel coordinates: top-left + 3.5."""
    return _center(state.player, PLAYER_SIZE)


def ball_center(state: ArenaState) -> tuple[float, float]:
    """Centre (x, y) of the ball, the mean of its pixel coordinates: top-left + 1.5."""
    return _center(state.ball, BALL_SIZE)


# ------------------------------------------------------------------------------------ episodes


def episode(seed_or_rng: int | np.random.Generator, num_frames: int, actions=None) -> Episode:
    """A seeded episode of ``num_frames`` steps, with random persistent actions unless given."""
    if isinstance(seed_or_rng, np.random.Generator):
        rng = seed_or_rng
    elif isinstance(seed_or_rng, (int, np.integer)) and not isinstance(seed_or_rng, (bool, np.bool_)):
        rng = np.random.default_rng(int(seed_or_rng))
    else:
        raise TypeError(f"seed_or_rng must be an int seed or a numpy Generator, not {type(seed_or_rng).__name__}")
    if isinstance(num_frames, (bool, np.bool_)) or not isinstance(num_frames, (int, np.integer)):
        raise TypeError(f"num_frames must be an int, not {type(num_frames).__name__}")
    if num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")
    state = reset(rng)
    actions = random_actions(rng, num_frames) if actions is None else _action_array(actions, num_frames)
    states = [state]
    for action in actions:
        state = step(state, int(action))
        states.append(state)
    frames = np.stack([render(s) for s in states])
    return Episode(frames=frames, actions=actions, states=states)


def batch_episodes(seed: int, count: int, num_frames: int, with_states: bool = False) -> tuple[np.ndarray, ...]:
    """``count`` independent episodes: frames (count, T+1, 64, 64, 3) uint8 and actions (count, T)
    int64, and with ``with_states`` their states, int64 (count, T+1, 6), each row ``(player x,
    player y, ball x, ball y, ball vx, ball vy)`` (:func:`state_row`).

    Episode k is seeded by the k-th child of ``SeedSequence(seed)``, so it does not depend on ``count``.
    """
    check_positive_int("count", count)
    children = np.random.SeedSequence(seed).spawn(count)
    episodes = [episode(np.random.default_rng(child), num_frames) for child in children]
    out = np.stack([e.frames for e in episodes]), np.stack([e.actions for e in episodes])
    if with_states:
        out += (np.array([[state_row(s) for s in e.states] for e in episodes], dtype=np.int64),)
    return out


def state_row(state: ArenaState) -> tuple[int, ...]:
    """``(player x, player y, ball x, ball y, ball vx, ball vy)`` of a state; :func:`state_from_row`
    reads it back."""
    return (*state.player, *state.ball, *state.velocity)


def state_from_row(row) -> ArenaState:
    px, py, bx, by, vx, vy = (int(v) for v in row)
    return ArenaState(player=(px, py), ball=(bx, by), velocity=(vx, vy))


# ------------------------------------------------------------------------------------ detection


def _largest_blob(mask: np.ndarray) -> np.ndarray:
    """The (row, col) coordinates of the largest 8-connected component of ``mask`` (first in scan order on ties)."""
    remaining = {(int(r), int(c)) for r, c in zip(*np.nonzero(mask))}
    best: list[tuple[int, int]] = []
    for seed in sorted(remaining):
        if seed not in remaining:
            continue
        remaining.discard(seed)
        blob, queue = [seed], deque([seed])
        while queue:
            r, c = queue.popleft()
            for dr in (-1, 0, 1):
                for dc in (-1, 0, 1):
                    neighbour = (r + dr, c + dc)
                    if neighbour in remaining:
                        remaining.discard(neighbour)
                        blob.append(neighbour)
                        queue.append(neighbour)
        if len(blob) > len(best):
            best = blob
    return np.array(best, dtype=np.float64).reshape(-1, 2)


def _detect(frame: np.ndarray, color: tuple[int, int, int], tolerance: float) -> tuple[float, float] | None:
    frame = np.asarray(frame)
    if frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError(f"a frame is an (H, W, 3) RGB array on the 0..255 scale, got shape {frame.shape}")
    distance = np.linalg.norm(frame.astype(np.float64) - np.asarray(color, dtype=np.float64), axis=2)
    if np.count_nonzero(distance <= tolerance) < MIN_PIXELS:
        return None
    blob = _largest_blob(distance <= tolerance)
    if len(blob) < MIN_PIXELS:
        return None
    cy, cx = blob.mean(axis=0)
    return float(cx), float(cy)


def detect_player(frame: np.ndarray, tolerance: float = COLOR_TOLERANCE) -> tuple[float, float] | None:
    """Centre (x, y) of the player in a frame (same convention as :func:`player_center`), or None."""
    return _detect(frame, PLAYER_COLOR, tolerance)


def detect_ball(frame: np.ndarray, tolerance: float = COLOR_TOLERANCE) -> tuple[float, float] | None:
    """Centre (x, y) of the ball in a frame (same convention as :func:`ball_center`), or None."""
    return _detect(frame, BALL_COLOR, tolerance)


def keeps_ball(first: np.ndarray, frame: np.ndarray) -> bool:
    """Whether a frame a world generated ahead may be shown, given its block's first frame (a
    session's ``keep``, :class:`visualspec.video.WorldSession`): ``detect_ball(first) is None or
    detect_ball(frame) is not None``. Speculation may not lose a ball the frame drawn without it
    shows; the same detector scores rollouts (:func:`visualspec.eval.video.rollout_player_error`)."""
    return detect_ball(first) is None or detect_ball(frame) is not None
