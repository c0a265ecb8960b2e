"""Checkpoint averaging: the mean of the tensors, written as a checkpoint that loads and translates."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from cli.main import app
from transformer import checkpoint
from transformer.errors import CheckpointError
from transformer.training.average import average


@pytest.fixture(scope="module")
def run(tiny_run):
    """The shared tiny run: two step checkpoints, step_3 and step_6."""
    return tiny_run.run_dir


def test_average_of_two_is_the_mean_of_their_tensors(run, tmp_path):
    out = average(run, 2, tmp_path / "avg2")
    a, b = (checkpoint.load(p).model.state_dict() for p in checkpoint.step_dirs(run))
    avg = checkpoint.load(out).model.state_dict()
    assert not torch.equal(a["encoder.layers.0.ff.w_1.weight"], b["encoder.layers.0.ff.w_1.weight"])
    for k in avg:
        assert torch.equal(avg[k], ((a[k].double() + b[k].double()) / 2).to(a[k].dtype)), k
    assert checkpoint.load(out).meta["averaged"] == ["step_3", "step_6"]


def test_cli_average_then_translate(run):
    cli = CliRunner()
    r = cli.invoke(app, ["average", str(run), "--last", "2"])
    assert r.exit_code == 0, r.output
    assert (run / "avg2" / "model.safetensors").is_file()
    r = cli.invoke(app, ["translate", "Ein Mann fährt Fahrrad.", "--checkpoint", str(run / "avg2"), "--device", "cpu"])
    assert r.exit_code == 0, r.output
    r = cli.invoke(app, ["average", str(run), "--last", "2"])
    assert r.exit_code == 2 and "already exists; pass --overwrite" in r.output
    (run / "avg2" / "eval").mkdir()  # tfm eval's reports: replaced with the average they scored
    assert cli.invoke(app, ["average", str(run), "--last", "2", "--overwrite"]).exit_code == 0
    (run / "avg2" / "thesis.tex").write_text("the user's\n", encoding="utf-8")
    r = cli.invoke(app, ["average", str(run), "--last", "2", "--overwrite"])
    assert r.exit_code == 2 and "holds thesis.tex" in r.output and (run / "avg2" / "thesis.tex").is_file()


def test_asking_for_more_checkpoints_than_kept_is_refused(run, tmp_path):
    with pytest.raises(CheckpointError, match="keeps only 2 step checkpoints .*use --last 2"):
        average(run, 5, tmp_path / "avg5")
    with pytest.raises(CheckpointError, match="no step checkpoints"):
        average(tmp_path, 1, tmp_path / "out")


@pytest.mark.parametrize("where", ["checkpoints/step_6", "checkpoints/new", "."])
def test_the_average_never_lands_on_the_run_or_its_resumable_checkpoints(run, where):
    with pytest.raises(CheckpointError, match="would replace the run or one of its resumable checkpoints"):
        average(run, 2, run / where, overwrite=True)
