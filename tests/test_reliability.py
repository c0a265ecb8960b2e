"""Nothing lost, nothing silent (issue 5): real signals and kills, bad input, safe and portable loading.

Training is stopped with real SIGINT, SIGTERM and SIGKILL sent to ``python -m cli train`` subprocesses
running a 1-layer model on data/sample; translation is interrupted the same way. Bad input goes through
the real Typer app in-process (``CliRunner``), which is the same code as the command line minus the
interpreter start-up, so the suite stays fast.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Callable

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli.main import app
from cli.translate_cmd import run_translate
from tiny import ROOT, SAMPLE, tiny_config
from transformer import checkpoint, config
from transformer.files import clean_partial
from transformer.model import build_model
from transformer.tokenizer import Tokenizer
from transformer.train import Trainer
from transformer.translator import Translator, clean_line

QUICKSTART = ROOT / "configs" / "quickstart.yaml"
# The quickstart config shrunk to a model that does an update in well under a second on a busy CPU.
TINY = [f"--set={kv}" for kv in (
    "model.N=1", "model.d_model=32", "model.h=2", "model.d_ff=64", "tokenizer.vocab_size=400", "device=cpu",
    f"data.path={SAMPLE}", "train.max_steps=100000", "train.batch_tokens=300", "train.log_every=1",
    "train.eval_every=100000", "train.eval_sentences=4", "train.save_every=100000", "decode.max_len_b=5")]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}  # see _one_thread
SENTENCE = "Ein Mann fährt Fahrrad."


# ----- helpers ------------------------------------------------------------------------------------------


class Proc:
    """A ``python -m cli`` subprocess whose stderr goes to a file that can be read while it runs."""

    def __init__(self, args: list[str], err: Path) -> None:
        self.err_path = err
        with open(err, "w") as f:
            self.p = subprocess.Popen([sys.executable, "-m", "cli", *args], env=ENV, cwd=ROOT,
                                      stdout=subprocess.DEVNULL, stderr=f)

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(encoding="utf-8", errors="replace")

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
        """Poll ``condition``; fail with the process's stderr if it exits or time runs out first."""
        deadline = time.monotonic() + timeout
        while not condition():
            if self.p.poll() is not None:
                pytest.fail(f"exited ({self.p.returncode}) before {what}:\n{self.stderr}")
            if time.monotonic() > deadline:
                self.p.kill()
                pytest.fail(f"timed out waiting for {what}:\n{self.stderr}")
            time.sleep(0.02)

    def finish(self, timeout: float = 120) -> int:
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            pytest.fail(f"did not exit within {timeout} s:\n{self.stderr}")


def _train(tmp_path: Path, *extra: str, tag: str = "train") -> Proc:
    args = ["train", "--config", str(QUICKSTART), "--quiet", *TINY, f"--set=run_dir={tmp_path / 'runs'}", *extra]
    return Proc(args, tmp_path / f"{tag}.err")


def _run(tmp_path: Path) -> Path:
    return tmp_path / "runs" / "quickstart"


def _train_steps(run: Path) -> list[int]:
    """Steps logged as training updates in log.jsonl (every update: log_every=1), skipping a half-written last line."""
    path = run / "log.jsonl"
    if not path.is_file():
        return []
    steps = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry["kind"] == "train":
            steps.append(entry["step"])
    return steps


def _last_step(run: Path) -> int:
    return max(_train_steps(run), default=0)


def _step_of(path: Path) -> int:
    return int(path.name[len(checkpoint.STEP_PREFIX):])


def _assert_resumable(path: Path, step: int) -> None:
    """A complete checkpoint: weights load and the trainer state says ``step``."""
    checkpoint.load(path)
    assert checkpoint.load_trainer_state(path)["state"]["step"] == step


