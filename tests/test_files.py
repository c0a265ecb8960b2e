"""Atomic writing: what an interrupted save or removal leaves behind is repaired by clean_partial."""

import os
import stat

import pytest
from tiny import tiny_config

from transformer import checkpoint
from transformer.errors import OutputError
from transformer.files import atomic_dir, clean_partial
from transformer.model.transformer import build_model
from transformer.text.tokenizer import Tokenizer


def test_interrupted_save_and_prune_are_repaired_on_the_next_start(tmp_path):
    """Kill between save's two renames: only ``.best.old-PID`` is left; it is put back, temporaries removed."""
    cfg = tiny_config(tmp_path)
    tok = Tokenizer.train(["Ein Mann fährt Fahrrad."] * 20, vocab_size=cfg.tokenizer.vocab_size)
    model = build_model(cfg.model, tok.vocab_size, tok.pad_id)
    folder = tmp_path / "run"
    best = checkpoint.save(folder / "best", cfg, tok, model, {"step": 4})
    os.replace(best, folder / ".best.old-4242")
    stale = checkpoint.save(folder / "step_2", cfg, tok, model, {"step": 2})
    os.replace(stale, folder / ".step_2.old-4242")
    checkpoint.save(folder / "step_2", cfg, tok, model, {"step": 3})  # its replacement did land
    (folder / ".step_9.tmp-4242").mkdir()
    done = clean_partial(folder)
    assert done == ["restored best from .best.old-4242", "removed .step_2.old-4242", "removed .step_9.tmp-4242"]
    assert checkpoint.load(folder / "best").meta["step"] == 4 and checkpoint.load(folder / "step_2").meta["step"] == 3
    assert sorted(p.name for p in folder.iterdir()) == ["best", "step_2"]


def test_a_directory_may_replace_a_file_and_leaves_nothing_beside_it(tmp_path):
    target = tmp_path / "out"
    target.write_text("old", encoding="utf-8")
    with atomic_dir(target) as tmp:
        (tmp / "model.bin").write_bytes(b"new")
    assert (target / "model.bin").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_device_is_never_replaced_by_a_directory():
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with pytest.raises(FileExistsError, match="not replaced"):
        with atomic_dir("/dev/full"):
            pass
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_users_folder_is_replaced_only_when_it_holds_an_earlier_output_of_the_same_kind(tmp_path):
    """With ``ours``, entries the new folder also has (or ``ours`` names) may go; anything else is refused, and then
    nothing is changed and no temporary folder is left."""
    target = tmp_path / "out"
    target.mkdir()
    (target / "model.bin").write_bytes(b"old")
    (target / "eval").mkdir()
    with atomic_dir(target, ours=("eval",)) as tmp:
        (tmp / "model.bin").write_bytes(b"new")
    assert sorted(p.name for p in target.iterdir()) == ["model.bin"] and (target / "model.bin").read_bytes() == b"new"
    (target / "mine.txt").write_text("the user's\n", encoding="utf-8")
    with pytest.raises(OutputError, match="holds mine.txt"):
        with atomic_dir(target, ours=("eval",)) as tmp:
            (tmp / "model.bin").write_bytes(b"newer")
    assert (target / "mine.txt").read_text(encoding="utf-8") == "the user's\n"
    assert (target / "model.bin").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    with atomic_dir(target) as tmp:  # without ``ours`` the folder is tfm's own: replaced as it is
        (tmp / "model.bin").write_bytes(b"newest")
    assert sorted(p.name for p in target.iterdir()) == ["model.bin"]
