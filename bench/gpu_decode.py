"""bench.gpu_step's decode section: test_2016_flickr through tfm's Translator against ``generate`` of the
checkpoint's Hugging Face export and, on a GPU, CTranslate2; and the host's waits for the device in one batch."""

from __future__ import annotations

import gzip
import importlib.util
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from bench import decode_speed
from bench.common import host_waits
from transformer import checkpoint
from transformer.decoding import host
from transformer.decoding.translator import TranslateOptions, Translator
from transformer.export.write import export
from transformer.runtime.precision import PRECISIONS


def hf_decoder(
    folder: Path, loaded: checkpoint.Loaded, dtype: torch.dtype, device: torch.device
) -> decode_speed.Decoder:
    """``generate`` of the Hugging Face export in ``folder``, loaded with transformers alone, in ``dtype``."""
    from transformers import MarianMTModel

    peer = MarianMTModel.from_pretrained(folder).to(device, dtype).eval()
    return decode_speed.marian_decoder(loaded, loaded.cfg.decode.alpha, str(device), peer=peer)


def ct2_gpu(loaded: checkpoint.Loaded, workdir: Path, device: torch.device) -> tuple[Any, str]:
    """CTranslate2 on this GPU in bf16, or None and why not."""
    if device.type != "cuda":
        return None, "CTranslate2 is measured on a GPU only (bench.run measures it on the CPU)"
    if importlib.util.find_spec("ctranslate2") is None:
        return None, "ctranslate2 is not installed"
    try:
        import ctranslate2

        if ctranslate2.get_cuda_device_count() < 1:
            return None, "this ctranslate2 sees no CUDA device"
        alpha = loaded.cfg.decode.alpha
        export(loaded.path, decode_speed.ct2_folder(workdir, "bf16", alpha), overwrite=True)
        return decode_speed.ct2_decoder(
            loaded.tokenizer, loaded.cfg.decode, loaded.cfg.model.max_positions, workdir, "bf16", alpha, "cuda"
        ), ""
    except Exception as e:  # noqa: BLE001 - a peer that cannot run here is recorded, not fatal
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def search_waits(loaded: checkpoint.Loaded, lines: list[str], precision: str, device: torch.device) -> dict[str, Any]:
    """Greedy and beam 5 over one batch of ``lines``: the search's steps, its reads of the device (host.to_host) and
    every wait of the host for the device (on CUDA), the batch's own transfers in and out included."""
    out: dict[str, Any] = {}
    for beam in (1, 5):
        options = TranslateOptions(device, precision, beam=beam, nbest=1, batch_tokens=10**9)
        translator = Translator.from_checkpoint(loaded, options)
        translator.translate_chunk(lines)  # warm: what is made once per Translator or shape is not a step's
        counts: Counter[str] = Counter()
        reads, step = host.to_host, translator.model.decode_step

        def read(*tensors: torch.Tensor) -> list[torch.Tensor]:
            counts["reads"] += 1
            return reads(*tensors)

        def decode_step(*args: Any) -> torch.Tensor:
            counts["steps"] += 1
            return step(*args)

        host.to_host, translator.model.decode_step = read, decode_step
        try:
            waits = host_waits(lambda: translator.translate_chunk(lines), device)
        finally:
            host.to_host = reads
            del translator.model.decode_step
        search = "greedy" if beam == 1 else f"beam {beam}"
        out[search] = {"sentences": len(lines), **counts, "host_waits": waits}
        print(f"  {search}, one batch of {len(lines)}: {dict(out[search])}", flush=True)
    return out


def decode_grid(ckpt: Path, data: str, device: torch.device, quick: bool) -> dict[str, Any]:
    """test_2016_flickr, greedy and beam 5, 1 and 64 sentences a batch: tfm against generate (and CTranslate2)."""
    loaded = checkpoint.load(ckpt, "cpu")
    d = loaded.cfg.data
    name = "test_2016_flickr"
    lines = gzip.open(Path(data) / f"{name}.{d.src_lang}.gz", "rt", encoding="utf-8").read().splitlines()
    refs = gzip.open(Path(data) / f"{name}.{d.tgt_lang}.gz", "rt", encoding="utf-8").read().splitlines()
    precision = "bf16" if device.type == "cuda" else "fp32"
    dtype = PRECISIONS[precision].dtype
    out: dict[str, Any] = {"checkpoint": str(ckpt), "precision": precision, "sentences": len(lines)}
    with tempfile.TemporaryDirectory() as tmp:
        systems = {
            "tfm": decode_speed.tfm_decoder(loaded, precision, str(device)),
            "generate": hf_decoder(export(ckpt, Path(tmp) / "hf", fmt="hf"), loaded, dtype, device),
        }
        ct2, why = ct2_gpu(loaded, Path(tmp), device)
        if ct2 is not None:
            systems["ctranslate2"] = ct2
        out["ctranslate2"] = why or "measured"
        for beam in (1, 5):
            for batch, rounds, per_round in ((1, 2, 4), (64, 1, 2)) if quick else ((1, 4, 25), (64, 4, 4)):
                row = decode_speed.measure(
                    systems,
                    lines,
                    refs,
                    loaded.tokenizer,
                    d.tgt_lang,
                    decode_speed.Setting(beam, batch),
                    rounds,
                    per_round,
                )
                search = "greedy" if beam == 1 else f"beam {beam}"
                out[f"{search}, batch {batch}"] = row
                print(
                    f"  {search}, batch {batch}: "
                    + ", ".join(
                        f"{k} {v['sentences_per_s']:.1f} sent/s (tfm {v['tfm_speedup']:.2f}x, BLEU {v['bleu']:.2f}, "
                        f"{v['identical_to_tfm']:.0%} as tfm)"
                        for k, v in row.items()
                    ),
                    flush=True,
                )
    out["host waits, batch 64"] = search_waits(loaded, lines[:64], precision, device)
    return out
