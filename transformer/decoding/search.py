"""Greedy and beam search over the model's incremental decoder, batched over sentences and beams.

Knows nothing of files, tokenizers or the CLI: token ids in, hypotheses out. The model needs
``pad_id``, ``encode``, ``start_state(memory, src_keep)`` (one row per sentence) and ``decode_step``,
as transformer.model.transformer.Transformer has, and its state needs ``select(rows, sentences)``. Each sentence
may produce at most max_len = a * src_len + b tokens before <END>, which is forced after them.
<PAD> and <START> are never generated.

Beam search follows fairseq: the top 2k candidates per sentence; those among the first k that end in
<END> are finalized (frozen), the first k others form the next beam, and a sentence leaves the batch
once it has k finished hypotheses, reaches its max_len, or has nbest finished that no live beam can
still beat (``_Search.settled``: the same result, sooner). Live beams are ranked by log-probability;
the GNMT length penalty ((5 + len) / 6) ** alpha, len counting <END>, divides a hypothesis's
log-probability only when the finished hypotheses are ranked (``ranked``). Every choice depends on its
own sentence's rows only, so results do not depend on batch size or order. What the host decides on it reads of the
device through ``host.to_host``, in one wait a step (two when hypotheses end), and indices go back without waiting.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.decoding import host
from transformer.decoding.topk import row_topk


@dataclass
class Hypothesis:
    """One output sentence: tokens without <START> and <END>; scores include the <END> step."""

    tokens: list[int]
    score: float
    log_prob: float
    positional_scores: list[float]


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al., 2016)."""
    return ((5 + length) / 6) ** alpha


def beam_score(hyp: Hypothesis, alpha: float) -> float:
    """A finished beam hypothesis's log-probability over the length penalty, its length counting <END>."""
    return hyp.log_prob / length_penalty(len(hyp.tokens) + 1, alpha)


def ranked(hyps: list[Hypothesis], alpha: float) -> list[Hypothesis]:
    """Finished beam hypotheses best first under length penalty alpha, each scored under it (ties keep their order)."""
    return sorted((dataclasses.replace(h, score=beam_score(h, alpha)) for h in hyps), key=lambda h: -h.score)


