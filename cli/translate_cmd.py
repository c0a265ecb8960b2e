"""``tfm translate``: read lines, stream them through the Translator, write complete lines only."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterable, Iterator

from cli.errors import fail


def _lines(stream: Iterable[bytes], name: str) -> Iterator[str]:
    """Decode lines as UTF-8; invalid bytes become U+FFFD with a warning naming the line."""
    for no, raw in enumerate(stream, 1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", errors="replace")
            print(f"warning: {name} line {no}: invalid UTF-8 replaced by U+FFFD", file=sys.stderr)
        yield text.rstrip("\r\n")


def _format(no: int, translation, nbest: int) -> str:
    if nbest == 1:
        return translation.best + "\n"
    return "".join(f"{no} ||| {t} ||| {s:.4f}\n" for t, s in zip(translation.texts, translation.scores))


def run_translate(text: str | None, checkpoint: Path | None, input_: Path | None, output: Path | None,
                  beam: int | None, nbest: int, batch_tokens: int | None, device: str, precision: str,
                  runs: Path) -> None:
    """Translate ``text``, ``--input`` or stdin into ``--output`` or stdout."""
    from transformer import checkpoint as ckpt
    from transformer.device import check_precision, resolve_device
    from transformer.translator import Translator

    if text is not None and input_ is not None:
        fail("give either a sentence or --input FILE, not both")
    if input_ is not None and not input_.is_file():
        fail(f"input file '{input_}' not found; pass an existing file with one sentence per line")
    dev = resolve_device(device)
    check_precision(precision, dev)
    loaded = ckpt.load(checkpoint or ckpt.newest(runs), dev)
    decode = loaded.cfg.decode
    if batch_tokens is not None:
        decode.batch_tokens = batch_tokens
    translator = Translator(loaded.model, loaded.tokenizer, decode, loaded.cfg.model.max_positions, dev, precision)
    if text is not None:
        lines: Iterator[str] = _lines([os.fsencode(text)], "the sentence")  # argv keeps non-UTF-8 bytes as surrogates
        src = None
    elif input_ is not None:
        src = open(input_, "rb")
        lines = _lines(src, str(input_))
    else:
        src = None
        lines = _lines(sys.stdin.buffer, "stdin")
    out = open(output, "w", encoding="utf-8") if output is not None else sys.stdout
    count = 0
    try:
        chunk = 1 if text is not None else 1000
        for count, translation in enumerate(translator.translate(lines, beam, nbest, chunk=chunk), 1):
            out.write(_format(count, translation, nbest))
            if count % 64 == 0:
                out.flush()
        out.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return
    except KeyboardInterrupt:
        out.flush()
        print(f"interrupted: {count} complete lines written", file=sys.stderr)
        raise SystemExit(130)
    finally:
        if src is not None:
            src.close()
        if output is not None:
            out.close()
    if count == 0 and text is None:
        print("note: the input was empty; nothing translated", file=sys.stderr)
