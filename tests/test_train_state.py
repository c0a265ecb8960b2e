"""The trainer state a checkpoint keeps: it comes back whole, and one saved by earlier code still loads."""

import torch

from transformer.training.train_state import TrainState, capture, restore


def _optimizer():
    return torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))])


def test_restore_gives_back_what_capture_saved():
    state = TrainState(step=7, epoch=1, last_finite_loss=2.5, elapsed=30.0, valid_s=4.0, save_s=1.0, target_tokens=900)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    assert restore(capture(state, _optimizer(), scaler), _optimizer(), scaler) == state


def test_state_saved_by_earlier_code_loads_without_its_retired_fields():
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    saved = capture(TrainState(step=250, elapsed=600.0, valid_s=40.0), _optimizer(), scaler)
    saved["state"] |= {"split_from_step": 100, "split_from_s": 240.0}  # fields trainer.pt held before
    del saved["state"]["save_s"]  # and one it did not hold yet
    state = restore(saved, _optimizer(), scaler)
    assert (state.step, state.elapsed, state.valid_s, state.save_s) == (250, 600.0, 40.0, 0.0)
