"""The trainer state a checkpoint keeps: it comes back whole, and a checkpoint saved before time was split says so."""

import torch

from transformer.training.train_state import TrainState, capture, restore


def _optimizer():
    return torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))])


def test_restore_gives_back_what_capture_saved():
    state = TrainState(step=7, epoch=1, last_finite_loss=2.5, elapsed=30.0, valid_s=4.0, save_s=1.0, target_tokens=900)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    assert restore(capture(state, _optimizer(), scaler), _optimizer(), scaler) == state


def test_checkpoint_from_before_the_time_split_starts_the_split_where_it_resumes():
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    saved = capture(TrainState(step=250, elapsed=600.0), _optimizer(), scaler)
    for key in ("valid_s", "save_s", "split_from_step", "split_from_s"):
        del saved["state"][key]
    state = restore(saved, _optimizer(), scaler)
    assert (state.step, state.split_from_step, state.split_from_s, state.valid_s) == (250, 250, 600.0, 0.0)
