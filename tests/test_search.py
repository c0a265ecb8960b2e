"""Greedy and beam search: hand-checked beams, lengths, consistency across batchings, a model that learns."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer.config import ModelConfig
from transformer.decoding.search import (
    beam_finished,
    beam_search,
    greedy_search,
    length_penalty,
    max_output_lengths,
    ranked,
)
from transformer.model.transformer import Transformer

PAD, START, END, A, B = 0, 1, 2, 3, 4


class FixedModel(nn.Module):
    """A fake decoder whose step-t distribution is table[t] for every row, as in fairseq's generator tests."""

    pad_id = PAD

    def __init__(self, table: list[list[float]]):
        super().__init__()
        self.table = torch.tensor(table).log()

    def encode(self, src):
        return src.float()[:, :, None], (src != PAD)[:, None, None, :]

    def start_state(self, memory, src_keep):
        return FixedState(memory.size(0))

    def decode_step(self, tokens, state):
        assert tokens.shape == (state.rows,) and not (tokens == PAD).any()
        state.length += 1
        return self.table[min(state.length - 1, len(self.table) - 1)].expand(state.rows, -1)


class FixedState:
    def __init__(self, rows: int):
        self.rows, self.length = rows, 0

    def select(self, rows, sentences=None):
        self.rows = rows.numel()


#         PAD  START  END  A     B
STEPS = [[0.0, 0.0, 0.1, 0.6, 0.3], [0.0, 0.0, 0.4, 0.35, 0.25], [0.0, 0.0, 0.9, 0.05, 0.05]]
SRC = torch.tensor([[A, B, A]])


def by_hand(*probs: float) -> float:
    return sum(math.log(p) for p in probs)


@pytest.mark.parametrize("alpha,best", [(0.0, [A]), (2.0, [A, A])])
def test_beam_by_hand(alpha, best):
    """Beam 2: 'A END' finishes at step 1 and is frozen; 'A A END' and 'A B END' finish at step 2."""
    expected = {(A,): by_hand(0.6, 0.4), (A, A): by_hand(0.6, 0.35, 0.9), (A, B): by_hand(0.6, 0.25, 0.9)}
    hyps = beam_search(FixedModel(STEPS), SRC, START, END, beam=2, alpha=alpha, nbest=2)[0]
    assert hyps[0].tokens == best
    assert {tuple(h.tokens) for h in hyps} <= set(expected)
    for h in hyps:
        assert h.log_prob == pytest.approx(expected[tuple(h.tokens)], abs=1e-6)
        assert h.score == pytest.approx(h.log_prob / ((5 + len(h.tokens) + 1) / 6) ** alpha, abs=1e-6)
        assert sum(h.positional_scores) == pytest.approx(h.log_prob, abs=1e-6)
        assert len(h.positional_scores) == len(h.tokens) + 1


def test_sentence_stops_once_no_live_beam_can_win():
    """Beam 2, alpha 0: 'A END' (0.45) finishes at step 1 while the best live beam 'A A' has 0.441 and can
    only fall, so the search stops after 2 steps instead of waiting for a second finished hypothesis."""
    #          PAD  START  END   A     B
    steps = [[0.0, 0.0, 0.04, 0.9, 0.06], [0.0, 0.0, 0.5, 0.49, 0.01]]
    model = FixedModel(steps)
    calls = []
    decode_step = model.decode_step
    model.decode_step = lambda tokens, state: calls.append(tokens.numel()) or decode_step(tokens, state)
    [best] = beam_search(model, SRC, START, END, beam=2, alpha=0.0)[0]
    assert best.tokens == [A] and best.log_prob == pytest.approx(by_hand(0.9, 0.5), abs=1e-6)
    assert calls == [1, 2]
    calls.clear()
    assert [h.tokens for h in beam_search(model, SRC, START, END, beam=2, alpha=0.0, nbest=2)[0]][0] == [A]
    assert len(calls) > 2  # the second best is not settled yet: the live beams may still beat it


def test_end_forced_at_max_length():
    """With max_len 1, every live beam must end at step 1; greedy stops there too."""
    hyps = beam_search(FixedModel(STEPS), SRC, START, END, beam=2, alpha=0.0, nbest=2, max_len_a=0.0, max_len_b=1)[0]
    assert [h.tokens for h in hyps] == [[A], [B]]
    assert hyps[1].log_prob == pytest.approx(by_hand(0.3, 0.4), abs=1e-6)
    assert greedy_search(FixedModel(STEPS), SRC, START, END, max_len_a=0.0, max_len_b=1)[0].tokens == [A]


