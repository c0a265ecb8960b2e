"""Logits of a model's incremental decoding steps, for tests that compare two ways of taking them."""

from __future__ import annotations

import torch


def step_logits(model, src: torch.Tensor, tokens: torch.Tensor, beam: int) -> torch.Tensor:
    """Logits of len(tokens) steps; with beam > 1 each sentence widens to beam rows after the first step."""
    with torch.inference_mode():
        state = model.start_state(*model.encode(src))
        out = [model.decode_step(tokens[: src.size(0), 0], state)]
        if beam > 1:
            state.select(torch.arange(src.size(0)).repeat_interleave(beam))
        out += [model.decode_step(tokens[:, t], state) for t in range(1, tokens.size(1))]
    return torch.cat(out)


def small_model(norm_first: bool = False, tie: bool = True, d_model: int = 32):
    """A seeded 2-layer model over 50 tokens with a position table of 8 (steps past it compute their positions)."""
    from transformer.config import ModelConfig
    from transformer.model.transformer import Transformer

    torch.manual_seed(0)
    cfg = ModelConfig(N=2, d_model=d_model, d_ff=64, h=4, norm_first=norm_first, tie_embeddings=tie, max_positions=8)
    return Transformer(cfg, 50, 0).eval()