def _resume_in_process(run: Path, max_steps: int) -> tuple[int, list[str]]:
    """What ``tfm train --resume`` does, run here from the run's saved config: (final step, log lines)."""
    messages: list[str] = []
    cfg = config.load(run / checkpoint.CONFIG, [f"train.max_steps={max_steps}"])
    result = Trainer(cfg, resume=True, quiet=True, log=messages.append).run()
    return result.state.step, messages


def _one_error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    assert "Traceback" not in stderr
    return errors[0]


# ----- signals during training (real subprocesses) -------------------------------------------------------


def _stop_with(proc: Proc, run: Path, sig: signal.Signals, code: int, after_step: int) -> Path:
    """Send ``sig`` once training passed ``after_step``; check the exit code and the one checkpoint it saved."""
    proc.wait_for(lambda: _last_step(run) >= after_step, f"update {after_step}")
    proc.p.send_signal(sig)
    assert proc.finish() == code, proc.stderr
    assert "Traceback" not in proc.stderr and f"{sig.name}: finishing this update" in proc.stderr
    stopped_at = _last_step(run)
    newest = checkpoint.step_dirs(run)[-1]
    assert _step_of(newest) == stopped_at  # the update in flight was finished, logged and saved
    _assert_resumable(newest, stopped_at)
    return newest


def test_sigint_and_sigterm_save_a_resumable_checkpoint_and_resume_continues(tmp_path):
    """SIGINT -> exit 130 and a checkpoint; ``--resume`` goes on from it; SIGTERM -> exit 143 and a checkpoint."""
    run = _run(tmp_path)
    first = _stop_with(_train(tmp_path), run, signal.SIGINT, 130, after_step=3)
    k = _step_of(first)
    again = _train(tmp_path, "--resume", tag="resume")
    second = _stop_with(again, run, signal.SIGTERM, 143, after_step=k + 2)
    assert f"resumed from {first} at step {k}" in again.stderr
    assert _train_steps(run) == list(range(1, _step_of(second) + 1))  # no update repeated, none lost


def test_second_sigint_stops_at_once_and_keeps_the_previous_checkpoint(tmp_path):
    run = _run(tmp_path)
    # Bigger batches and a wider model make an update (about 0.3 s) long enough for the second signal
    # to land inside it; with the tiny model an update could end, and the final save with it, first.
    proc = _train(tmp_path, "--set=train.save_every=2", "--set=train.batch_tokens=3000", "--set=model.d_model=256",
                  "--set=model.d_ff=2048")
    proc.wait_for(lambda: _last_step(run) >= 3, "a periodic checkpoint and one more update")
    before = checkpoint.step_dirs(run)
    proc.p.send_signal(signal.SIGINT)
    proc.wait_for(lambda: "finishing this update" in proc.stderr, "the first SIGINT to be seen")
    proc.p.send_signal(signal.SIGINT)
    assert proc.finish() == 130, proc.stderr
    assert "second interrupt: stopping now" in proc.stderr and "Traceback" not in proc.stderr
    assert "checkpoints in" not in proc.stderr  # it did not go on to the final save
    after = checkpoint.step_dirs(run)
    assert before[-1] in after
    for path in after:
        _assert_resumable(path, _step_of(path))


def test_kill_9_then_resume_continues_from_the_last_complete_checkpoint(tmp_path):
    run = _run(tmp_path)
    proc = _train(tmp_path, "--set=train.save_every=2")
    proc.wait_for(lambda: checkpoint.step_dirs(run) and _last_step(run) >= 5, "checkpoints and progress")
    proc.p.kill()
    assert proc.finish() == -signal.SIGKILL
    last = checkpoint.step_dirs(run)[-1]
    n = _step_of(last)
    # What a kill in the middle of a save leaves: a half-written temporary directory. Loading ignores it.
    leftover = run / "checkpoints" / f".{checkpoint.STEP_PREFIX}{n + 2}.tmp-999999"
    leftover.mkdir(exist_ok=True)
    (leftover / checkpoint.WEIGHTS).write_bytes(b"\x00" * 10)
    assert checkpoint.newest(run.parent) == last and checkpoint.step_dirs(run)[-1] == last
    checkpoint.load(last)

    step, messages = _resume_in_process(run, n + 2)
    assert f"resumed from {last} at step {n}" in messages and step == n + 2
    assert any(f"removed {leftover.name}" in m for m in messages)
    assert not [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]