def test_never_pad_or_start_and_per_sentence_max_length():
    """Each sentence runs to its own a*len+b when <END> is unlikely; <PAD> and <START> never come out."""
    src = torch.tensor([[A, B, A, B], [A, PAD, PAD, PAD], [A, A, PAD, PAD]])
    limits = max_output_lengths((src != PAD).sum(1), 1.5, 2).tolist()
    assert limits == [8, 3, 5]
    kw = dict(max_len_a=1.5, max_len_b=2)
    prefers_pad = FixedModel([[0.4, 0.4, 0.01, 0.1, 0.09]])
    assert [h.tokens for h in greedy_search(prefers_pad, src, START, END, **kw)] == [[A] * n for n in limits]
    for hyps in beam_search(prefers_pad, src, START, END, beam=3, nbest=3, **kw):
        assert all(not {PAD, START} & set(h.tokens) for h in hyps)
    rarely_ends = FixedModel([[0.0, 0.0, 0.001, 0.9, 0.099]])
    assert [hs[0].tokens for hs in beam_search(rarely_ends, src, START, END, beam=3, **kw)] == [[A] * n for n in limits]


def test_max_output_lengths():
    lengths = torch.tensor([0, 1, 10, 37])
    assert max_output_lengths(lengths, 1.0, 50).tolist() == [50, 51, 60, 87]
    assert max_output_lengths(lengths, 1.2, 10).tolist() == [10, 11, 22, 54]
    assert length_penalty(1, 0.6) == 1.0


def random_model() -> Transformer:
    """A random model made confident, with <END> likely enough that outputs have mixed lengths."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(N=2, d_model=32, d_ff=64, h=4, dropout=0.1, tie_embeddings=False), 23, PAD)
    with torch.no_grad():
        model.generator.weight.mul_(2)
        model.generator.weight[END].mul_(4)
    return model


def random_sources(n: int = 20, seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 12, (n,), generator=g)
    src = torch.randint(END + 1, 23, (n, int(lengths.max())), generator=g)
    src[torch.arange(src.size(1)) >= lengths[:, None]] = PAD
    return src


def decode_in_batches(search, src: torch.Tensor, batch_size: int, **kw) -> list:
    out = []
    for i in range(0, src.size(0), batch_size):
        chunk = src[i : i + batch_size]
        out += search(random_model(), chunk[:, : int((chunk != PAD).sum(1).max())], START, END, max_len_b=8, **kw)
    return out


def assert_same(a: list, b: list) -> None:
    assert [h.tokens for h in a] == [h.tokens for h in b]
    assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


def test_greedy_and_beam_do_not_depend_on_batch_size_or_order():
    src = random_sources()
    greedy = decode_in_batches(greedy_search, src, 20)
    beam = decode_in_batches(beam_search, src, 20, beam=4, nbest=4)
    assert len({len(h.tokens) for h in greedy}) > 3 and len({len(hs[0].tokens) for hs in beam}) > 3
    for batch_size in (1, 3):
        assert_same(decode_in_batches(greedy_search, src, batch_size), greedy)
        for hs, ref in zip(decode_in_batches(beam_search, src, batch_size, beam=4, nbest=4), beam):
            assert_same(hs, ref)
    order = torch.randperm(20, generator=torch.Generator().manual_seed(0))
    for hs, ref in zip(decode_in_batches(beam_search, src[order], 20, beam=4, nbest=4), [beam[i] for i in order]):
        assert_same(hs, ref)


@pytest.mark.parametrize("nbest", [1, 4])
def test_one_search_ranked_under_each_length_penalty_is_the_search_at_it(nbest):
    """beam_finished's hypotheses ranked under a length penalty are beam_search's at that penalty (which stops early
    once settled), so one search scores a grid of penalties; and the grid does choose differently."""
    src, model = random_sources(), random_model()
    finished = beam_finished(model, src, START, END, 4, 1.0, 8)
    for alpha in (0.0, 0.6, 1.0, 2.0, 3.0, 5.0):
        searched = beam_search(model, src, START, END, beam=4, alpha=alpha, nbest=nbest, max_len_b=8)
        for hs, done in zip(searched, finished):
            assert_same(hs, ranked(done, alpha)[:nbest])
    assert [ranked(d, 0.0)[0].tokens for d in finished] != [ranked(d, 5.0)[0].tokens for d in finished]


def test_beam_1_is_greedy_and_nbest_starts_with_1_best():
    src = random_sources(seed=4)
    greedy = decode_in_batches(greedy_search, src, 20)
    assert_same([hs[0] for hs in decode_in_batches(beam_search, src, 20, beam=1)], greedy)
    best = decode_in_batches(beam_search, src, 20, beam=5)
    nbest = decode_in_batches(beam_search, src, 20, beam=5, nbest=5)
    assert_same([hs[0] for hs in nbest], [hs[0] for hs in best])
    assert all(len(hs) == 5 and [h.score for h in hs] == sorted((h.score for h in hs), reverse=True) for hs in nbest)


def test_greedy_takes_the_most_probable_token_at_every_step():
    """Against a greedy decode written apart from the search: at each step the argmax (never <PAD> or <START>) of the
    model's distribution after the whole prefix, re-decoded, until <END> or the length limit (src_len + 8 tokens)."""
    model, src = random_model().eval(), random_sources(8, seed=6)
    for i, h in enumerate(greedy_search(model, src, START, END, max_len_b=8)):
        s = src[i : i + 1, : int((src[i] != PAD).sum())]
        seq = [START]
        while seq[-1] != END and len(seq) <= s.size(1) + 8:
            with torch.no_grad():
                logits = model(s, torch.tensor([seq]))[0, -1]
            logits[[PAD, START]] = float("-inf")
            seq.append(int(logits.argmax()))
        assert h.tokens == [t for t in seq[1:] if t != END]