def max_output_lengths(src_lengths: Tensor, max_len_a: float, max_len_b: int) -> Tensor:
    """Most tokens each sentence may produce before the forced <END>: floor(a * src_len + b)."""
    return (src_lengths.double() * max_len_a + max_len_b).floor().long().clamp(min=0)


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Run in eval mode (no dropout) and put back each module's own mode afterwards.

    A model whose own flag says eval is taken as in eval (decoding copies are, from construction: model.decoding_copy):
    setting the flag walks every submodule, which for a search of one sentence costs about as much as one of its
    decoding steps.
    """
    if not model.training:
        yield
        return
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


class _Search:
    """What greedy and beam search share: encoding, per-sentence length limits, next-token log-probs."""

    def __init__(self, model: nn.Module, src: Tensor, start_id: int, end_id: int, max_len_a: float, max_len_b: int):
        self.model, self.end_id = model, end_id
        self.banned = host.to_device([model.pad_id, start_id], torch.long, src.device)
        (max_lens,) = host.to_host(max_output_lengths((src != model.pad_id).sum(1), max_len_a, max_len_b))
        self.max_lens: list[int] = max_lens.tolist()
        self.state = model.start_state(*model.encode(src))

    def settled(self, finished: list[Hypothesis], best_live: float, sentence: int, nbest: int, alpha: float) -> bool:
        """Whether no live beam of ``sentence`` can enter its nbest finished hypotheses any more.

        A live beam's log-probability only falls as it grows, and its score is highest if it ends at
        the longest length allowed, where the length penalty is largest: best_live divided by that
        penalty bounds every hypothesis still to finish. Stopping then returns the same nbest as
        decoding on until k hypotheses finish, in fewer steps.
        """
        if len(finished) < nbest:
            return False
        nth = sorted((beam_score(h, alpha) for h in finished), reverse=True)[nbest - 1]
        return best_live / length_penalty(self.max_lens[sentence] + 1, alpha) < nth

    def best(self, tokens: Tensor, step: int, sentences: list[int], width: int, m: int) -> tuple[Tensor, Tensor]:
        """Log-probs and ids [rows, m] of the m most probable next tokens; `width` consecutive rows per sentence.

        <PAD> and <START> are never chosen; a sentence at its length limit may only end. With fewer
        than m tokens in the vocabulary, the missing columns repeat the best token at -inf. A row with a
        NaN (half precision overflowing) turns NaN whole under log-softmax: its scores become -inf,
        cleaned in the m chosen values rather than in the whole [rows, V] tensor (a pass, 1-2% of a step).
        """
        lprobs = F.log_softmax(self.model.decode_step(tokens, self.state).float(), dim=-1)
        lprobs.index_fill_(1, self.banned, float("-inf"))
        at_max = [step >= self.max_lens[s] for s in sentences]
        if any(at_max):
            rows = host.to_device(at_max, torch.bool, lprobs.device).repeat_interleave(width)
            end = lprobs[:, self.end_id].clone()
            lprobs.masked_fill_(rows[:, None], float("-inf"))
            lprobs[:, self.end_id] = end
        V, inf = lprobs.size(-1), float("inf")
        values, ids = row_topk(lprobs, min(m, V)) if m > 1 else lprobs.max(dim=1, keepdim=True)
        if m > V:
            values = torch.cat([values, values.new_full((values.size(0), m - V), -inf)], 1)
            ids = torch.cat([ids, ids[:, :1].expand(-1, m - V)], 1)
        return values.nan_to_num_(nan=-inf, posinf=-inf, neginf=-inf), ids


def greedy_search(
    model: nn.Module,
    src: Tensor,
    start_id: int,
    end_id: int,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    alpha: float = 0.6,
) -> list[Hypothesis]:
    """The most probable next token at every step, for each sentence of src [B, S] (right-padded).

    alpha only sets how ``score`` is normalised, so that it compares with beam search's.
    """
    if src.size(0) == 0:
        return []
    with torch.inference_mode(), _eval_mode(model):
        search = _Search(model, src, start_id, end_id, max_len_a, max_len_b)
        sentences = list(range(src.size(0)))
        results: list[Hypothesis | None] = [None] * len(sentences)
        tokens = src.new_full((len(sentences),), start_id)
        seq = src.new_empty((len(sentences), 0))
        seq_lp = torch.empty((len(sentences), 0), device=src.device)
        step = 0
        while sentences:
            lp, tokens = (x[:, 0] for x in search.best(tokens, step, sentences, 1, 1))
            seq, seq_lp = torch.cat([seq, tokens[:, None]], 1), torch.cat([seq_lp, lp[:, None]], 1)
            (ended,) = host.to_host(tokens == end_id)
            done = [e or step >= search.max_lens[s] for e, s in zip(ended.tolist(), sentences)]
            if any(done):
                rows = [r for r, d in enumerate(done) if d]
                index = host.to_device(rows, torch.long, src.device)
                toks_lps = zip(*(t.tolist() for t in host.to_host(seq[index], seq_lp[index])))
                for r, (toks, lps) in zip(rows, toks_lps):
                    log_prob = sum(lps)
                    score = log_prob / length_penalty(len(toks), alpha)
                    results[sentences[r]] = Hypothesis(toks[:-1] if toks[-1] == end_id else toks, score, log_prob, lps)
                keep = [r for r, d in enumerate(done) if not d]
                index = host.to_device(keep, torch.long, src.device)
                search.state.select(index, index)
                seq, seq_lp, tokens = seq[index], seq_lp[index], tokens[index]
                sentences = [sentences[r] for r in keep]
            step += 1
    return results  # type: ignore[return-value]


def beam_search(
    model: nn.Module,
    src: Tensor,
    start_id: int,
    end_id: int,
    beam: int = 4,
    alpha: float = 0.6,
    nbest: int = 1,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
) -> list[list[Hypothesis]]:
    """The nbest best hypotheses of each sentence of src [B, S] (right-padded), best first; nbest is 1 to beam, as the
    Translator's settings are checked (config.check_decode)."""
    finished = _beam(model, src, start_id, end_id, beam, max_len_a, max_len_b, (nbest, alpha))
    return [ranked(hyps, alpha)[:nbest] for hyps in finished]


