"""The run directory: --overwrite and --resume, damaged checkpoints set aside, a changed model refused, kill -9
repaired."""

import os
import signal

import pytest
import torch
from cli_helpers import last_step, run_of, train
from safetensors.torch import save_model
from tiny import run_trainer, step_of, tiny_config

from transformer import checkpoint, config_file
from transformer.errors import TrainError
from transformer.storage import manifest
from transformer.training import run_dir


def test_existing_run_needs_resume_or_overwrite(tmp_path):
    cfg = tiny_config(tmp_path, train={"max_steps": 3})
    run_trainer(cfg)
    with pytest.raises(TrainError, match="already exists; pass --resume"):
        run_trainer(cfg)
    assert run_trainer(cfg, overwrite=True).state.step == 3


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_folder_of_the_users_is_never_emptied(tmp_path, overwrite):
    """A run name that matches a folder holding the user's files is refused, with or without --overwrite."""
    cfg = tiny_config(tmp_path, train={"max_steps": 3})
    cfg.out_dir.mkdir(parents=True)
    (cfg.out_dir / "ch1.tex").write_text("work\n")
    (cfg.out_dir / "log.jsonl").write_text("{}\n")  # a tfm name beside it changes nothing
    with pytest.raises(TrainError, match=r"holds files tfm did not write \(ch1.tex\), which it never deletes"):
        run_trainer(cfg, overwrite=overwrite)
    assert sorted(p.name for p in cfg.out_dir.iterdir()) == ["ch1.tex", "log.jsonl"]
    assert (cfg.out_dir / "ch1.tex").read_text() == "work\n"


def test_overwrite_removes_what_tfm_wrote_and_keeps_the_folder(tmp_path):
    cfg = tiny_config(tmp_path, train={"max_steps": 3})
    run_trainer(cfg)
    (cfg.out_dir / ".best.tmp-999").mkdir()  # what a killed save leaves: a folder holding tfm's record from the start
    manifest.create(cfg.out_dir / ".best.tmp-999", manifest.PARTIAL)
    (cfg.out_dir / "avg2").mkdir()
    inode = cfg.out_dir.stat().st_ino
    assert run_trainer(cfg, overwrite=True).state.step == 3
    assert cfg.out_dir.stat().st_ino == inode
    assert not (cfg.out_dir / "avg2").exists() and not (cfg.out_dir / ".best.tmp-999").exists()


USERS_FILES = ["checkpoints/notes.txt", "best/notes.txt", "tensorboard/notes.txt", "checkpoints/step_3/notes.txt"]


@pytest.mark.parametrize("where", [*USERS_FILES, "config.yaml"])
def test_overwrite_refuses_a_run_holding_a_users_file_at_any_depth_and_changes_nothing(tmp_path, where):
    """A note left in a checkpoint, in TensorBoard's folder, or a config.yaml the user edited: --overwrite names it
    and deletes nothing."""
    cfg = tiny_config(tmp_path, train={"max_steps": 3})
    run_trainer(cfg)
    mine = cfg.out_dir / where
    mine.parent.mkdir(exist_ok=True)
    mine.write_text("# my own notes\n" + (mine.read_text() if mine.exists() else ""))
    before = sorted(p.relative_to(cfg.out_dir) for p in cfg.out_dir.rglob("*"))
    with pytest.raises(TrainError, match=f"holds {mine}, which tfm did not write"):
        run_trainer(cfg, overwrite=True)
    assert sorted(p.relative_to(cfg.out_dir) for p in cfg.out_dir.rglob("*")) == before
    assert mine.read_text().startswith("# my own notes\n")


@pytest.mark.parametrize("where", USERS_FILES)
def test_starting_afresh_refuses_a_users_file_inside_the_run_directory(tmp_path, where):
    """No checkpoint yet (a folder made by hand, or a start that was interrupted): starting afresh would wipe the
    run directory, so a file of the user's anywhere in it is refused, without --overwrite."""
    cfg = tiny_config(tmp_path, train={"max_steps": 3})
    mine = cfg.out_dir / where
    mine.parent.mkdir(parents=True)
    mine.write_text("mine\n")
    with pytest.raises(TrainError, match=f"holds {mine}, which tfm did not write"):
        run_trainer(cfg)
    assert mine.read_text() == "mine\n"


