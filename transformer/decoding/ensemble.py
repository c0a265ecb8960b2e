"""Several trained models decoding as one (fairseq's ``--path a.pt:b.pt``, Marian's ``--models``).

Each step's next-token distribution is the mean of the members' probabilities, log(1/n sum_i p_i), as fairseq's
EnsembleModel takes it. The mean of probabilities (not of log-probabilities, which would multiply the members'
distributions) keeps the mass of a token that one member rules out and the others favour, so that independently
trained models cover each other's mistakes. It is summed as probabilities in fp32 (each member's softmax) and its log
taken once, a few passes over [rows, vocabulary] where logsumexp over the stacked log-probabilities (fairseq's way)
takes several times as many; only a token below fp32's smallest probability in every member differs (-inf, where
logsumexp would give a log-probability under -100), and no search would choose it. Each member
encodes the source and keeps its own incremental state through its own step; the search reorders all the states
together. Members must share the tokenizer and the language pair; their shapes, depth and the precision they
trained in may differ (they decode in one).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from transformer.checkpoint import Loaded
from transformer.errors import ConfigError
from transformer.model.transformer import Transformer


class EnsembleState:
    """Each member's own decoder state, reordered together."""

    def __init__(self, states: list) -> None:
        self.states = states

    def select(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep rows ``rows`` and sentences ``sentences`` in every member's state (DecoderState.select)."""
        for state in self.states:
            state.select(rows, sentences)


class Ensemble(nn.Module):
    """Members decoding as one model, as the search sees it: ``encode``, ``start_state`` and ``decode_step``."""

    def __init__(self, members: Sequence[Transformer]) -> None:
        """``members``: models as they decode (model.decoding_copy), whose modules no one else holds; the ensemble
        is in eval mode from the start, so no search ever switches them."""
        super().__init__()
        self.members = nn.ModuleList(members)
        self.pad_id = members[0].pad_id
        self.eval()

    def encode(self, src: Tensor) -> tuple[list[Tensor], Tensor]:
        """Each member's encoder output for src [B, S], and the source's keep mask (the same for all: one
        tokenizer)."""
        encoded = [member.encode(src) for member in self.members]
        return [memory for memory, _ in encoded], encoded[0][1]

    def start_state(self, memories: list[Tensor], src_keep: Tensor, vocab: Tensor | None = None) -> EnsembleState:
        """Each member's fresh state, one row per sentence (scoring ``vocab``'s target ids alone, if given)."""
        return EnsembleState([m.start_state(memory, src_keep, vocab) for m, memory in zip(self.members, memories)])

    def decode_step(self, tokens: Tensor, state: EnsembleState) -> Tensor:
        """Log of the members' mean next-token probabilities [R, V] after ``tokens`` [R]: normalised log-probabilities
        are logits of the same distribution, so the search treats them as one model's."""
        probs = None
        for member, s in zip(self.members, state.states):
            p = member.decode_step(tokens, s).float().softmax(dim=-1)
            probs = p if probs is None else probs.add_(p)
        return probs.mul_(1 / len(self.members)).log_()


def check_members(members: Sequence[Loaded]) -> None:
    """Checkpoints that can decode together: one tokenizer, one language pair, one casing of the input; else one line
    naming the two checkpoints and what differs."""
    first = members[0]
    for other in members[1:]:
        pair = f"checkpoints {first.path} and {other.path}"
        a, b = first.cfg.data, other.cfg.data
        if (a.pairs(), a.tagged) != (b.pairs(), b.tagged):
            named = [", ".join(f"{s}->{t}" for s, t in d.pairs()) + (" (tagged)" if d.tagged else "") for d in (a, b)]
            raise ConfigError(
                f"{pair} translate {named[0]} and {named[1]}; an ensemble's models translate the same directions"
            )
        if first.tokenizer.fingerprint() != other.tokenizer.fingerprint():
            raise ConfigError(
                f"{pair} have different tokenizers (fingerprints {first.tokenizer.fingerprint()[:12]} and "
                f"{other.tokenizer.fingerprint()[:12]}); an ensemble's models share one: train them on the same data "
                "with the same tokenizer settings (the seed may differ)"
            )
        if a.lowercase != b.lowercase:
            raise ConfigError(
                f"{pair} were trained on {'lowercased' if a.lowercase else 'cased'} and "
                f"{'lowercased' if b.lowercase else 'cased'} text; an ensemble's models read their input alike"
            )
