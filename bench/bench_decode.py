"""CPU decoding speed with and without the K/V cache: greedy and beam 4, batch 1 and 32, sentences/s and ratios.

A randomly initialised model of the `small` shape (d_model 256, N 3, h 4, d_ff 1024, 8k vocabulary). Its
<END> is made unlikely, so every sentence runs to its max length (source length + max_len_b) and both
paths do the same work. The uncached path re-runs the parallel decoder on the whole prefix at every step.
Run: .venv/bin/python bench/bench_decode.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from transformer.model import Transformer  # noqa: E402
from transformer.search import beam_search, greedy_search  # noqa: E402

PAD, START, END, V = 0, 1, 2, 8000


class PrefixState:
    """Uncached decoding state: the encoder output and the tokens so far."""

    def __init__(self, memory: Tensor, src_keep: Tensor):
        self.memory, self.src_keep = memory, src_keep
        self.prefix = memory.new_empty((memory.size(0), 0), dtype=torch.long)

    def select(self, index: Tensor) -> None:
        self.memory, self.src_keep = self.memory.index_select(0, index), self.src_keep.index_select(0, index)
        self.prefix = self.prefix.index_select(0, index)


class Uncached(nn.Module):
    """The model's interface for search, but every step recomputes the decoder over the whole prefix."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model, self.pad_id = model, model.pad_id

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        return self.model.encode(src)

    def start_state(self, memory: Tensor, src_keep: Tensor, beam: int = 1) -> PrefixState:
        return PrefixState(memory.repeat_interleave(beam, 0), src_keep.repeat_interleave(beam, 0))

    def decode_step(self, tokens: Tensor, state: PrefixState) -> Tensor:
        state.prefix = torch.cat([state.prefix, tokens[:, None]], 1)
        return self.model.decode(state.prefix, state.memory, state.src_keep)[:, -1]


def decode_all(model: nn.Module, src: Tensor, batch: int, beam: int, max_len_b: int) -> float:
    """Seconds to decode all of src in batches of `batch`."""
    start = time.perf_counter()
    for i in range(0, src.size(0), batch):
        chunk = src[i : i + batch]
        if beam == 1:
            greedy_search(model, chunk, START, END, max_len_b=max_len_b)
        else:
            beam_search(model, chunk, START, END, beam=beam, max_len_b=max_len_b)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src-len", type=int, default=16)
    parser.add_argument("--max-len-b", type=int, default=16, help="output length = src_len + this")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Transformer(V, V, PAD, N=3, d_model=256, d_ff=1024, h=4, dropout=0.1).eval()
    with torch.no_grad():
        model.src_embed.weight[END].fill_(0.0)  # tied: <END> gets logit 0 and random outputs run to max length
    uncached = Uncached(model)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; src_len {args.src_len}, "
          f"output {args.src_len + args.max_len_b} tokens; best of {args.repeats}")
    print(f"{'search':<8} {'batch':>5} {'sentences':>9} {'cached/s':>9} {'uncached/s':>10} {'ratio':>6}")
    for beam in (1, 4):
        for batch in (1, 32):
            n = 8 if batch == 1 else 32
            src = torch.randint(END + 1, V, (n, args.src_len), generator=torch.Generator().manual_seed(1))
            decode_all(model, src[:batch], batch, beam, 2)  # warm-up
            # Interleaved, best of repeats: other work on a shared machine slows runs, never speeds them up.
            times = [(decode_all(model, src, batch, beam, args.max_len_b), decode_all(uncached, src, batch, beam,
                      args.max_len_b)) for _ in range(args.repeats)]
            cached, plain = (n / min(t) for t in zip(*times))
            name = "greedy" if beam == 1 else f"beam {beam}"
            print(f"{name:<8} {batch:>5} {n:>9} {cached:>9.2f} {plain:>10.2f} {cached / plain:>5.2f}x", flush=True)


if __name__ == "__main__":
    main()
