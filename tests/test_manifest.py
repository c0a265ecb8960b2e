"""The record of what tfm wrote: a file is tfm's by its name in its folder's manifest and by its content, at any
depth; everything else is the user's."""

import errno
import json
import os

import pytest

from transformer.storage import manifest


def run_like(folder):
    """A folder recorded as a run holds: a file, a growing log, a plain sub-folder and a unit with its own record."""
    folder.mkdir()
    manifest.create(folder, "run", folders=["tensorboard"], units=[r"step_\d+"])
    (folder / "config.yaml").write_text("seed: 1\n")
    (folder / "log.jsonl").write_text('{"step": 1}\n')
    (folder / "tensorboard").mkdir()
    (folder / "tensorboard" / "events").write_bytes(b"ev")
    manifest.record(folder, "config.yaml", "tensorboard/events")
    manifest.record(folder, "log.jsonl", grows=True)
    (folder / "step_3").mkdir()
    (folder / "step_3" / "model.bin").write_bytes(b"w")
    manifest.write(folder / "step_3", manifest.survey(folder / "step_3", "checkpoint"))
    return folder


def test_what_tfm_wrote_is_its_own_and_nothing_is_foreign(tmp_path):
    run = run_like(tmp_path / "run")
    with open(run / "log.jsonl", "a") as f:  # a log tfm goes on appending to stays its own
        f.write('{"step": 2}\n')
    (run / ".lock").write_text("1234\n")
    assert manifest.first_foreign(run) is None
    assert manifest.is_own(run / "config.yaml") and not manifest.is_own(run / "nothing")


def test_a_file_changed_or_added_at_any_depth_is_foreign(tmp_path):
    for change in ["config.yaml", "tensorboard/mine", "step_3/notes.txt", "step_3/model.bin", "extra/x", "log.jsonl"]:
        run = run_like(tmp_path / change.replace("/", "_"))
        path = run / change
        path.parent.mkdir(exist_ok=True)
        if change == "log.jsonl":
            path.write_text('{"step": 9}\n')  # what tfm recorded is no longer there: rewritten, not appended to
        else:
            path.write_bytes(b"the user's" + (path.read_bytes() if path.exists() else b""))
        expected = run / "extra" if change == "extra/x" else path
        assert manifest.first_foreign(run) == expected, change


def test_same_size_and_time_but_other_bytes_is_caught_once_the_time_differs(tmp_path):
    run = run_like(tmp_path / "run")
    st = (run / "config.yaml").stat()
    (run / "config.yaml").write_text("seed: 2\n")  # same size
    os.utime(run / "config.yaml", ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert manifest.first_foreign(run) == run / "config.yaml"


def test_a_folder_without_a_record_is_the_users_and_links_are_never_tfms(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    assert manifest.first_foreign(mine) is None  # empty: nothing to lose
    (mine / "a.txt").write_text("a")
    assert manifest.first_foreign(mine) == mine / "a.txt"
    run = run_like(tmp_path / "run")
    (run / "step_4").symlink_to(mine)
    assert manifest.first_foreign(run) == run / "step_4"
    (run / "step_4").unlink()
    (run / ".lock").write_text("my secrets\n")  # not a process id: not tfm's lock
    assert manifest.first_foreign(run) == run / ".lock"


def test_discard_deletes_tfms_files_and_keeps_the_users(tmp_path):
    run = run_like(tmp_path / "run")
    (run / "step_3" / "notes.txt").write_text("mine")
    assert manifest.discard(run / "step_3") == [run / "step_3" / "notes.txt"]
    assert [p.name for p in (run / "step_3").iterdir()] == ["notes.txt"]
    manifest.discard(run)
    assert sorted(p.name for p in run.iterdir()) == ["step_3"]


def test_a_record_that_cannot_be_written_names_itself_and_leaves_nothing(tmp_path, monkeypatch):
    """A full disk fails json.dump without a file name; the error names the record, for the command's one line."""

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(json, "dump", full)
    with pytest.raises(OSError) as e:
        manifest.create(tmp_path, "run")
    assert e.value.filename == str(tmp_path / manifest.MANIFEST) and list(tmp_path.iterdir()) == []
