"""Checkpoint averaging: the mean of the tensors, written as a checkpoint that loads and translates."""

from __future__ import annotations

import shutil

import pytest
import torch
from typer.testing import CliRunner

from cli.main import app
from transformer import checkpoint
from transformer.errors import CheckpointError, OutputError
from transformer.storage import manifest
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
    assert (
        r.exit_code == 2
        and "thesis.tex', which tfm did not write" in r.output
        and (run / "avg2" / "thesis.tex").is_file()
    )


def test_asking_for_more_checkpoints_than_kept_is_refused(run, tmp_path):
    with pytest.raises(CheckpointError, match="keeps only 2 step checkpoints .*use --last 2"):
        average(run, 5, tmp_path / "avg5")
    with pytest.raises(CheckpointError, match="no step checkpoints"):
        average(tmp_path, 1, tmp_path / "out")


@pytest.mark.parametrize("where", ["checkpoints/step_6", "checkpoints/new", "."])
def test_the_average_never_lands_on_the_run_or_its_resumable_checkpoints(run, where):
    with pytest.raises(CheckpointError, match="would replace the run or one of its resumable checkpoints"):
        average(run, 2, run / where, overwrite=True)


def test_the_average_never_replaces_a_trained_checkpoint_even_with_overwrite(run, tmp_path):
    """The run's best/ (or any checkpoint tfm train wrote) is no earlier average: --overwrite does not reach it."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    before = (copy / "best" / checkpoint.WEIGHTS).read_bytes()
    with pytest.raises(OutputError, match="is a checkpoint tfm wrote, not an earlier average"):
        average(copy, 2, copy / "best", overwrite=True)
    assert (copy / "best" / checkpoint.WEIGHTS).read_bytes() == before


def test_a_killed_average_leaves_nothing_the_next_one_does_not_remove(run, tmp_path):
    killed = tmp_path / ".avg2.tmp-4194305"  # what a SIGKILL leaves: its record made first, then some files
    killed.mkdir()
    manifest.create(killed, manifest.PARTIAL)
    (killed / checkpoint.WEIGHTS).write_bytes(b"\0" * 100)
    average(run, 2, tmp_path / "avg2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["avg2"]


def test_a_full_disk_is_one_line_that_does_not_send_the_user_to_resume(run, small_disk):
    (small_disk / "filler").write_bytes(b"\0" * 500_000)
    r = CliRunner().invoke(app, ["average", str(run), "--last", "2", "--output", str(small_disk / "avg2")])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "disk full while saving" in r.stderr and "run tfm average again" in r.stderr and "--resume" not in r.stderr
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


def test_a_multilingual_run_averages_into_a_checkpoint_that_translates_each_direction(tiny_tagged_run, tmp_path):
    from transformer.decoding.translator import TranslateOptions, Translator

    path = average(tiny_tagged_run.run_dir, 2, tmp_path / "avg2")
    translator = Translator.from_checkpoint(path, TranslateOptions("cpu", beam=1))
    assert translator.targets == ["de", "en"]
    for target in ("de", "en"):
        assert len(list(translator.to(target).translate(["Ein Hund.", "A dog."]))) == 2


def test_a_step_of_another_run_among_the_checkpoints_is_refused_naming_what_differs(tmp_path):
    """A step checkpoint copied in from a run of another seed: its weights are another model's, so the mean would be
    noise; refused before anything is written."""
    from tiny import run_trainer, tiny_config

    ours = run_trainer(tiny_config(tmp_path / "a", train={"max_steps": 4, "save_every": 2})).run_dir
    theirs = run_trainer(tiny_config(tmp_path / "b", seed=2, train={"max_steps": 6, "save_every": 6})).run_dir
    shutil.copytree(theirs / "checkpoints" / "step_6", ours / "checkpoints" / "step_6")
    with pytest.raises(CheckpointError, match=r"come from different runs \(seed: 1 and 2\)"):
        average(ours, 3, tmp_path / "avg")
    assert not (tmp_path / "avg").exists()


def test_an_output_that_is_a_symlink_loop_is_one_line(run, tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(CheckpointError, match="is a symlink loop"):
        average(run, 2, loop)


def test_a_run_of_a_deep_encoder_and_a_shallow_decoder_averages(tmp_path):
    from tiny import run_trainer, tiny_config

    cfg = tiny_config(
        tmp_path, model={"encoder_layers": 2, "decoder_layers": 1}, train={"max_steps": 4, "save_every": 2}
    )
    run = run_trainer(cfg).run_dir
    loaded = checkpoint.load(average(run, 2, tmp_path / "avg"))
    assert (len(loaded.model.encoder.layers), len(loaded.model.decoder.layers)) == (2, 1)
