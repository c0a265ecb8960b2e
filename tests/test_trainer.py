"""The training loop: it trains, keeps the best and the last checkpoints, resumes exactly and stops for the right
reason."""

import json
import math
import re
from itertools import count

import pytest
import torch
from tiny import run_trainer, step_of, tiny_config

from transformer import checkpoint, measured
from transformer.training import bookkeeping, meter, setup, update, validation
from transformer.training import trainer as train
from transformer.training.update import Updater


def _losses(run_dir):
    lines = (run_dir / "log.jsonl").read_text().splitlines()
    return [e["loss"] for e in map(json.loads, lines) if e["kind"] == "train"]


def test_trains_and_writes_run_directory(tiny_run):
    run = tiny_run.run_dir
    assert tiny_run.reason == "max_steps" and tiny_run.state.step == 6
    assert (run / "config.yaml").is_file() and (run / "tokenizer.json").is_file()
    assert [p.name for p in checkpoint.step_dirs(run)] == ["step_3", "step_6"]
    assert (run / "best" / "model.safetensors").is_file()
    losses = _losses(run)
    assert len(losses) == 6 and all(x == x for x in losses)
    kinds = [json.loads(line)["kind"] for line in (run / "log.jsonl").read_text().splitlines()]
    assert kinds.count("valid") == 2


def test_the_wait_for_the_first_update_is_logged_from_the_process_start(tiny_run):
    """One ``start`` record: the seconds from the process's start to the end of the first update, set-up first."""
    log = [json.loads(line) for line in (tiny_run.run_dir / "log.jsonl").read_text().splitlines()]
    start = [e for e in log if e["kind"] == "start"]
    assert len(start) == 1 and start[0]["step"] == 1
    assert 0 < start[0]["set_up_s"] < start[0]["first_update_s"] < meter.clock() - meter.process_started()


def test_loss_goes_down(tmp_path):
    cfg = tiny_config(
        tmp_path, train={"max_steps": 40, "eval_every": 40, "save_every": 40, "peak_lr": 3e-3}, model={"dropout": 0.0}
    )
    run_trainer(cfg)
    losses = _losses(cfg.out_dir)
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5


def test_exact_resume(tmp_path):
    """2N steps in one go == N steps, stop, resume for N: same losses, same weights (CPU, fp32)."""
    whole = tiny_config(tmp_path / "a", train={"max_steps": 6, "save_every": 3})
    run_trainer(whole)
    run_trainer(tiny_config(tmp_path / "b", train={"max_steps": 3, "save_every": 3}))
    rest = tiny_config(tmp_path / "b", train={"max_steps": 6, "save_every": 3})
    run_trainer(rest, resume=True)
    assert _losses(whole.out_dir) == _losses(rest.out_dir)
    a = checkpoint.load(checkpoint.step_dirs(whole.out_dir)[-1]).model.state_dict()
    b = checkpoint.load(checkpoint.step_dirs(rest.out_dir)[-1]).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    a, b = (checkpoint.load_trainer_state(checkpoint.step_dirs(r.out_dir)[-1])["optimizer"] for r in (whole, rest))
    assert a["param_groups"][0]["lr"] == b["param_groups"][0]["lr"]
    for i, state in a["state"].items():  # Adam's moments and step count, saved at step 3 and put back, went on alike
        assert all(torch.equal(state[k], b["state"][i][k]) for k in ("step", "exp_avg", "exp_avg_sq"))


def test_resume_of_finished_run_is_a_no_op(tmp_path):
    cfg = tiny_config(tmp_path, train={"max_steps": 3})
    run_trainer(cfg)
    messages = []
    result = run_trainer(cfg, resume=True, log=messages.append)
    assert result.reason == "finished" and any("already at max_steps" in m for m in messages)