def test_interrupted_save_and_prune_are_repaired_on_the_next_start(tmp_path):
    """Kill between save's two renames: only ``.best.old-PID`` is left; it is put back, temporaries removed."""
    cfg = tiny_config(tmp_path)
    tok = Tokenizer.train([SENTENCE] * 20, vocab_size=cfg.tokenizer.vocab_size)
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


def test_prune_never_leaves_a_half_deleted_checkpoint_that_looks_complete(tmp_path, monkeypatch):
    cfg = tiny_config(tmp_path)
    tok = Tokenizer.train([SENTENCE] * 20, vocab_size=cfg.tokenizer.vocab_size)
    model = build_model(cfg.model, tok.vocab_size, tok.pad_id)
    for step in (1, 2, 3):
        checkpoint.save(tmp_path / "checkpoints" / f"step_{step}", cfg, tok, model, {"step": step})

    def killed(path, ignore_errors=False):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.prune(tmp_path, keep_last=2)
    monkeypatch.undo()
    assert [p.name for p in checkpoint.step_dirs(tmp_path)] == ["step_2", "step_3"]
    assert clean_partial(tmp_path / "checkpoints") == [f"removed .step_1.tmp-{os.getpid()}"]


# ----- non-finite updates ----------------------------------------------------------------------------------


def test_non_finite_updates_are_skipped_counted_and_stop_training_with_a_diagnosis(tmp_path, monkeypatch):
    """Update 3 is NaN (skipped, training goes on); 5, 6, 7 are NaN: K=3 in a row stops the run."""
    bad = {3, 5, 6, 7}
    real = Trainer._micro_loss

    def poisoned(self, batch, total):
        loss, nll = real(self, batch, total)
        return (loss * math.nan, nll) if self.state.step + 1 in bad else (loss, nll)

    monkeypatch.setattr(Trainer, "_micro_loss", poisoned)
    cfg = tiny_config(tmp_path, train={"max_steps": 50, "save_every": 2, "max_bad_steps": 3, "keep_last": 5,
                                       "eval_every": 1000})
    messages: list[str] = []
    trainer = Trainer(cfg, quiet=True, log=messages.append)
    result = trainer.run()
    assert (result.reason, result.exit_code, result.state.step, result.state.skipped_steps) == ("non_finite", 1, 7, 4)

    log = [json.loads(line) for line in (cfg.out_dir / "log.jsonl").read_text().splitlines()]
    train = {e["step"]: e for e in log if e["kind"] == "train"}
    assert sorted(train) == [1, 2, 4]  # skipped updates are not logged as if they had happened
    assert train[4]["skipped_steps"] == 1
    diagnosis = next(m for m in messages if m.startswith("stopped:"))
    assert re.search(rf"3 updates in a row .* at step 7 \(last finite loss {train[4]['loss']:.4f}, "
                     r"lr \d\.\d\de-\d\d, loss scale 1\.0\)", diagnosis), diagnosis
    assert "lower train.peak_lr" in diagnosis and "Checkpoints before this point are intact" in diagnosis

    # Skipped updates changed nothing: the weights at the stop are those after update 4, which step_4 and
    # step_6 (saved in the middle of the bad run) both hold, loadable and resumable.
    assert [p.name for p in checkpoint.step_dirs(cfg.out_dir)] == ["step_2", "step_4", "step_6"]
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    for name in ("step_4", "step_6"):
        path = cfg.out_dir / "checkpoints" / name
        saved = checkpoint.load(path).model.state_dict()
        assert all(torch.equal(saved[k], weights[k]) for k in weights)
        assert checkpoint.load_trainer_state(path)["state"]["step"] == _step_of(path)


