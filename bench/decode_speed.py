"""Decoding speed on Multi30k test_2016_flickr: tfm, transformers' ``generate`` and CTranslate2, same weights.

All three run the checkpoint's network: tfm as trained; a same-shape MarianMTModel with tfm's
tensors copied in (bench.marian_peer); CTranslate2 on the model ``tfm export --format
ctranslate2`` writes. All three use tfm's tokenizer, get the same batches (test sentences sorted
by length, cut into batches of 1 or 32) and are timed text in, text out. Output tokens are counted
the same way for all: the tokenizer's tokens of the output text.

Each system runs in a process of its own (bench.decode_worker), as users run them: in one process,
CTranslate2's thread pool, once it has run with two threads, halved tfm's speed at batch 1 on a 2-core CPU.
``own_processes(..., apart=False)`` keeps all in this one. The same holds the other way: CTranslate2 ships its
own libgomp, and once torch's OpenMP threads have run in a process, CTranslate2's two threads decoded 2-4x slower
there. So CTranslate2's process runs no torch operator: the parent exports the model, and the worker reads only
the checkpoint's config and tokenizer.

Threads: tfm decodes as its Translator does (all of torch's; with TFM_SHARED_CPU=1 one for batches under 64 rows);
the peers use torch's thread count. CTranslate2 loads its own OpenMP runtime with its default waiting;
transformers shares torch's runtime with tfm, so both wait as the tfm command would make them
(the bench package: the short spin with TFM_SHARED_CPU=1; export OMP_WAIT_POLICY or GOMP_SPINCOUNT to choose
another for all three).

Both peers decode up to the batch's longest limit; their outputs are then cut to tfm's per-sentence
limit (a * source length + b tokens), which greedy search makes exact (a looping sentence ends there).
Beam search differs in one convention: tfm divides by the GNMT penalty ((5 + len) / 6) ** 0.6,
transformers and CTranslate2 by len ** ``length_penalty``; both peers stop a sentence once it has
``beam`` finished hypotheses, as tfm does. Greedy search is the same algorithm in all three.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from bench import SPIN_SET_HERE
from bench.common import interleave, paired_ratio, workers
from bench.marian_peer import build_marian, copy_tfm_weights
from transformer import checkpoint
from transformer.config import DecodeConfig
from transformer.decoding.search import max_output_lengths
from transformer.decoding.translator import TranslateOptions, Translator
from transformer.export.write import export
from transformer.scoring import score
from transformer.text.batching import source_tensor
from transformer.text.tokenizer import Tokenizer

Decoder = Callable[[list[str], int], list[str]]


@dataclass
class Setting:
    """One row of the decoding table: search and batch size."""

    beam: int
    batch: int


def tfm_decoder(
    loaded: checkpoint.Loaded | list[checkpoint.Loaded],
    precision: str = "fp32",
    device: str = "cpu",
    shortlist: str | None = None,
) -> Decoder:
    """tfm's Translator (one for each beam size asked for) of one model or an ensemble, with a lexical shortlist if
    given; each call's lines form one batch."""
    made: dict[int, Translator] = {}

    def decode(lines: list[str], beam: int) -> list[str]:
        if beam not in made:
            options = TranslateOptions(device, precision, beam=beam, nbest=1, batch_tokens=10**9, shortlist=shortlist)
            made[beam] = Translator.from_checkpoint(loaded, options)
        return [x.best for x in made[beam].translate_chunk(lines)]

    return decode


def _limits(ids: list[list[int]], a: float, b: int, positions: int) -> list[int]:
    """tfm's most output tokens per sentence for sources ``ids`` (without <END>, which tfm's search counts), within
    the exported position table, which a peer cannot run past."""
    return max_output_lengths(torch.tensor([len(x) + 1 for x in ids]), a, b).clamp(max=positions - 1).tolist()


def _sources(tok: Tokenizer, lines: list[str], positions: int) -> list[list[int]]:
    """Token ids per line, cut as tfm cuts a source too long for the model's positions (room kept for <END>)."""
    return [ids[: positions - 1] for ids in tok.encode_batch(lines)]