def test_non_finite_updates_are_skipped_counted_and_stop_training_with_a_diagnosis(tmp_path, monkeypatch):
    """Update 3 is NaN (skipped, training goes on); 5, 6, 7 are NaN: K=3 in a row stops the run."""
    bad, calls = {3, 5, 6, 7}, count(1)
    real = Updater.micro_loss

    def poisoned(self, batch, total):  # one micro-batch per update here: the n-th call is update n
        loss, nll = real(self, batch, total)
        return (loss * math.nan, nll) if next(calls) in bad else (loss, nll)

    monkeypatch.setattr(Updater, "micro_loss", poisoned)
    cfg = tiny_config(
        tmp_path, train={"max_steps": 50, "save_every": 2, "max_bad_steps": 3, "keep_last": 5, "eval_every": 1000}
    )
    messages: list[str] = []
    models = []
    real_prepare = setup.prepare
    monkeypatch.setattr(train.setup, "prepare", lambda *args: models.append(real_prepare(*args)) or models[-1])
    result = train.Trainer(cfg, quiet=True, log=messages.append).run()
    assert (result.reason, result.exit_code, result.state.step, result.state.skipped_steps) == ("non_finite", 1, 7, 4)

    log = [json.loads(line) for line in (cfg.out_dir / "log.jsonl").read_text().splitlines()]
    logged = {e["step"]: e for e in log if e["kind"] == "train"}
    assert sorted(logged) == [1, 2, 4]  # skipped updates are not logged as if they had happened
    assert logged[4]["skipped_steps"] == 1
    diagnosis = next(m for m in messages if m.startswith("stopped:"))
    assert re.search(
        rf"3 updates in a row .* at step 7 \(last finite loss {logged[4]['loss']:.4f}, "
        r"lr \d\.\d\de-\d\d, loss scale 1\.0\)",
        diagnosis,
    ), diagnosis
    assert "lower train.peak_lr" in diagnosis and "Checkpoints before this point are intact" in diagnosis

    # Skipped updates changed nothing: the weights at the stop are those after update 4, which step_4 and
    # step_6 (saved in the middle of the bad run) both hold, loadable and resumable.
    assert [p.name for p in checkpoint.step_dirs(cfg.out_dir)] == ["step_2", "step_4", "step_6"]
    weights = {k: v.clone() for k, v in models[0].model.state_dict().items()}
    for name in ("step_4", "step_6"):
        path = cfg.out_dir / "checkpoints" / name
        saved = checkpoint.load(path).model.state_dict()
        assert all(torch.equal(saved[k], weights[k]) for k in weights)
        assert checkpoint.load_trainer_state(path)["state"]["step"] == step_of(path)


@pytest.mark.parametrize(
    "amx, bf16_s, resolved", [(True, 9.0, "bf16"), (False, 1.0, "fp32"), (False, 0.5, "bf16"), (False, 2.0, "fp32")]
)
def test_auto_precision_trains_as_resolved_and_the_run_config_records_it(tmp_path, monkeypatch, amx, bf16_s, resolved):
    """With AMX bf16; without, what the measurement (here faked: fp32 takes 1 s, bf16 ``bf16_s``) finds faster."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(measured, "training_seconds", lambda m, v: {"fp32": {"step": 1.0}, "bf16": {"step": bf16_s}})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cfg = tiny_config(tmp_path, precision="auto", train={"max_steps": 1})
    logs = []
    run_trainer(cfg, log=logs.append)
    assert cfg.precision == "auto" and any(m.endswith(f"on cpu in {resolved}") for m in logs)
    assert f"precision: {resolved}" in (cfg.out_dir / "config.yaml").read_text()


def test_training_on_cuda_picks_attention_kernels_per_batch(tmp_path, monkeypatch):
    """Every training and validation forward pass runs without cuDNN attention (it plans every new shape) and,
    its batch being short, without flash; the flags are process-wide, readable without a GPU, and restored."""
    real, build = update.training_attention, setup.Transformer
    for module in (update, validation):
        monkeypatch.setattr(module, "training_attention", lambda device, length: real(torch.device("cuda"), length))
    cuda, seen = torch.backends.cuda, []

    def watched(*args, **kwargs):
        model = build(*args, **kwargs)
        model.register_forward_pre_hook(
            lambda module, inputs: seen.append(
                (cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled())
            )
        )
        return model

    monkeypatch.setattr(setup, "Transformer", watched)
    run_trainer(tiny_config(tmp_path, train={"max_steps": 2, "eval_every": 2}))
    assert len(seen) >= 3 and set(seen) == {(False, False, True)}
    assert cuda.cudnn_sdp_enabled() and cuda.flash_sdp_enabled()


def test_run_ends_with_where_its_time_went(tmp_path):
    """The last log entry splits the run's time into training, validation and checkpoints; the log line says it."""
    cfg = tiny_config(tmp_path, train={"max_steps": 4, "eval_every": 2, "save_every": 2})
    messages = []
    run_trainer(cfg, log=messages.append)
    log = [json.loads(line) for line in (cfg.out_dir / "log.jsonl").read_text().splitlines()]
    end = log[-1]
    assert end["kind"] == "end" and end["reason"] == "max_steps"
    assert min(end["train_s"], end["valid_s"], end["save_s"]) > 0
    assert math.isclose(end["train_s"] + end["valid_s"] + end["save_s"], end["seconds"])
    valid = [e for e in log if e["kind"] == "valid"]
    assert math.isclose(sum(e["valid_s"] for e in valid), end["valid_s"])
    assert re.fullmatch(
        r"time: [\d.]+ min: training [\d.]+ min \(\d+%\), validation [\d.]+ min \(\d+%\), "
        r"checkpoints [\d.]+ min \(\d+%\)",
        messages[-1],
    )


