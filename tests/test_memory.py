"""A model's memory judged from its shape before anything is allocated: the count is the model's own, and a model
that cannot fit is refused in one line."""

import pytest
import torch

from transformer.config import ModelConfig
from transformer.errors import ConfigError
from transformer.model.transformer import Transformer
from transformer.runtime.memory import check_fits, parameters


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
def test_the_count_is_the_models_own(tied, norm_first):
    shape = ModelConfig(N=2, d_model=32, d_ff=48, h=4, tie_embeddings=tied, norm_first=norm_first, max_positions=16)
    model = Transformer(shape, 300, 0)
    assert parameters(shape, 300) == sum(p.numel() for p in model.parameters())


def test_a_model_that_cannot_fit_is_refused_and_one_that_can_is_not():
    huge = ModelConfig(N=1000, d_model=65_536, d_ff=1_048_576, h=2)
    with pytest.raises(ConfigError, match=r"needs about [\d,.]+ GiB to train, and cpu has [\d,.]+ GiB free"):
        check_fits(huge, 8000, torch.device("cpu"), True, "the config's model")
    check_fits(ModelConfig(), 8000, torch.device("cpu"), False, "base")  # the paper's base model loads anywhere