def test_absurd_learning_rate_ends_the_cli_run_with_exit_1_and_a_hint(tmp_path):
    r = CliRunner().invoke(app, ["train", "--config", str(QUICKSTART), "--quiet", *TINY,
                                 f"--set=run_dir={tmp_path}", "--set=train.peak_lr=1e30", "--set=train.warmup=1",
                                 "--set=train.max_bad_steps=3", "--set=train.save_every=1"])
    assert r.exit_code == 1, r.output
    assert isinstance(r.exception, SystemExit) and "Traceback" not in r.stderr
    assert re.search(r"stopped: 3 updates in a row with non-finite loss or gradients at step \d+ "
                     r"\(last finite loss \d+\.\d{4}, lr \S+, loss scale 1\.0\); lower train.peak_lr", r.stderr)
    for path in checkpoint.step_dirs(tmp_path / "quickstart"):
        _assert_resumable(path, _step_of(path))


# ----- translation: interruption and bad input ------------------------------------------------------------


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    """An untrained 1-layer checkpoint with a tokenizer from data/sample: nonsense translations, 5 tokens at most."""
    folder = tmp_path_factory.mktemp("ckpt")
    cfg = tiny_config(folder, decode={"max_len_a": 0.0, "max_len_b": 5})
    texts = (SAMPLE / "train.de").read_text(encoding="utf-8").splitlines()
    texts += (SAMPLE / "train.en").read_text(encoding="utf-8").splitlines()
    tok = Tokenizer.train(texts, vocab_size=cfg.tokenizer.vocab_size)
    torch.manual_seed(0)
    return checkpoint.save(folder / "ck", cfg, tok, build_model(cfg.model, tok.vocab_size, tok.pad_id), {"step": 0})


def _translate(ckpt: Path, *args: str):
    return CliRunner().invoke(app, ["translate", "--checkpoint", str(ckpt), "--device", "cpu", "--greedy", *args])


def test_ctrl_c_during_translate_output_leaves_only_complete_lines(ckpt, tmp_path):
    big, out = tmp_path / "big.de", tmp_path / "out.en"
    total = 60_000
    big.write_text(f"{SENTENCE}\n" * total, encoding="utf-8")
    proc = Proc(["translate", "--checkpoint", str(ckpt), "--device", "cpu", "--greedy", "--input", str(big),
                 "--output", str(out)], tmp_path / "translate.err")
    proc.wait_for(lambda: out.is_file() and out.stat().st_size > 0, "the first translations")
    proc.p.send_signal(signal.SIGINT)
    assert proc.finish() == 130, proc.stderr
    written = int(re.search(r"interrupted: (\d+) complete lines written", proc.stderr).group(1))
    text = out.read_text(encoding="utf-8")
    assert text.endswith("\n") and 0 < written < total and text.count("\n") == written
    loaded = checkpoint.load(ckpt)
    translator = Translator(loaded.model, loaded.tokenizer, loaded.cfg.decode, loaded.cfg.model.max_positions,
                            torch.device("cpu"))
    expected = {t.best for t in translator.translate_chunk([SENTENCE] * 1000, beam=1)}
    assert set(text.splitlines()) <= expected


def test_invalid_utf8_is_replaced_with_a_warning_naming_the_line(ckpt, tmp_path):
    src, out = tmp_path / "in.de", tmp_path / "out.en"
    src.write_bytes(b"Ein Hund.\n\xff\xfe kaputt \xc3\n\nDie Frau.\n")
    r = _translate(ckpt, "--input", str(src), "--output", str(out))
    assert r.exit_code == 0, r.output
    assert f"warning: {src} line 2: invalid UTF-8 replaced by U+FFFD" in r.stderr
    assert "line 1" not in r.stderr and "line 4" not in r.stderr
    lines = out.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 5 and lines[2] == "" and lines[4] == ""