class HandClock:
    """The clock a run reads (transformer.training.meter.clock), moved only by the test: updates, validations and
    saves take the seconds the test gives them, however loaded the machine."""

    def __init__(self, monkeypatch, update_s: float = 0.0, valid_s: float = 0.0, save_s: float = 0.0) -> None:
        self.now = 1000.0
        self.tokens: list[int] = []
        self.flops: list[float] = []
        monkeypatch.setattr(meter, "clock", lambda: self.now)
        real_update, real_validate, real_save = Updater.__call__, validation.Validator.__call__, train.checkpoint.save

        def update(updater, work, step):  # every update here is finite: its tokens all count
            self.now += update_s
            self.tokens.append(work.total)
            self.flops.append(work.flops)
            return real_update(updater, work, step)

        def validate(*args):
            self.now += valid_s
            return real_validate(*args)

        def save(*args):
            self.now += save_s
            return real_save(*args)

        monkeypatch.setattr(Updater, "__call__", update)
        monkeypatch.setattr(validation.Validator, "__call__", validate)
        monkeypatch.setattr(train.checkpoint, "save", save)


def test_logged_throughput_leaves_out_validation_and_saving(tmp_path, monkeypatch):
    """A window of updates with a slow validation and saves in it logs the speed of its updates alone."""
    clock = HandClock(monkeypatch, update_s=1.0, valid_s=100.0, save_s=100.0)
    cfg = tiny_config(tmp_path, train={"max_steps": 4, "log_every": 2, "eval_every": 3, "save_every": 3})
    run_trainer(cfg)
    log = [json.loads(line) for line in (cfg.out_dir / "log.jsonl").read_text().splitlines()]
    first, last = [e for e in log if e["kind"] == "train"]
    assert (first["step"], last["step"]) == (2, 4)
    # Updates 3 and 4 took a second each; validation, best/ and step_3 took 300 s between them.
    assert first["target_tokens_per_s"] == pytest.approx(sum(clock.tokens[:2]) / 2.0)
    assert last["target_tokens_per_s"] == pytest.approx(sum(clock.tokens[2:]) / 2.0)