def test_files_of_the_users_in_checkpoints_survive_training(tmp_path):
    """Pruning an old step checkpoint deletes tfm's files in it and keeps the user's note where it is."""
    cfg = tiny_config(tmp_path, train={"max_steps": 3, "save_every": 1, "keep_last": 1})
    run_trainer(cfg)
    (cfg.out_dir / "checkpoints" / "step_3" / "notes.txt").write_text("step 3 looked good\n")
    run_trainer(tiny_config(tmp_path, train={"max_steps": 5, "save_every": 1, "keep_last": 1}), resume=True)
    assert sorted(p.name for p in (cfg.out_dir / "checkpoints" / "step_3").iterdir()) == ["notes.txt"]
    assert [p.name for p in checkpoint.step_dirs(cfg.out_dir)] == ["step_5"]


def test_a_run_written_before_tfm_recorded_its_files_resumes_and_is_never_wiped(tmp_path):
    cfg = tiny_config(tmp_path, train={"max_steps": 3, "save_every": 3})
    run_trainer(cfg)
    for record in cfg.out_dir.rglob(manifest.MANIFEST):
        record.unlink()
    assert run_trainer(tiny_config(tmp_path, train={"max_steps": 6, "save_every": 3}), resume=True).state.step == 6
    with pytest.raises(TrainError, match="or an earlier tfm wrote without recording it"):
        run_trainer(cfg, overwrite=True)


@pytest.mark.parametrize(
    "changes, refusal",
    [
        ({"data": {"max_len": 1}}, "no training pairs left"),  # every pair is longer
        ({"train": {"batch_tokens": 1}}, r"train.batch_tokens=1 holds no training pair .* at least \d+"),
    ],
)
def test_a_start_with_nothing_to_train_leaves_no_run_directory(tmp_path, changes, refusal):
    cfg = tiny_config(tmp_path / "runs", **changes)
    with pytest.raises(TrainError, match=refusal):
        run_trainer(cfg)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [".cache"]  # the token cache, shared by runs


def test_a_run_directory_in_use_is_refused_naming_the_holder(tmp_path):
    cfg = tiny_config(tmp_path, train={"max_steps": 3})
    with run_dir.locked(cfg.out_dir):  # as a first tfm train holds it while it runs
        with pytest.raises(TrainError, match=rf"is in use by another tfm train \(PID {os.getpid()}\)"):
            run_trainer(cfg)
        with pytest.raises(TrainError, match="in use"):
            run_trainer(cfg, overwrite=True)
    assert run_trainer(cfg).state.step == 3  # released when its holder ends


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path):
    cfg = tiny_config(tmp_path, train={"max_steps": 3})
    cfg.out_dir.mkdir(parents=True)
    (cfg.out_dir / run_dir.LOCK).write_text("999999\n")  # its process is gone, and the kernel's lock with it
    assert run_trainer(cfg).state.step == 3
    assert (cfg.out_dir / run_dir.LOCK).read_text() == f"{os.getpid()}\n"


def test_resume_refuses_changed_architecture(tmp_path):
    run_trainer(tiny_config(tmp_path, train={"max_steps": 3}))
    changed = tiny_config(tmp_path, model={"d_ff": 128}, train={"max_steps": 6})
    with pytest.raises(TrainError, match=r"model.d_ff \(64 -> 128\)"):
        run_trainer(changed, resume=True)


def test_resume_skips_a_damaged_newest_checkpoint_and_keeps_it_aside(tmp_path):
    """A truncated newest checkpoint: resume goes on from the one before; the damaged one is kept, renamed."""
    cfg = tiny_config(tmp_path, train={"max_steps": 4, "save_every": 2, "keep_last": 3})
    run_trainer(cfg)
    older, newest = checkpoint.step_dirs(cfg.out_dir)[-2:]
    weights = newest / checkpoint.WEIGHTS
    weights.write_bytes(weights.read_bytes()[:100])
    messages = []
    more = tiny_config(tmp_path, train={"max_steps": 6, "save_every": 2, "keep_last": 3})
    assert run_trainer(more, resume=True, log=messages.append).state.step == 6
    assert f"resumed from {older} at step 2" in messages
    aside = newest.with_name(f"damaged-{newest.name}")
    assert aside.is_dir() and (aside / checkpoint.WEIGHTS).stat().st_size == 100
    assert any("is damaged" in m and str(aside) in m for m in messages)