def _until_end(row: list[int], end_id: int, limit: int) -> list[int]:
    return (row[: row.index(end_id)] if end_id in row else row)[:limit]


def marian_decoder(loaded: checkpoint.Loaded, length_penalty: float, device: str = "cpu", peer=None) -> Decoder:
    """transformers' ``generate`` on a MarianMTModel holding tfm's weights: ``peer`` (on ``device``), or one built
    here with the checkpoint's tensors copied in."""
    tok, d, positions = loaded.tokenizer, loaded.cfg.decode, loaded.cfg.model.max_positions
    if peer is None:
        peer = copy_tfm_weights(build_marian(loaded.cfg.model, tok).to(device), loaded.model).eval()

    def run(lines: list[str], beam: int) -> list[str]:
        ids = _sources(tok, lines, positions)
        limits = _limits(ids, d.max_len_a, d.max_len_b, positions)
        src = source_tensor(ids, tok).to(device)
        stop = {"early_stopping": True, "length_penalty": length_penalty} if beam > 1 else {}
        with torch.inference_mode():
            out = peer.generate(
                input_ids=src,
                attention_mask=(src != tok.pad_id).long(),
                num_beams=beam,
                do_sample=False,
                max_new_tokens=max(limits) + 1,
                suppress_tokens=[tok.pad_id, tok.start_id],
                **stop,
            )
        rows = [_until_end(row[1:], tok.end_id, n) for row, n in zip(out.tolist(), limits)]  # [1:]: <START>
        return tok.decode_batch(rows)

    return run


def _import_ctranslate2():
    """ctranslate2, loaded under OpenMP's default waiting unless the user chose otherwise.

    CTranslate2 ships its own libgomp, which reads the environment once, when it loads: so it runs as
    its users run it, not with the short spin the bench package set for torch (and tfm) on a shared CPU.
    """
    saved = os.environ.pop("GOMP_SPINCOUNT", None) if SPIN_SET_HERE else None
    try:
        import ctranslate2
    finally:
        if saved is not None:
            os.environ["GOMP_SPINCOUNT"] = saved
    return ctranslate2


def ct2_folder(workdir: Path, precision: str, alpha: float) -> Path:
    """Where the model ``tfm export --format ctranslate2`` writes for CTranslate2 in ``precision`` goes."""
    return workdir / f"ct2-{precision}-{alpha}"


def ct2_decoder(
    tok: Tokenizer,
    decode: DecodeConfig,
    positions: int,
    workdir: Path,
    precision: str,
    alpha: float,
    device: str = "cpu",
) -> Decoder:
    """CTranslate2 on ``device`` on the model exported into ``ct2_folder`` (fp32, as exported, or with its weights
    converted when loading: int8, bf16), with length penalty ``alpha``. Runs no torch operator: see the module's
    docstring."""
    folder = ct2_folder(workdir, precision, alpha)
    compute_type = {"int8": "int8", "bf16": "bfloat16"}.get(precision, "default")
    ctranslate2 = _import_ctranslate2()
    translator = ctranslate2.Translator(
        str(folder), device=device, compute_type=compute_type, inter_threads=1, intra_threads=torch.get_num_threads()
    )
    vocab = [tok.id_to_token(i) for i in range(tok.vocab_size)]
    index = {t: i for i, t in enumerate(vocab)}

    def run(lines: list[str], beam: int) -> list[str]:
        ids = _sources(tok, lines, positions)
        limits = _limits(ids, decode.max_len_a, decode.max_len_b, positions)
        out = translator.translate_batch(
            [[vocab[i] for i in x] for x in ids],
            beam_size=beam,
            length_penalty=alpha,
            max_decoding_length=max(limits) + 1,
        )
        return tok.decode_batch([[index[t] for t in r.hypotheses[0]][:n] for r, n in zip(out, limits)])

    return run


def exported_ct2(path: Path, precision: str, alpha: float, workdir: Path) -> Decoder:
    """``ct2_decoder`` for checkpoint ``path``, whose export is already in ``ct2_folder``: reads the config and the
    tokenizer only, so the process that runs it never builds the model."""
    tok, cfg = Tokenizer.load(path / checkpoint.TOKENIZER), checkpoint.read_config(path)
    return ct2_decoder(tok, cfg.decode, cfg.model.max_positions, workdir, precision, alpha)