def test_with_a_card_s_peak_each_record_logs_model_flops_per_second_and_mfu(tmp_path, monkeypatch, tiny_run):
    """The model FLOPs of a window's updates over its seconds, and over the peak (a CPU has none: here one is given,
    and tiny_run, on the CPU, logs no MFU)."""
    clock = HandClock(monkeypatch, update_s=1.0)
    monkeypatch.setattr(bookkeeping.mfu, "bf16_peak", lambda device: (1e9, "a test card"))
    cfg = tiny_config(tmp_path, train={"max_steps": 4, "log_every": 2, "eval_every": 4, "save_every": 4})
    messages: list[str] = []
    run_trainer(cfg, log=messages.append)
    log = [json.loads(line) for line in (cfg.out_dir / "log.jsonl").read_text().splitlines()]
    first, last = [e for e in log if e["kind"] == "train"]
    assert first["model_tflops_per_s"] == pytest.approx(sum(clock.flops[:2]) / 2.0 / 1e12)
    assert last["mfu"] == pytest.approx(sum(clock.flops[2:]) / 2.0 / 1e9)
    start = next(e for e in log if e["kind"] == "start")
    assert (start["peak_tflops"], start["peak_source"]) == (1e-3, "a test card")
    assert any("a test card" in m for m in messages)
    cpu = [json.loads(line) for line in (tiny_run.run_dir / "log.jsonl").read_text().splitlines()]
    assert not any("mfu" in e for e in cpu)


def test_time_split_of_a_resumed_run_counts_both_parts(tmp_path, monkeypatch):
    """A slow validation just before the last save stays in the clock the resumed run goes on from."""
    HandClock(monkeypatch, update_s=1.0, valid_s=100.0)
    run_trainer(tiny_config(tmp_path, train={"max_steps": 2, "eval_every": 2, "save_every": 2}))
    cfg = tiny_config(tmp_path, train={"max_steps": 4, "eval_every": 2, "save_every": 2})
    run_trainer(cfg, resume=True)
    log = [json.loads(line) for line in (cfg.out_dir / "log.jsonl").read_text().splitlines()]
    first, second = [e for e in log if e["kind"] == "end"]
    assert (first["seconds"], first["train_s"], first["valid_s"], first["save_s"]) == (102.0, 2.0, 100.0, 0.0)
    assert (second["seconds"], second["train_s"], second["valid_s"], second["save_s"]) == (204.0, 4.0, 200.0, 0.0)


def test_several_directions_train_together_validate_each_and_keep_the_best_of_their_mean(tmp_path):
    """de-en and en-de in one model: each epoch's draw is logged; each validation scores both directions and best/
    holds the step whose mean BLEU was highest."""
    cfg = tiny_config(tmp_path, data={"directions": ["de-en", "en-de"]}, train={"max_steps": 6, "eval_every": 2})
    messages: list[str] = []
    run_trainer(cfg, log=messages.append)
    log = [json.loads(line) for line in (cfg.out_dir / "log.jsonl").read_text().splitlines()]
    epochs = [e for e in log if e["kind"] == "epoch"]
    assert epochs and epochs[0]["drawn"] == {"de-en": 581, "en-de": 581}
    assert "epoch 1: de-en 581 pairs, en-de 581 pairs" in messages
    valid = [e for e in log if e["kind"] == "valid"]
    for e in valid:
        assert e["valid_bleu"] == pytest.approx((e["valid_bleu_de-en"] + e["valid_bleu_en-de"]) / 2)
    best = max(valid, key=lambda e: e["valid_bleu"])
    assert json.loads((cfg.out_dir / "best" / "meta.json").read_text())["step"] == best["step"]


def test_synthetic_pairs_are_drawn_with_the_real_ones_and_the_draw_is_logged(tmp_path):
    bt = tmp_path / "bt"
    bt.mkdir()
    (bt / "train.de").write_text("Ein Hund läuft.\nZwei Katzen.\n", encoding="utf-8")
    (bt / "train.en").write_text("A dog runs.\nTwo cats.\n", encoding="utf-8")
    cfg = tiny_config(tmp_path, data={"synthetic": str(bt)}, train={"max_steps": 2})
    messages: list[str] = []
    assert run_trainer(cfg, log=messages.append).state.step == 2
    assert "epoch 1: de-en 581 pairs, de-en synthetic 2 pairs" in messages
