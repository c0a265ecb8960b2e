"""Scoring given translations (``tfm score``): each target's log-probability under the model, fed to it token by token
through the same incremental step the search decodes with, so that a translation tfm produced scores exactly what
the search scored it (forced decoding)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.decoding.search import eval_mode, length_penalty


@dataclass
class Scored:
    """One target's token ids (without <END>), the log-probability of each and of <END>, their sum, and that sum
    over the GNMT length penalty (the score translate prints)."""

    tokens: list[int]
    token_log_probs: list[float]
    log_prob: float
    score: float


def forced_scores(
    model: nn.Module, src: Tensor, targets: Sequence[Sequence[int]], start_id: int, end_id: int, alpha: float
) -> list[Scored]:
    """Each target of the sentences of src [B, S] (right-padded) scored under ``model``, <END> included."""
    n, device = src.size(0), src.device
    longest = max(len(t) for t in targets) + 1
    inputs = torch.full((n, longest), model.pad_id, dtype=torch.long)
    outputs = torch.full((n, longest), model.pad_id, dtype=torch.long)
    for i, target in enumerate(targets):
        inputs[i, : len(target) + 1] = torch.tensor([start_id, *target])
        outputs[i, : len(target) + 1] = torch.tensor([*target, end_id])
    inputs, outputs = inputs.to(device), outputs.to(device)
    lps = torch.empty((n, longest), device=device)
    with torch.inference_mode(), eval_mode(model):
        state = model.start_state(*model.encode(src))
        for step in range(longest):  # rows whose target ended take <PAD>, whose scores are not read
            lprobs = F.log_softmax(model.decode_step(inputs[:, step], state).float(), dim=-1)
            lps[:, step] = lprobs.gather(1, outputs[:, step : step + 1])[:, 0]
    out = []
    for i, (target, row) in enumerate(zip(targets, lps.tolist())):
        token_lps = row[: len(target) + 1]
        log_prob = sum(token_lps)
        out.append(Scored(list(target), token_lps, log_prob, log_prob / length_penalty(len(target) + 1, alpha)))
    return out
