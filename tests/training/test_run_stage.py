"""The stage loop every recipe runs: Ctrl-C keeps the work and says how to go on."""

import json
import os
import signal

import pytest
import torch

from visualspec.tools.cli import main
from visualspec.training.common import run_stage


def stage(folder, steps=6, interrupts=None, checkpoint_seconds=0.0):
    """A tiny stage of ``steps`` SGD steps; at step k it sends itself interrupts[k] SIGINTs."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []

    def step_fn(step):
        for _ in range((interrupts or {}).get(step, 0)):
            os.kill(os.getpid(), signal.SIGINT)
        x = torch.ones(4, 3) * (step + 1)
        loss = (model(x) - 1).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen.append(step)
        return {"loss": loss.item()}

    run_stage("tiny", folder, {"model": model}, opt, steps, step_fn, checkpoint_seconds=checkpoint_seconds,
              progress=False)
    return model, seen


def test_ctrl_c_finishes_the_step_saves_it_and_the_rerun_ends_where_an_unbroken_run_does(tmp_path):
    with pytest.raises(KeyboardInterrupt, match=r"tiny: saved at step 3 of 6 in .*run the same command again"):
        stage(tmp_path / "a", interrupts={2: 1}, checkpoint_seconds=1e9)  # no timed checkpoint would save it
    assert json.loads((tmp_path / "a" / "meta.json").read_text())["step"] == 3
    resumed, seen = stage(tmp_path / "a")
    assert seen == [3, 4, 5]
    unbroken, _ = stage(tmp_path / "b")
    assert all(torch.equal(a, b) for a, b in zip(resumed.state_dict().values(), unbroken.state_dict().values()))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back


def test_a_second_ctrl_c_stops_at_once_and_names_the_last_checkpoint(tmp_path):
    with pytest.raises(KeyboardInterrupt, match="stopped at once; nothing saved yet"):
        stage(tmp_path / "a", interrupts={1: 2}, checkpoint_seconds=1e9)
    assert not (tmp_path / "a" / "meta.json").exists()
    with pytest.raises(KeyboardInterrupt, match=r"stopped at once; the last checkpoint, step 4 of 6, is in"):
        stage(tmp_path / "b", interrupts={4: 2})  # a checkpoint after every step: 4 steps were saved


def test_the_first_checkpoint_comes_within_the_first_minute(tmp_path, monkeypatch):
    import visualspec.training.common as common

    monkeypatch.setattr(common, "FIRST_CHECKPOINT_SECONDS", 0.0)  # the first minute, compressed
    with pytest.raises(KeyboardInterrupt, match="stopped at once; the last checkpoint, step 1 of 6"):
        stage(tmp_path / "a", interrupts={2: 2}, checkpoint_seconds=1e9)  # only the first is due, after step 0


def test_a_training_command_stopped_by_ctrl_c_prints_one_line(tmp_path, monkeypatch, capsys):
    import visualspec.training.text as text

    def interrupted(out, work_dir):
        raise KeyboardInterrupt(f"target: saved at step 40 of 900 in {work_dir}; run the same command again to resume")

    monkeypatch.setattr(text, "train_text_pair", interrupted)
    assert main(["train-text", "--out", str(tmp_path / "o"), "--work-dir", str(tmp_path / "w")]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"interrupted: target: saved at step 40 of 900 in {tmp_path / 'w'}; run the same command again "
                   f"to resume"]
