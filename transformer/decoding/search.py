"""Greedy search, beam search and sampling over the model's incremental decoder: choices over one loop, batched over
sentences and their rows.

Knows nothing of files, tokenizers or the CLI: token ids in, hypotheses out. The model needs ``pad_id``, ``encode``,
``start_state(memory, src_keep)`` (one row per sentence) and ``decode_step``, as
transformer.model.transformer.Transformer has, and its state needs ``select(rows, sentences)``. A model with a
``vocab`` (ascending target ids holding <END>, the specials and any prefix's tokens: a lexical shortlist's,
decoding.shortlist.Shortlisted) scores those alone: its steps' logits are over them, the choices are made over them,
and each pick is mapped back to its id. Each sentence may produce at most max_len = a * src_len + b tokens before
<END>, which is forced after them. <PAD> and <START> are never generated; a forced prefix (a sentence's first tokens,
given) is generated first.

The loop (``_decode``), as fairseq's generator: score the next token of every live row (``_Scorer``: the model's
log-probabilities under those rules), let the choice name each row's m candidates (``Beam``: its m best; ``Sample``:
one drawn), keep per sentence the best k candidates that do not end as its next rows, finalize those among the best
k that end in <END>, and let a sentence leave once it has k finished hypotheses, reaches its max_len, or (beam search
given nbest and alpha) has nbest finished that no live row can still beat (``_settled``: the same result, sooner).
Greedy search is a beam of one. Live rows are ranked by log-probability; the GNMT length penalty
((5 + len) / 6) ** alpha, len counting <END>, divides a hypothesis's log-probability only when the finished ones are
ranked (``ranked``). Every choice depends on its own sentence's rows only, so results do not depend on batch size or
order. What the host decides on it reads of the device through ``host.to_host``, in one wait a step (two when
hypotheses end), and indices go back without waiting.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
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
    """A finished hypothesis's log-probability over the length penalty, its length counting <END>."""
    return hyp.log_prob / length_penalty(len(hyp.tokens) + 1, alpha)


def ranked(hyps: list[Hypothesis], alpha: float) -> list[Hypothesis]:
    """Finished hypotheses best first under length penalty alpha, each scored under it (ties keep their order)."""
    return sorted((dataclasses.replace(h, score=beam_score(h, alpha)) for h in hyps), key=lambda h: -h.score)


def max_output_lengths(src_lengths: Tensor, max_len_a: float, max_len_b: int) -> Tensor:
    """Most tokens each sentence may produce before the forced <END>: floor(a * src_len + b)."""
    return (src_lengths.double() * max_len_a + max_len_b).floor().long().clamp(min=0)


# ----- the choices ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Beam:
    """Beam search of width ``k``: each row's m best next tokens are its candidates (k = 1 is greedy search)."""

    k: int

    @property
    def candidates(self) -> int:
        """Candidates per row: with 2k, k that do not end are left whatever ends (a single row needs one)."""
        return 1 if self.k == 1 else 2 * self.k

    def pick(self, lprobs: Tensor, m: int, sentences: list[int], width: int) -> tuple[Tensor, Tensor]:
        """The m most probable tokens of each row and their log-probabilities; with fewer than m tokens in the
        vocabulary, the missing columns repeat the best token at -inf."""
        V = lprobs.size(1)
        values, ids = row_topk(lprobs, min(m, V)) if m > 1 else lprobs.max(dim=1, keepdim=True)
        if m > V:
            values = torch.cat([values, values.new_full((values.size(0), m - V), float("-inf"))], 1)
            ids = torch.cat([ids, ids[:, :1].expand(-1, m - V)], 1)
        return values, ids


