"""A checkpoint is data: a trainer resuming from a file never runs what the file's pickle names."""

from __future__ import annotations

import io
import pickle

import pytest

torch = pytest.importorskip("torch")

from raybridge.trainer import Trainer  # noqa: E402

CONFIG = {"global_batch": 4, "channels": 8, "blocks": 1, "image_size": 8, "lr": 0.05}


class RunsCode:
    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path(__import__('os').environ['TESSERA_PWNED']).write_text('ran')",))


def test_a_trainer_resumes_from_its_own_state_and_refuses_a_pickle_that_runs_code(tmp_path, monkeypatch):
    trainer = Trainer("t0", "raybridge.examples.resnet:build", CONFIG)
    trainer.step, trainer.losses = 7, {7: 0.5}
    other = Trainer("t1", "raybridge.examples.resnet:build", CONFIG)
    assert other.load(trainer.state()) == 7 and other.losses == {7: 0.5}
    marker = tmp_path / "pwned"
    monkeypatch.setenv("TESSERA_PWNED", str(marker))
    buf = io.BytesIO()
    torch.save({"step": 8, "model": RunsCode(), "optimizer": {}, "losses": {}}, buf)
    with pytest.raises(pickle.UnpicklingError):
        other.load(buf.getvalue())
    assert not marker.exists() and other.step == 7