def test_invalid_utf8_in_the_sentence_argument_is_replaced_not_a_crash(ckpt):
    r = _translate(ckpt, os.fsdecode(b"Ein \xff Hund."))  # how Python hands over non-UTF-8 argv bytes
    assert r.exit_code == 0, r.output
    assert "invalid UTF-8 replaced by U+FFFD" in r.stderr and len(r.stdout.splitlines()) == 1


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"], ids=["empty", "blank-lines"])
def test_empty_input_gives_empty_output_and_exit_0(ckpt, tmp_path, content):
    src, out = tmp_path / "in.de", tmp_path / "out.en"
    src.write_bytes(content)
    r = _translate(ckpt, "--input", str(src), "--output", str(out))
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == b"\n" * content.count(b"\n")
    assert ("note: the input was empty" in r.stderr) == (content == b"")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.binary(max_size=25), st.text(max_size=25).map(lambda s: s.encode("utf-8"))),
                max_size=6))
def test_any_bytes_file_gives_one_output_line_per_input_line(ckpt, tmp_path, rows):
    """Arbitrary bytes (invalid UTF-8, NUL, CR, U+2028, BOM...) split only on b'\\n': one output line each."""
    rows = [row.replace(b"\n", b" ") for row in rows]
    src, out = tmp_path / "in.bin", tmp_path / "out.txt"
    src.write_bytes(b"".join(row + b"\n" for row in rows))
    run_translate(None, ckpt, src, out, 1, 1, None, "cpu", "fp32", tmp_path)
    assert out.read_text(encoding="utf-8").count("\n") == len(rows)