@dataclass(frozen=True)
class Sample:
    """Sampling: each row's next token drawn from the model's distribution, its logits over ``temperature``, cut to
    the ``top_k`` most probable (0: all) and to the smallest set holding ``top_p`` of the probability. ``generators``
    holds each sentence's own random generator (on the CPU), so that a sentence draws the same whatever else is in
    its batch. A hypothesis's score is the model's log-probability of what was drawn (untempered)."""

    generators: Sequence[torch.Generator]
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    k: int = 1
    candidates: int = 1

    def pick(self, lprobs: Tensor, m: int, sentences: list[int], width: int) -> tuple[Tensor, Tensor]:
        """One token per row drawn (inverse CDF of a uniform from the generator of the row's sentence: ``width``
        consecutive rows per sentence of ``sentences``), and its log-probability under the model."""
        rows = [s for s in sentences for _ in range(width)]
        logits = lprobs / self.temperature
        if 0 < self.top_k < logits.size(1):
            kth = logits.topk(self.top_k, dim=1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = logits.softmax(dim=1)
        if self.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=1, descending=True)
            before = sorted_probs.cumsum(1) - sorted_probs  # the mass of the tokens more probable than each
            sorted_probs = sorted_probs.masked_fill(before >= self.top_p, 0.0)
            probs = torch.zeros_like(probs).scatter_(1, order, sorted_probs)
        u = torch.tensor([torch.rand((), generator=self.generators[r]).item() for r in rows], device=probs.device)
        ids = inverse_cdf(probs, u)
        return lprobs.gather(1, ids), ids


def inverse_cdf(probs: Tensor, u: Tensor) -> Tensor:
    """The token [rows, 1] each row's uniform draw u in [0, 1) names: the first whose cumulative probability exceeds
    u times the row's total, so a token of probability 0 is never drawn (not at u = 0, nor where rounding takes the
    product to the total)."""
    cdf = probs.cumsum(dim=1)
    ids = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True)
    last = probs.size(1) - 1 - (probs > 0).flip(1).to(torch.uint8).argmax(dim=1, keepdim=True)  # last drawable
    return torch.minimum(ids, last)


Choice = Beam | Sample


# ----- the loop ------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
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


class _Scorer:
    """Scores the next token of each live row: encoding, per-sentence length limits and forced prefixes, the model's
    next-token log-probabilities under them."""

    def __init__(
        self,
        model: nn.Module,
        src: Tensor,
        start_id: int,
        end_id: int,
        max_len_a: float,
        max_len_b: int,
        prefixes: Sequence[Sequence[int]] | None,
    ):
        self.model, self.end_id = model, end_id
        self.vocab: Tensor | None = getattr(model, "vocab", None)  # the ids its steps score, or the whole vocabulary
        lengths = max_output_lengths((src != model.pad_id).sum(1), max_len_a, max_len_b)
        max_lens, *listed = host.to_host(lengths, *([] if self.vocab is None else [self.vocab]))
        self.max_lens: list[int] = max_lens.tolist()
        self.columns = {int(t): i for i, t in enumerate(listed[0].tolist())} if listed else None
        banned = [self.column(t) for t in (model.pad_id, start_id) if self.columns is None or t in self.columns]
        self.banned = host.to_device(banned, torch.long, src.device)
        self.prefixes = [list(p) for p in prefixes] if prefixes is not None and any(prefixes) else None
        self.state = model.start_state(*model.encode(src))

    def column(self, token: int) -> int:
        """Where ``token`` lies in a step's scores."""
        return token if self.columns is None else self.columns[token]

    def ids(self, columns: Tensor) -> Tensor:
        """The token ids of columns of a step's scores."""
        return columns if self.vocab is None else self.vocab[columns]

    def lprobs(self, tokens: Tensor, step: int, sentences: list[int], width: int) -> Tensor:
        """Log-probabilities [rows, V] of each live row's next token after ``tokens`` (V: the model's vocabulary, or
        its ``vocab`` alone); ``width`` consecutive rows per sentence. <PAD> and <START> are -inf; a sentence at its
        length limit may only end; one inside its prefix may only continue it."""
        lprobs = F.log_softmax(self.model.decode_step(tokens, self.state).float(), dim=-1)
        lprobs.index_fill_(1, self.banned, float("-inf"))
        if self.prefixes is None:
            forced = [self.end_id if step >= self.max_lens[s] else None for s in sentences]
        else:
            forced = [self.end_id if step >= self.max_lens[s] else self._prefix(s, step) for s in sentences]
        if any(f is not None for f in forced):
            rows = [(i, self.column(f)) for i, f in enumerate(forced) if f is not None]
            index = host.to_device([i for i, _ in rows], torch.long, lprobs.device).repeat_interleave(width)
            keep = host.to_device([f for _, f in rows], torch.long, lprobs.device).repeat_interleave(width)
            index = index * width + torch.arange(width, device=lprobs.device).repeat(len(rows))
            kept = lprobs[index, keep]
            lprobs[index] = float("-inf")
            lprobs[index, keep] = kept
        return lprobs

    def _prefix(self, sentence: int, step: int) -> int | None:
        prefix = self.prefixes[sentence]  # type: ignore[index]
        return prefix[step] if step < len(prefix) else None


