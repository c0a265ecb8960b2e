"""Writing without losing anything: atomic files and folders, what an interrupted write leaves repaired by the next
one, a folder replaced only when all of it is tfm's and of the same kind, the umask followed, and an output never
landing on what the command reads."""

import errno
import os
import stat

import pytest
from tiny import tiny_config

from transformer import checkpoint
from transformer.errors import OutputError, WriteError
from transformer.model.transformer import Transformer
from transformer.storage import manifest
from transformer.storage.files import (
    atomic_dir,
    atomic_file,
    check_apart,
    clean_partial,
    output_path,
    remove_dir,
    write_files,
)
from transformer.text.tokenizer import Tokenizer

GONE = 4_194_305  # above any pid_max: no process has this id


def leftover(folder, name, what=manifest.PARTIAL):
    """A folder as a killed ``atomic_dir`` leaves it: its temporary name, its record made first, some of its files."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).mkdir()
    manifest.create(folder / name, what)
    (folder / name / "model.bin").write_bytes(b"\0" * 10)
    return folder / name


def test_interrupted_save_and_prune_are_repaired_on_the_next_start(tmp_path):
    """Kill between save's two renames: only ``.best.old-PID`` is left; it is put back, temporaries removed."""
    cfg = tiny_config(tmp_path)
    tok = Tokenizer.train(["Ein Mann fährt Fahrrad."] * 20, vocab_size=cfg.tokenizer.vocab_size)
    model = Transformer(cfg.model, tok.vocab_size, tok.pad_id)
    folder = tmp_path / "run"
    best = checkpoint.save(folder / "best", cfg, tok, model, {"step": 4})
    stale = checkpoint.save(folder / "stale", cfg, tok, model, {"step": 2})
    checkpoint.save(folder / "step_2", cfg, tok, model, {"step": 3})  # the replacement of ``stale`` did land
    os.replace(best, folder / f".best.old-{GONE}")
    os.replace(stale, folder / f".step_2.old-{GONE}")
    leftover(folder, f".step_9.tmp-{GONE}")
    done = clean_partial(folder)
    assert done == [
        f"restored best from .best.old-{GONE}",
        f"removed .step_2.old-{GONE}",
        f"removed .step_9.tmp-{GONE}",
    ]
    assert checkpoint.load(folder / "best").meta["step"] == 4 and checkpoint.load(folder / "step_2").meta["step"] == 3
    assert sorted(p.name for p in folder.iterdir()) == ["best", "step_2"]


def test_what_a_killed_write_leaves_is_removed_by_the_next_write_beside_it(tmp_path):
    """A SIGKILLed export or average leaves ``.NAME.tmp-PID``: the next one into the same folder removes it. A
    temporary-looking folder without tfm's record, or one whose process still runs, is left alone; one killed while
    its first record was written, holding only that record's temporary file, is removed."""
    killed = leftover(tmp_path, f".export.tmp-{GONE}")
    mine = tmp_path / f".notes.tmp-{GONE}"  # the user's, named as tfm names its own
    mine.mkdir()
    running = leftover(tmp_path, f".other.tmp-{os.getppid()}")
    recording = tmp_path / f".step_6.tmp-{GONE}"  # killed while writing its first record: only that record's temp
    recording.mkdir()
    (recording / f"{manifest.MANIFEST}.tmp-{GONE}").write_text('{"kind": "par', encoding="utf-8")
    not_only = tmp_path / f".step_8.tmp-{GONE}"  # the same beside a file of the user's: not tfm's to remove
    not_only.mkdir()
    (not_only / f"{manifest.MANIFEST}.tmp-{GONE}").write_text("{", encoding="utf-8")
    (not_only / "notes.txt").write_text("mine", encoding="utf-8")
    with atomic_dir(tmp_path / "export2", "export") as tmp:
        (tmp / "model.bin").write_bytes(b"new")
    assert not killed.exists() and mine.is_dir() and running.is_dir()
    assert not recording.exists() and (not_only / "notes.txt").is_file()