def test_scores_are_the_models_log_probs_and_training_mode_is_restored():
    model, src = random_model().train(), random_sources(5, seed=5)
    greedy = greedy_search(model, src, START, END, max_len_b=8)
    assert model.training
    beam = [hs[0] for hs in beam_search(model, src, START, END, nbest=2)]
    assert model.training
    model.eval()
    for i, h in enumerate(greedy + beam):
        seq = torch.tensor([[START, *h.tokens, END]])
        with torch.no_grad():
            lp = F.log_softmax(model(src[i % 5 : i % 5 + 1], seq[:, :-1]), -1)[0].gather(1, seq[0, 1:, None])[:, 0]
        assert h.positional_scores == pytest.approx(lp.tolist(), abs=1e-5)
        assert h.log_prob == pytest.approx(lp.sum().item(), abs=1e-4)


def test_an_empty_batch():
    empty = torch.zeros(0, 4, dtype=torch.long)
    assert greedy_search(random_model(), empty, START, END) == [] == beam_search(random_model(), empty, START, END)


def digit_pairs(n: int, g: torch.Generator, reverse: bool, max_len: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Random digit strings (tokens 3..12) of length 1..max_len; targets are <START> y <END>, y = x or reversed."""
    lengths = torch.randint(1, max_len + 1, (n,), generator=g).tolist()
    src, tgt = torch.full((n, max_len), PAD), torch.full((n, max_len + 2), PAD)
    for i, length in enumerate(lengths):
        x = torch.randint(3, 13, (length,), generator=g)
        src[i, :length] = x
        tgt[i, : length + 2] = torch.cat([torch.tensor([START]), x.flip(0) if reverse else x, torch.tensor([END])])
    return src, tgt


@pytest.mark.parametrize("task,steps", [("copy", 250), pytest.param("reverse", 500, marks=pytest.mark.slow)])
def test_tiny_model_learns_digit_task(task, steps):
    """Trained here on CPU (copy about 5 s, reverse about 10 s); >= 95% exact match, greedy and beam 4."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = Transformer(ModelConfig(N=2, d_model=64, d_ff=128, h=4, dropout=0.0), 13, PAD)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / 50, (steps - s) / (steps - 50)))
    for _ in range(steps):
        src, tgt = digit_pairs(64, g, task == "reverse")
        loss = F.cross_entropy(model(src, tgt[:, :-1]).transpose(1, 2), tgt[:, 1:], ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    src, tgt = digit_pairs(200, torch.Generator().manual_seed(99), task == "reverse")
    refs = [[t for t in row.tolist() if t > END] for row in tgt]
    greedy = greedy_search(model, src, START, END, max_len_b=5)
    beam = [hs[0] for hs in beam_search(model, src, START, END, beam=4, max_len_b=5)]
    for hyps in (greedy, beam):
        assert sum(h.tokens == ref for h, ref in zip(hyps, refs)) / len(refs) >= 0.95


def test_search_under_bf16_autocast_with_an_all_pad_source():
    src = random_sources(4, seed=6)
    src[2] = PAD
    with torch.autocast("cpu", dtype=torch.bfloat16):
        greedy = greedy_search(random_model(), src, START, END, max_len_b=6)
        beam = beam_search(random_model(), src, START, END, max_len_b=6, nbest=2)
    for h in greedy + [h for hs in beam for h in hs]:
        assert math.isfinite(h.score) and not {PAD, START} & set(h.tokens)
