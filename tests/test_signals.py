"""SIGINT and SIGTERM during training: the update in flight is finished and saved, a second signal stops at once.

``tfm train`` subprocesses get real signals; the second-signal case runs in this process, the two signals
raised inside one update, so that both land there however fast the machine trains.
"""

import signal
from itertools import count

import pytest
from cli_helpers import Proc, last_step, run_of, train, train_steps
from events import INSTALLED, assert_events_match_log
from tiny import assert_resumable, run_trainer, step_of, tiny_config

from transformer import checkpoint
from transformer.training.signals import StopSignals
from transformer.training.update import Updater


def _stop_with(proc: Proc, run, sig: signal.Signals, code: int, after_step: int):
    """Send ``sig`` once training passed ``after_step``; check the exit code and the one checkpoint it saved."""
    proc.wait_for(lambda: last_step(run) >= after_step, f"update {after_step}")
    proc.p.send_signal(sig)
    assert proc.finish() == code, proc.stderr
    assert "Traceback" not in proc.stderr and f"{sig.name}: finishing this update" in proc.stderr
    stopped_at = last_step(run)
    newest = checkpoint.step_dirs(run)[-1]
    assert step_of(newest) == stopped_at  # the update in flight was finished, logged and saved
    assert_resumable(newest, stopped_at)
    return newest


def test_sigint_and_sigterm_save_a_resumable_checkpoint_and_resume_continues(tmp_path):
    """SIGINT -> exit 130 and a checkpoint; ``--resume`` goes on from it; SIGTERM -> exit 143 and a checkpoint."""
    run = run_of(tmp_path)
    first = _stop_with(train(tmp_path), run, signal.SIGINT, 130, after_step=3)
    k = step_of(first)
    again = train(tmp_path, "--resume", tag="resume")
    second = _stop_with(again, run, signal.SIGTERM, 143, after_step=k + 2)
    assert f"resumed from {first} at step {k}" in again.stderr
    assert train_steps(run) == list(range(1, step_of(second) + 1))  # no update repeated, none lost
    if INSTALLED:  # TensorBoard's events, flushed at each stop, hold the same steps once each
        assert_events_match_log(run)


def test_second_sigint_stops_at_once_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    real, calls = Updater.micro_loss, count(1)
    before = signal.getsignal(signal.SIGINT)

    def interrupted(self, batch, total):  # one micro-batch per update here: the 4th call is update 4
        if next(calls) == 4:
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
        return real(self, batch, total)

    monkeypatch.setattr(Updater, "micro_loss", interrupted)
    cfg = tiny_config(tmp_path, train={"max_steps": 50, "save_every": 2, "eval_every": 1000, "keep_last": 5})
    messages: list[str] = []
    with pytest.raises(SystemExit) as stopped:
        run_trainer(cfg, log=messages.append)
    assert stopped.value.code == 130
    assert "SIGINT: finishing this update" in messages[-2] and "second interrupt: stopping now" in messages[-1]
    assert [p.name for p in checkpoint.step_dirs(cfg.out_dir)] == ["step_2"]  # no save after the second signal
    assert_resumable(cfg.out_dir / "checkpoints" / "step_2", 2)
    if INSTALLED:  # the events of updates 1 to 3 are on disk, as log.jsonl's are
        assert_events_match_log(cfg.out_dir)
    assert signal.getsignal(signal.SIGINT) is before


def test_the_previous_handlers_return_after_the_block_even_on_an_error():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(RuntimeError), StopSignals(lambda msg: None) as stop:
        assert signal.getsignal(signal.SIGTERM) != before[signal.SIGTERM]
        signal.raise_signal(signal.SIGTERM)
        assert stop.signum == signal.SIGTERM and stop.exit_code() == 143
        raise RuntimeError
    assert {s: signal.getsignal(s) for s in before} == before


def test_ctrl_c_during_set_up_exits_130_and_a_plain_rerun_starts_afresh(tmp_path):
    """A signal while the data load (or tokenizer training) runs: no traceback, no update, nothing that blocks a
    rerun."""
    cfg = tiny_config(tmp_path)
    messages: list[str] = []
    before = signal.getsignal(signal.SIGINT)

    def log(msg: str) -> None:
        messages.append(msg)
        if msg.startswith("data:"):
            signal.raise_signal(signal.SIGINT)

    result = run_trainer(cfg, log=log)
    assert (result.reason, result.exit_code, result.state.step) == ("signal", 130, 0)
    assert "SIGINT: stopping once this set-up step ends" in "\n".join(messages)
    assert checkpoint.step_dirs(cfg.out_dir) == []
    messages.clear()
    assert run_trainer(cfg, log=messages.append).state.step == cfg.train.max_steps
    assert any("holds no checkpoint" in m for m in messages)
    assert signal.getsignal(signal.SIGINT) is before