def test_a_folder_replaces_only_an_earlier_one_of_its_kind_holding_nothing_else(tmp_path):
    target = tmp_path / "out"
    with atomic_dir(target, "export") as tmp:
        (tmp / "model.bin").write_bytes(b"old")
    with atomic_dir(target, "export") as tmp:
        (tmp / "model.bin").write_bytes(b"new")
    assert (target / "model.bin").read_bytes() == b"new" and manifest.kind(target) == "export"
    with pytest.raises(OutputError, match="is a export tfm wrote, not an earlier average"):
        with atomic_dir(target, "average"):
            pass
    (target / "model.bin").write_bytes(b"the user's own weights")  # changed since tfm wrote it: no longer tfm's
    with pytest.raises(OutputError, match=r"holds '.*model.bin', which tfm did not write"):
        with atomic_dir(target, "export") as tmp:
            (tmp / "model.bin").write_bytes(b"newer")
    assert (target / "model.bin").read_bytes() == b"the user's own weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("depth", ["top", "nested"])
def test_a_users_file_at_any_depth_stops_a_replacement_before_anything_is_written(tmp_path, depth):
    target = tmp_path / "out"
    with atomic_dir(target, "export") as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "vocab.txt").write_text("a\n")
    mine = target / ("mine.txt" if depth == "top" else "sub/mine.txt")
    mine.write_text("the user's\n")
    written = []
    with pytest.raises(OutputError, match=f"holds '{mine}'"):
        with atomic_dir(target, "export") as tmp:
            written.append(tmp)
    assert not written and mine.read_text() == "the user's\n"


def test_a_file_a_device_or_a_users_folder_is_never_replaced_by_a_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "ch1.tex").write_text("work")
    for path, why in [
        (tmp_path / "file", "is a file"),
        ("/dev/full", "not a folder"),
        (tmp_path / "folder", "which tfm did not write"),
    ]:
        if not os.path.exists(path):
            continue
        with pytest.raises(OutputError, match=why):
            with atomic_dir(path, "export"):
                pass
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode) if os.path.exists("/dev/full") else True
    assert (tmp_path / "file").read_text() == "x" and (tmp_path / "folder" / "ch1.tex").read_text() == "work"


def test_a_link_is_followed_and_a_loop_or_a_dangling_link_is_named(tmp_path):
    real = tmp_path / "real"
    real.mkdir()  # empty: nothing of the user's to lose
    (tmp_path / "link").symlink_to(real)
    with atomic_dir(tmp_path / "link", "export") as tmp:
        (tmp / "model.bin").write_bytes(b"x")
    assert (tmp_path / "link").is_symlink() and (real / "model.bin").read_bytes() == b"x"
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(OutputError, match="'.*loop1' is a symbolic link that loops"):
        output_path(tmp_path / "loop1")
    with pytest.raises(OutputError, match="points nowhere"):
        output_path(tmp_path / "dangling")
    with pytest.raises(OutputError, match="root of the file system"):
        output_path("/")
    assert output_path(".") == tmp_path.cwd()


def test_a_failed_write_is_one_error_naming_the_output_and_leaves_nothing(tmp_path):
    with pytest.raises(WriteError, match=r"cannot write .*out: no space left on the device; free some space") as e:
        with atomic_dir(tmp_path / "out", "export"):
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / ".out.tmp-1" / "model.bin"))
    assert e.value.errno == errno.ENOSPC and list(tmp_path.iterdir()) == []


def test_a_write_failing_without_a_name_names_the_file_and_leaves_nothing(tmp_path):
    """A full disk fails ``f.write`` with no file name; the error names the output, so the command's one line can."""
    with pytest.raises(OSError, match="No space left") as e:
        with atomic_file(tmp_path / "tokenizer.json") as f:
            f.write("{}")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "tokenizer.json")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConnectionError):  # a subclass, as a download's errors are, passes unchanged
        with atomic_file(tmp_path / "corpus.gz", "wb"):
            raise ConnectionError("reset")


