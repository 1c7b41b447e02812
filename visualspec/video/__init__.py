"""Interactive video: a next-frame world model played frame by frame, with Next-Frame Diffusion's
action-conditioned speculation (:class:`WorldSession`), several worlds stepped in one batch
(:func:`step_together`)."""

from .session import VideoStats, WorldSession, denoise_frames, rollout, step_together, time_grid

__all__ = ["WorldSession", "VideoStats", "denoise_frames", "rollout", "step_together", "time_grid"]