def test_resume_sets_aside_a_checkpoint_whose_weights_went_non_finite(tmp_path):
    cfg = tiny_config(tmp_path, train={"max_steps": 6, "save_every": 3, "eval_every": 1000})
    run_trainer(cfg)
    newest = cfg.out_dir / "checkpoints" / "step_6"
    loaded = checkpoint.load(newest)
    with torch.no_grad():
        loaded.model.generator.weight[0, 0] = float("inf")
    save_model(loaded.model, str(newest / checkpoint.WEIGHTS))
    messages = []
    resumed = run_trainer(
        tiny_config(tmp_path, train={"max_steps": 9, "save_every": 3}), resume=True, log=messages.append
    )
    assert resumed.state.step == 9 and any("step_6 is damaged" in m and "non-finite" in m for m in messages)
    assert (cfg.out_dir / "checkpoints" / "damaged-step_6").is_dir()


def test_resume_with_only_damaged_checkpoints_is_a_clear_error(tmp_path):
    cfg = tiny_config(tmp_path, train={"max_steps": 2, "save_every": 2})
    run_trainer(cfg)
    for path in checkpoint.step_dirs(cfg.out_dir):
        (path / checkpoint.TRAINER).write_bytes(b"not a checkpoint")
    with pytest.raises(TrainError, match="every checkpoint in .* is damaged"):
        run_trainer(tiny_config(tmp_path, train={"max_steps": 4}), resume=True)


def test_kill_9_then_resume_continues_from_the_last_complete_checkpoint(tmp_path):
    run = run_of(tmp_path)
    proc = train(tmp_path, "--set=train.save_every=2")
    proc.wait_for(lambda: checkpoint.step_dirs(run) and last_step(run) >= 5, "checkpoints and progress")
    proc.p.kill()
    assert proc.finish() == -signal.SIGKILL
    last = checkpoint.step_dirs(run)[-1]
    n = step_of(last)
    # What a kill in the middle of a save leaves: a half-written temporary directory. Loading ignores it.
    leftover = run / "checkpoints" / f".{checkpoint.STEP_PREFIX}{n + 2}.tmp-999999"
    leftover.mkdir(exist_ok=True)
    manifest.create(leftover, manifest.PARTIAL)
    (leftover / checkpoint.WEIGHTS).write_bytes(b"\x00" * 10)
    assert checkpoint.newest(run.parent) == last and checkpoint.step_dirs(run)[-1] == last
    checkpoint.load(last)

    messages: list[str] = []  # what `tfm train --resume` does, run here from the run's saved config
    cfg = config_file.load(run / checkpoint.CONFIG, [f"train.max_steps={n + 2}"])
    step = run_trainer(cfg, resume=True, log=messages.append).state.step
    assert f"resumed from {last} at step {n}" in messages and step == n + 2
    assert any(f"removed {leftover.name}" in m for m in messages)
    assert not [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]


def test_a_damaged_record_leaves_an_intact_run_resumable_and_a_folder_in_its_place_is_one_line(tmp_path):
    """.tfm-files that is not UTF-8 JSON is tfm's own record, damaged: the run's files are unknown, never foreign, so
    --resume goes on; a folder named .tfm-files is refused in one line that says what to do, and nothing changes."""
    cfg = tiny_config(tmp_path, train={"max_steps": 2, "save_every": 2})
    run_trainer(cfg)
    record = cfg.out_dir / manifest.MANIFEST
    record.write_bytes(b"\xff\xfe\x00 not a record")
    assert run_trainer(tiny_config(tmp_path, train={"max_steps": 3, "save_every": 3}), resume=True).state.step == 3
    record.unlink()
    record.mkdir()
    before = sorted(p.name for p in cfg.out_dir.rglob("*"))
    with pytest.raises(TrainError, match=r"its record \.tfm-files is a folder, which tfm never makes; move it out"):
        run_trainer(tiny_config(tmp_path, train={"max_steps": 4}), resume=True)
    assert sorted(p.name for p in cfg.out_dir.rglob("*")) == before


def test_a_refused_start_in_an_empty_folder_of_the_users_leaves_it_as_it_was(tmp_path):
    """The folder stays; the lock, the record and the tokenizer the start wrote go."""
    mine = tmp_path / "tiny"
    mine.mkdir()
    with pytest.raises(TrainError, match="holds no training pair"):
        run_trainer(tiny_config(tmp_path, train={"batch_tokens": 2}))
    assert mine.is_dir() and list(mine.iterdir()) == []
