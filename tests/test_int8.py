"""int8 decoding: a copy with int8 Linear weights computes what the fp32 model does, within int8's rounding."""

import pytest
import torch
from tiny import tiny_config

from transformer.decoding.int8 import Int8Linear, check_int8, int8_copy
from transformer.errors import ConfigError
from transformer.model.transformer import StackedLinear, build_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    cfg = tiny_config(tmp_path_factory.mktemp("int8"))
    torch.manual_seed(0)
    return build_model(cfg.model, 60, 0).eval()


def test_int8_linear_is_close_to_the_fp32_one_and_its_parts_are_its_rows():
    torch.manual_seed(0)
    linear = StackedLinear(64, 3 * 64)
    parts = (slice(0, 64), slice(64, 192))
    q = Int8Linear(linear, parts)
    x = torch.randn(7, 5, 64)
    want, got = linear(x).detach(), q(x)
    assert got.shape == want.shape
    assert (got - want).abs().max() < 0.02 * want.abs().max()
    for rows in parts:  # each part is packed from the same rows and scales: the same numbers as the whole's rows
        torch.testing.assert_close(q.part(x, rows), got[..., rows], rtol=0, atol=1e-5)


def test_copy_replaces_every_linear_and_leaves_the_model_alone(model):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q = int8_copy(model)
    assert not [m for m in q.modules() if isinstance(m, torch.nn.Linear)]
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len([m for m in q.modules() if isinstance(m, Int8Linear)]) == len(linears)
    assert model.generator.weight is model.src_embed.weight  # still tied, still fp32
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_logits_and_decoding_steps_follow_the_fp32_model(model):
    torch.manual_seed(1)
    src = torch.randint(4, 60, (3, 9))
    src[0, 6:] = 0  # padding
    tgt = torch.randint(4, 60, (3, 6))
    q = int8_copy(model)
    with torch.inference_mode():
        want, got = model(src, tgt), q(src, tgt)
        assert (got - want).abs().max() < 0.05 * want.abs().max()
        state = q.start_state(*q.encode(src))  # the incremental path, through in_proj's parts
        steps = torch.stack([q.decode_step(tgt[:, t], state) for t in range(tgt.size(1))], 1)
    assert (steps - want).abs().max() < 0.05 * want.abs().max()


def test_int8_is_refused_off_the_cpu_in_one_line():
    check_int8(torch.device("cpu"))
    with pytest.raises(ConfigError, match="CPU only"):
        check_int8(torch.device("cuda"))
