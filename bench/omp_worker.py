"""A fixed piece of tfm work, timed in a fresh process so that the process-wide settings come from its environment.

bench.levers runs it under libgomp's defaults, ``TFM_SHARED_CPU=1`` (the short OpenMP spin and one
thread for small decoding batches, transformer/runtime/process.py) and ``OMP_WAIT_POLICY=PASSIVE``. Importing
the bench package applies them as the tfm command does, before torch loads. Prints one JSON line of
seconds: beam-5 search of a batch of 32 sentences, 8 single sentences translated one at a time
(beam 5), and training steps of 1,500 tokens.
Run: python -m bench.omp_worker CHECKPOINT DATA_DIR
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from transformer import checkpoint
from transformer.config import DataConfig
from transformer.decoding.search import beam_search
from transformer.decoding.translator import TranslateOptions, Translator
from transformer.text.batching import collate, encode_corpus, make_batches, source_tensor
from transformer.text.corpus import load_split
from transformer.training.loss import label_smoothed_nll

SENTENCES = [
    "Ein Mann fährt Fahrrad.",
    "Zwei Hunde spielen im Schnee.",
    "Eine Frau liest ein Buch im Park.",
    "Kinder spielen Fußball auf einer Wiese.",
] * 8


def main(ckpt: str, data: str) -> None:
    loaded = checkpoint.load(ckpt)
    tok, model = loaded.tokenizer, loaded.model
    src = source_tensor([tok.encode(s) for s in SENTENCES], tok)
    beam_search(model, src[:2], tok.start_id, tok.end_id, beam=5)  # warm-up
    start = time.perf_counter()
    beam_search(model, src, tok.start_id, tok.end_id, beam=5)
    decode_s = time.perf_counter() - start

    translator = Translator.from_checkpoint(loaded, TranslateOptions("cpu", beam=5))
    start = time.perf_counter()
    for line in SENTENCES[:8]:
        translator.translate_chunk([line])
    single_s = time.perf_counter() - start

    d = loaded.cfg.data  # Multi30k's validation pairs in the model's pair, whatever data the model was trained on
    valid = load_split(DataConfig(format="multi30k", path=data, src_lang=d.src_lang, tgt_lang=d.tgt_lang), "val")
    cache = Path(tempfile.gettempdir()) / "tfm-bench-cache"
    enc = encode_corpus(valid, tok, d.max_len, cache)
    batches = [collate(enc, idx, tok) for idx in make_batches(enc, 1500, 0, 0)[:4]]
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)
    model.train()
    times = []
    for b in batches:
        start = time.perf_counter()
        loss, _ = label_smoothed_nll(model(b.src, b.tgt_in), b.tgt_out, 0.1, tok.pad_id)
        (loss / b.n_tokens).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    print(json.dumps({"decode_s": decode_s, "single_s": single_s, "train_s": sum(times[1:])}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
