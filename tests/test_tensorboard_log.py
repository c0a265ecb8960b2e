"""TensorBoard events of a run: the scalars and steps of log.jsonl and the run's config, read back with
tensorboard's own reader; a resume replaces what a crashed run logged past its checkpoint; the switch."""

import sys

import pytest
import yaml
from disks import mount_read_only, unmount
from events import INSTALLED, assert_events_match_log, read_events, scalars
from tiny import run_trainer, tiny_config
from typer.testing import CliRunner

from cli.main import app
from transformer.errors import TrainError
from transformer.training import tensorboard_log
from transformer.training.bookkeeping import Books
from transformer.training.tensorboard_log import CONFIG_TAG, FOLDER, TensorBoardLog

TEXT = f"{CONFIG_TAG}/text_summary"  # where TensorBoard's text plugin keeps a text
needs_tensorboard = pytest.mark.skipif(not INSTALLED, reason="tensorboard is not installed (pip install tensorboard)")


def _configs(events):
    """The config texts by step, as YAML read back."""
    texts = events.Tensors(TEXT)
    return {e.step: yaml.safe_load(e.tensor_proto.string_val[0].decode()) for e in texts}


@needs_tensorboard
def test_events_hold_the_scalars_of_log_jsonl_and_the_config(tiny_run):
    run = tiny_run.run_dir
    assert_events_match_log(run)
    events = read_events(run)
    assert [step for step, _ in scalars(events, "valid/bleu")] == [3, 6]
    assert _configs(events) == {1: yaml.safe_load((run / "config.yaml").read_text())}


@needs_tensorboard
def test_each_record_is_on_disk_before_the_next(tmp_path):
    log = TensorBoardLog(tmp_path, 1, "name: run\n")
    log.write({"step": 1, "kind": "train", "loss": 2.5, "lr": 1e-3})
    log.write({"step": 1, "kind": "end", "seconds": 3.0})  # a kind without scalars
    events = read_events(tmp_path)  # while the file is open, as a kill -9 would leave it
    assert (scalars(events, "train/loss"), scalars(events, "train/lr")) == ([(1, 2.5)], [(1, pytest.approx(1e-3))])
    assert events.Tags()["scalars"] == ["train/loss", "train/lr"]
    log.close()


@needs_tensorboard
def test_a_resume_replaces_what_a_crashed_run_logged_past_its_checkpoint(tmp_path, monkeypatch):
    """A crash after update 5 leaves step_3 and events up to 5; the resumed run (another peak_lr) logs 4, 5 and 6
    again, and TensorBoard shows each step once, with the values log.jsonl last logged."""
    cfg = tiny_config(tmp_path, train={"save_every": 3, "eval_every": 2})
    real = Books._forecast

    def crash_after_5(self):  # once update 6 is queued: update 5 is booked (logged) by then
        if self.state.step == 6:
            raise RuntimeError("crash")
        real(self)

    monkeypatch.setattr(Books, "_forecast", crash_after_5)
    with pytest.raises(RuntimeError, match="crash"):
        run_trainer(cfg)
    assert [step for step, _ in scalars(read_events(cfg.out_dir), "train/loss")] == [1, 2, 3, 4, 5]  # on disk

    monkeypatch.setattr(Books, "_forecast", real)
    resumed = tiny_config(tmp_path, train={"save_every": 3, "eval_every": 2, "peak_lr": 5e-4})
    assert run_trainer(resumed, resume=True).state.step == 6
    assert_events_match_log(cfg.out_dir)
    events = read_events(cfg.out_dir)
    assert [step for step, _ in scalars(events, "train/loss")] == [1, 2, 3, 4, 5, 6]
    assert [step for step, _ in scalars(events, "valid/loss")] == [2, 4, 6]
    assert {step: c["train"]["peak_lr"] for step, c in _configs(events).items()} == {1: 1e-3, 4: 5e-4}


@needs_tensorboard
def test_overwrite_removes_the_events_and_the_switch_turns_them_off(tmp_path):
    cfg = tiny_config(tmp_path, train={"max_steps": 1})
    run_trainer(cfg)
    assert (cfg.out_dir / FOLDER).is_dir()
    run_trainer(tiny_config(tmp_path, train={"max_steps": 1, "tensorboard": False}), overwrite=True)
    assert not (cfg.out_dir / FOLDER).exists() and (cfg.out_dir / "log.jsonl").is_file()


@pytest.fixture
def no_tensorboard(monkeypatch):
    """As if the tensorboard package were not installed: torch's SummaryWriter cannot be imported."""
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)


@pytest.mark.parametrize("setting, writes", [(None, False), (False, False)])
def test_without_tensorboard_null_and_false_write_no_events(no_tensorboard, setting, writes):
    assert tensorboard_log.wanted(setting) is writes


@pytest.mark.parametrize("setting, writes", [(None, True), (True, True), (False, False)])
@needs_tensorboard
def test_with_tensorboard_null_and_true_write_events(setting, writes):
    assert tensorboard_log.wanted(setting) is writes


def test_true_without_tensorboard_is_refused_in_one_line(no_tensorboard, tmp_path):
    cfg = tiny_config(tmp_path, train={"tensorboard": True})
    with pytest.raises(TrainError, match=r"tensorboard package is not installed; pip install tensorboard"):
        run_trainer(cfg)
    assert not cfg.out_dir.exists()  # refused before anything was written
    r = CliRunner().invoke(
        app, ["train", "--config", "quickstart", f"--set=run_dir={tmp_path}", "--set=train.tensorboard=true"]
    )
    assert (
        r.exit_code == 2 and r.stderr.startswith("error: train.tensorboard: true, but") and "Traceback" not in r.stderr
    )


@needs_tensorboard
def test_a_read_only_events_folder_on_resume_is_one_line_and_the_run_stays_resumable(tmp_path):
    cfg = tiny_config(tmp_path, train={"max_steps": 2, "save_every": 2})
    run_trainer(cfg)
    events = cfg.out_dir / FOLDER
    before = sorted(p.name for p in events.iterdir())
    if not mount_read_only(events):
        pytest.skip("cannot mount a read-only folder here")
    try:
        with pytest.raises(TrainError, match=r"tensorboard cannot be written .*set train.tensorboard: false"):
            run_trainer(tiny_config(tmp_path, train={"max_steps": 3}), resume=True)
    finally:
        unmount(events)
    assert sorted(p.name for p in events.iterdir()) == before
    assert run_trainer(tiny_config(tmp_path, train={"max_steps": 3}), resume=True).state.step == 3
