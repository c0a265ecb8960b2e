"""The learning-rate schedule: the paper's formula, and the peak form."""

import pytest

from transformer.config import TrainConfig
from transformer.training.schedule import learning_rate


def test_paper_schedule_peaks_at_warmup():
    t = TrainConfig(warmup=4000, lr_factor=1.0)
    peak = learning_rate(4000, t, 512)
    assert peak == pytest.approx(512**-0.5 * 4000**-0.5)
    assert learning_rate(2000, t, 512) == pytest.approx(peak / 2)
    assert learning_rate(16000, t, 512) == pytest.approx(peak / 2)


def test_peak_lr_form():
    t = TrainConfig(warmup=200, peak_lr=5e-4)
    assert learning_rate(200, t, 256) == pytest.approx(5e-4)
    assert learning_rate(100, t, 256) == pytest.approx(2.5e-4)
    assert learning_rate(800, t, 256) == pytest.approx(2.5e-4)
    assert learning_rate(0, t, 256) > 0