def beam_finished(
    model: nn.Module, src: Tensor, start_id: int, end_id: int, beam: int, max_len_a: float, max_len_b: int
) -> list[list[Hypothesis]]:
    """Every hypothesis beam search finishes for each sentence of src when it decodes until k have finished.

    Which hypotheses finish does not depend on the length penalty, which only ranks them: ``ranked(hyps,
    alpha)[:nbest]`` of these is ``beam_search`` at that alpha, so one search serves a grid of penalties.
    """
    return _beam(model, src, start_id, end_id, beam, max_len_a, max_len_b, None)


def _beam(
    model: nn.Module,
    src: Tensor,
    start_id: int,
    end_id: int,
    k: int,
    max_len_a: float,
    max_len_b: int,
    settle: tuple[int, float] | None,
) -> list[list[Hypothesis]]:
    """Beam search's finished hypotheses per sentence in the order they finished, scored by log-probability
    (alpha 0). With ``settle`` (nbest, alpha), a sentence also leaves once no live beam can enter its nbest under
    alpha (``_Search.settled``): fewer hypotheses, the same nbest."""
    if src.size(0) == 0:
        return []
    n, device = src.size(0), src.device
    with torch.inference_mode(), _eval_mode(model):
        search = _Search(model, src, start_id, end_id, max_len_a, max_len_b)
        sentences = list(range(n))
        finished: list[list[Hypothesis]] = [[] for _ in sentences]
        # The first step decodes one row per sentence (its k beams would all be <START>), then widens to k.
        width = 1
        scores = torch.zeros((n, width), device=device)
        tokens = src.new_full((n,), start_id)
        seq = src.new_empty((n, 0))
        seq_lp = torch.empty((n, 0), device=device)
        step = 0
        while sentences:
            n = len(sentences)
            # A sentence's best 2k continuations are among each of its beams' own best 2k tokens.
            best_lp, best_tok = search.best(tokens, step, sentences, width, 2 * k)  # [n * width, 2k]
            m = best_lp.size(1)
            top, j = (scores.view(-1, 1) + best_lp).view(n, width * m).topk(2 * k, dim=1)  # [n, 2k]
            rows = j // m + torch.arange(0, n * width, width, device=device)[:, None]  # beam row of each candidate
            cand = best_tok.view(n, -1).gather(1, j)
            cand_lp = best_lp.view(n, -1).gather(1, j)
            is_end = cand == end_id
            live = torch.sort(is_end.to(torch.uint8), dim=1, stable=True).indices[:, :k]  # first k not ending
            scores = top.gather(1, live)
            # What the host decides on, read in one wait: the first k candidates that end, their beams and scores, and
            # each sentence's best live beam (top is sorted, so its first live beam).
            final, end_rows, end_lps, end_tops, live_best = host.to_host(
                is_end[:, :k] & top[:, :k].isfinite(), rows[:, :k], cand_lp[:, :k], top[:, :k], scores[:, 0]
            )
            if final.any():
                i, j = final.nonzero(as_tuple=True)
                r = host.to_device(end_rows[i, j].tolist(), torch.long, device)
                toks_lps = zip(*(t.tolist() for t in host.to_host(seq[r], seq_lp[r])))
                for s, (toks, lps), end_lp, log_prob in zip(
                    i.tolist(), toks_lps, end_lps[i, j].tolist(), end_tops[i, j].tolist()
                ):
                    finished[sentences[s]].append(Hypothesis(toks, log_prob, log_prob, lps + [end_lp]))
            best_live = live_best.tolist()
            alive = [
                s
                for s in range(n)
                if len(finished[sentences[s]]) < k
                and step < search.max_lens[sentences[s]]
                and not (settle and search.settled(finished[sentences[s]], best_live[s], sentences[s], *settle))
            ]
            keep = None
            if len(alive) < n:
                keep = host.to_device(alive, torch.long, device)
                live, scores, rows, cand, cand_lp = live[keep], scores[keep], rows[keep], cand[keep], cand_lp[keep]
                sentences = [sentences[s] for s in alive]
            flat = rows.gather(1, live).view(-1)
            tokens = cand.gather(1, live).view(-1)
            search.state.select(flat, keep)
            width = k
            seq = torch.cat([seq[flat], tokens[:, None]], 1)
            seq_lp = torch.cat([seq_lp[flat], cand_lp.gather(1, live).view(-1, 1)], 1)
            step += 1
    return finished