def batches(lines: list[str], tok, setting: Setting, count: int, seed: int = 0) -> list[list[int]]:
    """``count`` batches of line indices: batch 32 cuts the length-sorted set (order shuffled); batch 1 samples."""
    rng = random.Random(seed)
    if setting.batch == 1:
        return [[i] for i in rng.sample(range(len(lines)), min(count, len(lines)))]
    lengths = [len(x) for x in tok.encode_batch(lines)]
    order = sorted(range(len(lines)), key=lambda i: lengths[i])
    cut = [order[k : k + setting.batch] for k in range(0, len(order), setting.batch)]
    rng.shuffle(cut)
    return cut[:count]


def measure(
    systems: dict[str, Decoder],
    lines: list[str],
    refs: list[str],
    tok,
    tgt_lang: str,
    setting: Setting,
    rounds: int,
    per_round: int,
) -> dict[str, dict[str, float]]:
    """Sentences/s and tokens/s over all the sentences decoded, BLEU on them, time ratios to tfm, and the share of
    output lines identical to tfm's.

    Throughput is the total over the rounds divided by their total time, as when translating a file:
    the full test set at batch 32. ``tfm_speedup`` is the ratio of total times; ``tfm_speedup_median_round``
    the median of per-round ratios, a typical batch, which weighs the few long batches (where a peer
    decoding every sentence to the batch's end is slowest) as little as the rest.
    """
    groups = batches(lines, tok, setting, rounds * per_round)
    rounds = len(groups) // per_round
    outputs: dict[str, dict[int, str]] = {name: {} for name in systems}
    for name, system in systems.items():  # warm-up
        system([lines[i] for i in groups[0]], setting.beam)

    def timed(name: str) -> Callable[[int], None]:
        def run(r: int) -> None:
            for g in groups[r * per_round : (r + 1) * per_round]:
                for i, text in zip(g, systems[name]([lines[i] for i in g], setting.beam)):
                    outputs[name][i] = text

        return run

    times = interleave({name: timed(name) for name in systems}, rounds)
    done = sorted(outputs["tfm"])
    result = {}
    for name, ts in times.items():
        per = [groups[r * per_round : (r + 1) * per_round] for r in range(rounds)]
        sents = [sum(map(len, p)) for p in per]
        toks = [sum(len(x) for x in tok.encode_batch([outputs[name][i] for g in p for i in g])) for p in per]
        bleu = score([outputs[name][i] for i in done], [refs[i] for i in done], tgt_lang).bleu
        result[name] = {
            "sentences_per_s": sum(sents) / sum(ts),
            "tokens_per_s": sum(toks) / sum(ts),
            "bleu": bleu,
            "sentences": len(done),
            "tfm_speedup": sum(ts) / sum(times["tfm"]),
            "tfm_speedup_median_round": paired_ratio(ts, times["tfm"]),
            "identical_to_tfm": sum(outputs[name][i] == outputs["tfm"][i] for i in done) / len(done),
        }
    return result


def build(
    loaded: checkpoint.Loaded, system: str, precision: str, alpha: float, workdir: Path, shortlist: str | None = None
) -> Decoder:
    """``system`` (tfm, transformers or ctranslate2) in ``precision`` (fp32, or int8: tfm's and CTranslate2's own),
    tfm with length penalty ``alpha`` (and a lexical shortlist if given) and the peers with ``length_penalty``
    alpha."""
    loaded = replace(loaded, cfg=replace(loaded.cfg, decode=replace(loaded.cfg.decode, alpha=alpha)))
    if system == "tfm":
        return tfm_decoder(loaded, precision, shortlist=shortlist)
    if system == "transformers" and precision == "fp32":
        return marian_decoder(loaded, alpha)
    if system == "ctranslate2":
        export(loaded.path, ct2_folder(workdir, precision, alpha), overwrite=True)
        return ct2_decoder(
            loaded.tokenizer, loaded.cfg.decode, loaded.cfg.model.max_positions, workdir, precision, alpha
        )
    raise ValueError(f"no decoding system {system} in {precision}")