def _settled(
    scorer: _Scorer, finished: list[Hypothesis], best_live: float, sentence: int, nbest: int, alpha: float
) -> bool:
    """Whether no live row of ``sentence`` can enter its nbest finished hypotheses any more.

    A live row's log-probability only falls as it grows, and its score is highest if it ends at the longest length
    allowed, where the length penalty is largest: best_live divided by that penalty bounds every hypothesis still to
    finish. Stopping then returns the same nbest as decoding on until k hypotheses finish, in fewer steps.
    """
    if len(finished) < nbest:
        return False
    nth = sorted((beam_score(h, alpha) for h in finished), reverse=True)[nbest - 1]
    return best_live / length_penalty(scorer.max_lens[sentence] + 1, alpha) < nth


def _decode(
    model: nn.Module,
    src: Tensor,
    start_id: int,
    end_id: int,
    choice: Choice,
    max_len_a: float,
    max_len_b: int,
    settle: tuple[int, float] | None = None,
    prefixes: Sequence[Sequence[int]] | None = None,
) -> list[list[Hypothesis]]:
    """The finished hypotheses of each sentence of src [B, S] (right-padded), in the order they finished, scored by
    log-probability. With ``settle`` (nbest, alpha), a sentence also leaves once no live row can enter its nbest
    under alpha (``_settled``): fewer hypotheses, the same nbest."""
    if src.size(0) == 0:
        return []
    n, device, k = src.size(0), src.device, choice.k
    with torch.inference_mode(), eval_mode(model):
        scorer = _Scorer(model, src, start_id, end_id, max_len_a, max_len_b, prefixes)
        sentences = list(range(n))
        finished: list[list[Hypothesis]] = [[] for _ in sentences]
        # The first step decodes one row per sentence (its k rows would all be <START>), then widens to k.
        width = 1
        scores = torch.zeros((n, width), device=device)
        tokens = src.new_full((n,), start_id)
        seq = src.new_empty((n, 0))
        seq_lp = torch.empty((n, 0), device=device)
        step = 0
        while sentences:
            n = len(sentences)
            # score the next token, and let the choice name each row's candidates: a sentence's best continuations
            # are among each of its rows' own best
            lprobs = scorer.lprobs(tokens, step, sentences, width)
            best_lp, best_col = choice.pick(lprobs, choice.candidates, sentences, width)  # [n * width, m]
            best_tok = scorer.ids(best_col)
            inf = float("inf")
            best_lp = best_lp.nan_to_num(nan=-inf, posinf=-inf, neginf=-inf)  # a row turned NaN (half overflow)
            one = width * best_lp.size(1) == 1  # one row with one candidate a sentence (greedy, sampling)
            if one:  # the candidate is the sentence's best: its row goes on as it is
                top, cand, cand_lp = scores + best_lp, best_tok, best_lp
                is_end = cand == end_id
                scores = top
            else:
                m = best_lp.size(1)
                c = min(2 * k, width * m)  # a beam of k > 1 (k = 1 has one candidate a row)
                top, j = (scores.view(-1, 1) + best_lp).view(n, width * m).topk(c, dim=1)  # [n, c]
                rows = j // m + torch.arange(0, n * width, width, device=device)[:, None]  # each candidate's row
                cand = best_tok.view(n, -1).gather(1, j)
                cand_lp = best_lp.view(n, -1).gather(1, j)
                is_end = cand == end_id
                live = torch.sort(is_end.to(torch.uint8), dim=1, stable=True).indices[:, :k]  # first k not ending
                scores = top.gather(1, live)
            # What the host decides on, read in one wait: which of the first k candidates end and, to settle, each
            # sentence's best live row (top is sorted, so its first live one). What ended is read in a second.
            final, *best_live = host.to_host(is_end[:, :k] & top[:, :k].isfinite(), *([scores[:, 0]] if settle else []))
            if final.any():
                i, jj = final.nonzero(as_tuple=True)
                di, dj = (host.to_device(x.tolist(), torch.long, device) for x in (i, jj))
                r = di if one else rows[di, dj]
                ended = zip(*(t.tolist() for t in host.to_host(seq[r], seq_lp[r], cand_lp[di, dj], top[di, dj])))
                for s, (toks, lps, end_lp, log_prob) in zip(i.tolist(), ended):
                    finished[sentences[s]].append(Hypothesis(toks, log_prob, log_prob, lps + [end_lp]))
            best = best_live[0].tolist() if settle else []
            alive = [
                s
                for s in range(n)
                if len(finished[sentences[s]]) < k
                and step < scorer.max_lens[sentences[s]]
                and not (settle and _settled(scorer, finished[sentences[s]], best[s], sentences[s], *settle))
            ]
            keep = None
            if len(alive) < n:
                keep = host.to_device(alive, torch.long, device)
                scores, cand, cand_lp = scores[keep], cand[keep], cand_lp[keep]
                if not one:
                    live, rows = live[keep], rows[keep]
                sentences = [sentences[s] for s in alive]
            if one:
                flat, tokens, token_lp = keep, cand.view(-1), cand_lp
            else:
                flat, tokens = rows.gather(1, live).view(-1), cand.gather(1, live).view(-1)
                token_lp = cand_lp.gather(1, live)
            if flat is not None:  # None: every row goes on as it is
                scorer.state.select(flat, keep)
            width = k
            seq = torch.cat([seq if flat is None else seq[flat], tokens[:, None]], 1)
            seq_lp = torch.cat([seq_lp if flat is None else seq_lp[flat], token_lp.view(-1, 1)], 1)
            step += 1
    return finished