@pytest.mark.parametrize("spelling", ["pipe", "link to a pipe"])
def test_a_pipe_or_device_is_written_as_it_is_never_replaced(tmp_path, spelling):
    """Found by the command-line property test: `tfm shortlist --output /dev/null --overwrite` renamed a file over
    /dev/null. A named pipe stands in for the device here: both are files that no rename may replace."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    target = fifo if spelling == "pipe" else tmp_path / "link"
    if target != fifo:
        target.symlink_to(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # open before the writer, so that neither waits
    try:
        with atomic_file(target, "wb") as f:
            f.write(b"shortlist")
        assert os.read(reader, 100) == b"shortlist"
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(fifo.stat().st_mode) and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        {"fifo", target.name}
    )


def test_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        with atomic_file(tmp_path / "a.json") as f:
            f.write("{}")
        with atomic_dir(tmp_path / "out", "export") as tmp:
            fd = os.open(tmp / "w.bin", os.O_WRONLY | os.O_CREAT, 0o600)  # as some writers make their files
            os.close(fd)
        write_files(tmp_path / "eval", {"r.hyp": "x\n"}, "eval")
        os.umask(0o077)
        with atomic_file(tmp_path / "b.json") as f:
            f.write("{}")
    finally:
        os.umask(old)
    modes = {p: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "a.json", tmp_path / "out/w.bin")}
    assert set(modes.values()) == {0o644} and stat.S_IMODE((tmp_path / "eval/r.hyp").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "b.json").stat().st_mode) == 0o600


def test_files_written_together_land_together_or_not_at_all(tmp_path, monkeypatch):
    folder = tmp_path / "eval"
    write_files(folder, {"a.hyp": "one\n", "a.json": "{}"}, "eval")
    assert manifest.is_own(folder / "a.hyp") and manifest.is_own(folder / "a.json")
    calls = []
    real_fsync = os.fsync

    def full_at_the_second_file(fd):
        calls.append(fd)
        if len(calls) == 2:  # the first report is complete, the disk fills under the second
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_at_the_second_file)
    with pytest.raises(WriteError, match="no space left"):
        write_files(folder, {"b.hyp": "two\n", "b.json": "{}"}, "eval")
    assert sorted(p.name for p in folder.iterdir()) == [".tfm-files", "a.hyp", "a.json"]


def test_remove_dir_keeps_the_users_files_where_they_are(tmp_path):
    target = tmp_path / "step_3"
    with atomic_dir(target, "checkpoint") as tmp:
        (tmp / "model.safetensors").write_bytes(b"w")
    (target / "notes.txt").write_text("good step\n")
    assert remove_dir(target) == [target / "notes.txt"]
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt"]
    assert remove_dir(target) == [target / "notes.txt"]  # nothing of tfm's left to remove
    with atomic_dir(tmp_path / "step_4", "checkpoint") as tmp:
        (tmp / "model.safetensors").write_bytes(b"w")
    assert remove_dir(tmp_path / "step_4") == [] and not (tmp_path / "step_4").exists()


def test_keep_foreign_sets_a_folder_holding_the_users_files_aside_whole(tmp_path):
    best = tmp_path / "best"
    with atomic_dir(best, "checkpoint", keep_foreign=True) as tmp:
        (tmp / "model.safetensors").write_bytes(b"1")
    (best / "notes.txt").write_text("mine\n")
    with atomic_dir(best, "checkpoint", keep_foreign=True) as tmp:
        (tmp / "model.safetensors").write_bytes(b"2")
    assert (best / "model.safetensors").read_bytes() == b"2" and not (best / "notes.txt").exists()
    assert (tmp_path / "best.kept-1" / "notes.txt").read_text() == "mine\n"


@pytest.mark.parametrize("spelling", ["same", "dot", "link", "hardlink", "folder"])
def test_an_output_on_what_the_command_reads_is_refused_naming_both(tmp_path, spelling):
    source = tmp_path / "ckpt" / "model.safetensors"
    source.parent.mkdir()
    source.write_bytes(b"weights")
    output = {
        "same": source,
        "dot": tmp_path / "ckpt" / "." / ".." / "ckpt" / "model.safetensors",
        "link": tmp_path / "link",
        "hardlink": tmp_path / "hard",
        "folder": tmp_path / "ckpt",
    }[spelling]
    if spelling == "link":
        output.symlink_to(source)
    if spelling == "hardlink":
        os.link(source, output)
    how = "a folder holding" if spelling == "folder" else "the same file as"
    with pytest.raises(OutputError, match=f"'{output}' is {how} '{source}', which this command reads"):
        check_apart(output, [source], folder=True)
    check_apart(tmp_path / "ckpt" / "other.txt", [source])  # beside what it reads is fine
    check_apart("/dev/null", ["/dev/null"])  # a device that reading does not use up