@contextmanager
def own_processes(
    loaded: checkpoint.Loaded, systems: tuple[str, ...], precision: str, alpha: float, workdir: Path, apart: bool = True
) -> Iterator[dict[str, Decoder]]:
    """``systems`` ready to decode, each in a worker process of its own (bench.decode_worker), or all in this one."""
    if not apart:
        yield {name: build(loaded, name, precision, alpha, workdir) for name in systems}
        return
    with in_workers({name: Worker(loaded, name, precision, alpha, workdir) for name in systems}) as made:
        yield made


@dataclass
class Worker:
    """What one worker process decodes with: a checkpoint, a system in a precision, a length penalty, the folder
    its CTranslate2 export goes in (one folder per checkpoint), and for tfm a lexical shortlist or none."""

    loaded: checkpoint.Loaded
    system: str
    precision: str
    alpha: float
    workdir: Path
    shortlist: Path | None = None


@contextmanager
def in_workers(runs: dict[str, Worker]) -> Iterator[dict[str, Decoder]]:
    """Each named ``Worker`` decoding in a process of its own (bench.decode_worker)."""
    for w in runs.values():
        if w.system == "ctranslate2":  # exported here, so that CTranslate2's process runs no torch operator
            export(w.loaded.path, ct2_folder(w.workdir, w.precision, w.alpha), overwrite=True)
    commands = {
        name: ["bench.decode_worker", str(w.loaded.path), w.system, w.precision, str(w.alpha), str(w.workdir)]
        + ([str(w.shortlist)] if w.shortlist else [])
        for name, w in runs.items()
    }
    with workers(commands) as ask:

        def proxy(send: Callable[[str], str]) -> Decoder:
            return lambda lines, beam: json.loads(send(json.dumps({"lines": lines, "beam": beam})))

        yield {name: proxy(send) for name, send in ask.items()}


PEERS = ("tfm", "transformers", "ctranslate2")
INT8_PEERS = ("tfm", "ctranslate2")  # transformers has no int8 decoding of its own on the CPU


def full_test_bleu(
    loaded: checkpoint.Loaded, lines: list[str], refs: list[str], precisions: tuple[str, ...]
) -> dict[str, dict[str, float]]:
    """tfm's BLEU on all of ``lines`` in each precision, greedy and beam 5, in batches of 32 sorted by length."""
    tgt = loaded.cfg.data.tgt_lang
    out: dict[str, dict[str, float]] = {}
    for precision in precisions:
        system = tfm_decoder(loaded, precision)
        for beam in (1, 5):
            texts: dict[int, str] = {}
            for g in batches(lines, loaded.tokenizer, Setting(beam, 32), len(lines)):
                texts.update(zip(g, system([lines[i] for i in g], beam)))
            search = "greedy" if beam == 1 else f"beam {beam}"
            out.setdefault(precision, {})[search] = score([texts[i] for i in range(len(lines))], refs, tgt).bleu
    return out


def agreement(
    loaded: checkpoint.Loaded, lines: list[str], refs: list[str], workdir: Path, apart: bool = True
) -> dict[str, dict[str, float]]:
    """Beam 5, batch 32 over all ``lines`` with no length normalisation in any system (alpha 0, length_penalty 0).

    Without the one convention that differs, the three should translate alike: the share of
    outputs identical to tfm's, and each one's BLEU.
    """
    groups = batches(lines, loaded.tokenizer, Setting(5, 32), len(lines))
    outputs = {}
    with own_processes(loaded, PEERS, "fp32", 0.0, workdir, apart) as systems:
        for name, system in systems.items():
            out: dict[int, str] = {}
            for g in groups:
                out.update(zip(g, system([lines[i] for i in g], 5)))
            outputs[name] = [out[i] for i in range(len(lines))]
    tgt = loaded.cfg.data.tgt_lang
    return {
        name: {
            "bleu": score(texts, refs, tgt).bleu,
            "identical_to_tfm": sum(a == b for a, b in zip(texts, outputs["tfm"])) / len(lines),
        }
        for name, texts in outputs.items()
    }