# ----- the searches ---------------------------------------------------------------------------------------------------


def greedy_search(
    model: nn.Module,
    src: Tensor,
    start_id: int,
    end_id: int,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    alpha: float = 0.6,
    prefixes: Sequence[Sequence[int]] | None = None,
) -> list[Hypothesis]:
    """The most probable next token at every step (a beam of one), for each sentence of src [B, S] (right-padded);
    alpha only sets how ``score`` is normalised, so that it compares with beam search's."""
    finished = _decode(model, src, start_id, end_id, Beam(1), max_len_a, max_len_b, prefixes=prefixes)
    return [_first(hyps, alpha) for hyps in finished]


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
    prefixes: Sequence[Sequence[int]] | None = None,
) -> list[list[Hypothesis]]:
    """The nbest best hypotheses of each sentence of src [B, S] (right-padded), best first; nbest is 1 to beam, as the
    Translator's settings are checked (config.check_decode)."""
    finished = _decode(model, src, start_id, end_id, Beam(beam), max_len_a, max_len_b, (nbest, alpha), prefixes)
    return [ranked(hyps, alpha)[:nbest] for hyps in finished]


def beam_finished(
    model: nn.Module,
    src: Tensor,
    start_id: int,
    end_id: int,
    beam: int,
    max_len_a: float,
    max_len_b: int,
    prefixes: Sequence[Sequence[int]] | None = None,
) -> list[list[Hypothesis]]:
    """Every hypothesis beam search finishes for each sentence of src when it decodes until k have finished.

    Which hypotheses finish does not depend on the length penalty, which only ranks them: ``ranked(hyps,
    alpha)[:nbest]`` of these is ``beam_search`` at that alpha, so one search serves a grid of penalties.
    """
    return _decode(model, src, start_id, end_id, Beam(beam), max_len_a, max_len_b, None, prefixes)


def sample(
    model: nn.Module,
    src: Tensor,
    start_id: int,
    end_id: int,
    choice: Sample,
    alpha: float = 0.6,
    max_len_a: float = 1.0,
    max_len_b: int = 50,
    prefixes: Sequence[Sequence[int]] | None = None,
) -> list[Hypothesis]:
    """One drawn translation of each sentence of src [B, S] (right-padded; ``choice.generators`` holds one generator
    per sentence), scored as greedy search scores."""
    finished = _decode(model, src, start_id, end_id, choice, max_len_a, max_len_b, prefixes=prefixes)
    return [_first(hyps, alpha) for hyps in finished]


def _first(hyps: list[Hypothesis], alpha: float) -> Hypothesis:
    """The one hypothesis a row finished, scored under alpha; none (every token non-finite: a model that overflowed)
    is the empty translation at -inf."""
    return ranked(hyps, alpha)[0] if hyps else Hypothesis([], float("-inf"), float("-inf"), [])