def test_ctrl_c_while_loading_exits_130_without_a_traceback(monkeypatch):
    """Before training installs its own handler (config, data, tokenizer): one line and 130, not click's exit 1."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(config, "load", interrupted)
    r = CliRunner().invoke(app, ["train", "--config", str(QUICKSTART)])
    assert r.exit_code == 130 and r.stderr.strip() == "interrupted"


# ----- bad config, through the CLI: exit 2, one error line, no traceback ------------------------------------


BAD_CONFIGS = {
    "unknown-key": (["--set=train.lable_smoothing=0.2"],
                    "unknown config key 'train.lable_smoothing'; did you mean 'train.label_smoothing'?"),
    "wrong-type": (["--set=model.h=eight"], "model.h: expected int, got 'eight'"),
    "dropout-1.5": (["--set=model.dropout=1.5"], "model.dropout: 1.5 is out of range; it must be in [0, 1)"),
    "d_model-vs-h": (["--set=model.d_model=30", "--set=model.h=4"],
                     "model.d_model (30) must be divisible by model.h (4)"),
    "missing-data": (["--set=data.path={tmp}/none"], "missing train.de[.gz], train.en[.gz] in {tmp}/none"),
    "fp16-on-cpu": (["--set=precision=fp16"], "precision: fp16 needs a CUDA GPU but the device is cpu"),
    "cuda-without-cuda": (["--set=device=cuda"], "device: cuda but this machine has no CUDA GPU"),
}


@pytest.mark.parametrize("name", BAD_CONFIGS)
def test_bad_config_is_one_error_line_and_exit_2(name, tmp_path):
    if name == "cuda-without-cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    sets, message = BAD_CONFIGS[name]
    args = ["train", "--config", str(QUICKSTART), "--quiet", *TINY, f"--set=run_dir={tmp_path}"]
    r = CliRunner().invoke(app, args + [s.format(tmp=tmp_path) for s in sets])
    assert r.exit_code == 2, r.output
    assert isinstance(r.exception, SystemExit), r.exception
    assert message.format(tmp=tmp_path) in _one_error_line(r.stderr)


def test_yaml_syntax_error_names_file_line_and_column(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel:\n  N: 1\n d_model: 2\n", encoding="utf-8")
    r = CliRunner().invoke(app, ["train", "--config", str(bad)])
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit)
    assert f"{bad}: YAML syntax error at line 4, column 2" in _one_error_line(r.stderr)


# ----- checkpoints from another device; eval refusals -------------------------------------------------------


def test_checkpoint_saved_on_another_device_loads_on_cpu(ckpt, tmp_path, monkeypatch):
    """safetensors records dtype, shape and offsets only; trainer.pt tensors tagged 'cuda:0' load via map_location."""
    header_len = int.from_bytes((ckpt / checkpoint.WEIGHTS).read_bytes()[:8], "little")
    header = json.loads((ckpt / checkpoint.WEIGHTS).read_bytes()[8:8 + header_len])
    assert {k for name, v in header.items() if name != "__metadata__" for k in v} == {"dtype", "shape", "data_offsets"}

    # Write trainer.pt as a GPU run would: every storage tagged 'cuda:0' (this machine need not have one).
    gpu_copy = tmp_path / "gpu"
    loaded = checkpoint.load(ckpt)
    checkpoint.save(gpu_copy, loaded.cfg, loaded.tokenizer, loaded.model, loaded.meta)
    monkeypatch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
    torch.save({"state": {"step": 3}, "exp_avg": torch.ones(3)}, gpu_copy / checkpoint.TRAINER)
    monkeypatch.undo()
    with zipfile.ZipFile(gpu_copy / checkpoint.TRAINER) as z:
        assert b"cuda:0" in z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    if not torch.cuda.is_available():  # a plain torch.load would fail here, as users of other toolkits report
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(gpu_copy / checkpoint.TRAINER, weights_only=True)
    state = checkpoint.load_trainer_state(gpu_copy)
    assert state["exp_avg"].device.type == "cpu" and torch.equal(state["exp_avg"], torch.ones(3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU to save from")
def test_checkpoint_saved_from_cuda_loads_on_cpu(ckpt, tmp_path):
    loaded = checkpoint.load(ckpt, "cuda")
    path = checkpoint.save(tmp_path / "gpu", loaded.cfg, loaded.tokenizer, loaded.model, loaded.meta,
                           {"exp_avg": torch.ones(3, device="cuda")})
    back = checkpoint.load(path, "cpu")
    assert all(p.device.type == "cpu" for p in back.model.parameters())
    assert checkpoint.load_trainer_state(path)["exp_avg"].device.type == "cpu"


def test_eval_refuses_files_of_different_line_counts(ckpt, tmp_path):
    hyp, ref = tmp_path / "hyp.en", tmp_path / "ref.en"
    hyp.write_text("a\nb\n", encoding="utf-8")
    ref.write_text("a\nb\nc\n", encoding="utf-8")
    r = CliRunner().invoke(app, ["eval", "--hyp", str(hyp), "--ref", str(ref)])
    assert r.exit_code == 2 and "2 hypotheses but 3 references" in _one_error_line(r.stderr)
    src = tmp_path / "src.de"
    src.write_text("Ein Hund.\nDie Frau.\n", encoding="utf-8")
    r = CliRunner().invoke(app, ["eval", "--checkpoint", str(ckpt), "--src", str(src), "--ref", str(ref),
                                 "--device", "cpu", "--beam", "1"])
    assert r.exit_code == 2 and "src.de has 2 lines but" in _one_error_line(r.stderr)
    assert not (ckpt / "eval").exists()


# ----- arbitrary Unicode ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(ckpt) -> Tokenizer:
    return checkpoint.load(ckpt).tokenizer


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.one_of(st.characters(), st.characters(categories=["Cs"])), max_size=60))
def test_translator_input_path_never_crashes_the_tokenizer(tokenizer, s):
    """Any str, lone surrogates included (how argv hands over bad bytes): cleaned, it encodes and round-trips."""
    line = clean_line(s)
    [ids] = tokenizer.encode_batch([line])
    assert tokenizer.unk_id not in ids
    assert tokenizer.decode(ids) == tokenizer.normalize(line)
