"""The early forecast of a long run: said when the rest would take over a day, with CPU-sized configs on a CPU."""

import signal

from tiny import run_trainer, tiny_config

from transformer.training.forecast import TIMED_UPDATES, duration, forecast


def test_a_run_of_weeks_on_a_cpu_is_said_with_the_cpu_configs():
    note = forecast(31.0, 99_990, "cpu")
    assert note.startswith(
        "at 31.00 s per update, the 99,990 updates left to train.max_steps would take about 35.9 days"
    )
    assert "multi30k-de-en" in note
    assert "CPU-sized" not in forecast(2.0, 100_000, "cuda")
    assert forecast(0.5, 100_000, "cpu") is None  # 14 hours: not worth a warning


def test_durations_read_in_the_largest_fitting_unit():
    assert [duration(s) for s in (600, 7200 * 1.5, 86400 * 3)] == ["10 minutes", "3.0 hours", "3.0 days"]


def test_training_says_it_once_after_the_first_updates(tmp_path):
    """A run that would outlast any machine: the forecast comes after 1 + TIMED_UPDATES updates (here Ctrl-C then
    ends it); a run with a time budget gets none."""
    cfg = tiny_config(tmp_path, train={"max_steps": 10**9, "eval_every": 10**6, "save_every": 10**6})
    messages: list[str] = []

    def log(msg: str) -> None:
        messages.append(msg)
        if "s per update" in msg:
            signal.raise_signal(signal.SIGINT)

    result = run_trainer(cfg, log=log)
    notes = [m for m in messages if "s per update" in m]
    assert len(notes) == 1 and "on a CPU use a CPU-sized config" in notes[0]
    assert result.state.step == 1 + TIMED_UPDATES and result.exit_code == 130
    timed = tiny_config(tmp_path / "timed", train={"max_steps": 10**9, "max_minutes": 0.02, "eval_every": 10**6})
    messages.clear()
    run_trainer(timed, log=messages.append)
    assert not any("s per update" in m for m in messages)
