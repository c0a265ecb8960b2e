"""``tfm translate``: read lines, stream them through the Translator, write complete lines only."""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING, Iterable, Iterator

from cli.exits import fail
from cli.guards import check_input, check_output, check_stdout, write_failed
from transformer.errors import out_of_memory

if TYPE_CHECKING:
    from transformer.decoding.translator import TranslateOptions


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
    """One input line's output: its translation (with `` ||| `` and its alignment, when asked), or its n-best as
    ``line ||| text ||| score`` lines (then `` ||| `` and each one's alignment)."""
    links = translation.alignments
    if nbest == 1:
        return translation.best + (f" ||| {links[0] if links else ''}" if links is not None else "") + "\n"
    rows = zip(translation.texts, translation.scores, links or [None] * len(translation.texts))
    return "".join(f"{no} ||| {t} ||| {s:.4f}" + (f" ||| {a}" if a is not None else "") + "\n" for t, s, a in rows)


@contextlib.contextmanager
def _output(output: Path | None) -> Iterator[IO[str]]:
    """stdout, or ``--output`` (already checked: not an input, not a file the user did not let us replace)."""
    if output is None:
        yield sys.stdout
    else:
        with open(output, "w", encoding="utf-8") as f:
            yield f


def run_translate(
    text: str | None,
    checkpoints: list[Path] | None,
    input_: Path | None,
    output: Path | None,
    runs: Path,
    overwrite: bool,
    options: TranslateOptions,
    align: bool = False,
    prefix: str | None = None,
    prefix_file: Path | None = None,
) -> None:
    """Translate ``text``, ``--input`` or stdin into ``--output`` or stdout with one checkpoint or an ensemble of
    several, with word alignments (``align``) and forced prefixes (one ``prefix`` for every line, or ``prefix_file``,
    one a line); every check comes before any work."""
    from transformer import checkpoint as ckpt
    from transformer.decoding.translator import Translator

    if text is not None and input_ is not None:
        fail("give either a sentence or --input FILE, not both")
    if input_ is not None:
        check_input(input_)
    prefixes = _prefixes(prefix, prefix_file, text, input_)
    paths = checkpoints or [ckpt.newest(runs)]
    read = [f for path in paths for f in ckpt.read_files(path)]
    if output is not None:
        check_output(output, overwrite, (input_, prefix_file, *read))
    else:
        check_stdout((input_, prefix_file, *read))
    translator = Translator.from_checkpoint(paths, options).to(options.get("to"))  # a model of several needs --to
    with contextlib.ExitStack() as stack:
        if text is not None:
            lines: Iterator[str] = _lines([os.fsencode(text)], "the sentence")  # argv keeps bad bytes as surrogates
        elif input_ is not None:
            lines = _lines(stack.enter_context(open(input_, "rb")), str(input_))
        else:
            lines = _lines(sys.stdin.buffer, "stdin")
        chunk = 1 if text is not None else 1000
        translations = translator.translate(lines, chunk, prefixes, align)
        count, interrupted = _translate_into(output, translations, translator.decode.nbest)
    if interrupted:
        print(f"interrupted: {count} complete lines written", file=sys.stderr)
        raise SystemExit(130)
    if isinstance(prefixes, list) and count < len(prefixes):  # stdin, read to its end: its lines are translated
        fail(f"--prefix-file {prefix_file} has {len(prefixes)} lines and the input {count}; give one prefix a line")
    if count == 0 and text is None:
        print("note: the input was empty; nothing translated", file=sys.stderr)


def _prefixes(
    prefix: str | None, prefix_file: Path | None, text: str | None, input_: Path | None
) -> Iterable[str] | None:
    """The prefixes of the lines read, or None: ``prefix`` for every line, or ``prefix_file``'s lines (a list), which
    must be as many as the input's (checked now where the input is a file or a sentence, as it is read for stdin)."""
    if prefix is not None and prefix_file is not None:
        fail("--prefix gives every line one prefix and --prefix-file one a line; give one of them")
    if prefix is not None:
        return itertools.repeat(prefix)
    if prefix_file is None:
        return None
    check_input(prefix_file, "--prefix-file")
    with open(prefix_file, "rb") as f:
        starts = list(_lines(f, str(prefix_file)))
    count = 1 if text is not None else None
    if input_ is not None:
        with open(input_, "rb") as f:
            count = sum(1 for _ in f)
    if count is not None and count != len(starts):
        fail(f"--prefix-file {prefix_file} has {len(starts)} lines and the input {count}; give one prefix a line")
    return starts


def _translate_into(output: Path | None, translations: Iterator, nbest: int) -> tuple[int, bool]:
    """Write translations as they come (the output opened with the first, so a refusal in it leaves none); Ctrl-C
    keeps the complete lines so far. Returns (lines, interrupted)."""
    count, interrupted = 0, False
    translations = iter(translations)
    try:
        first = next(translations, None)
    except KeyboardInterrupt:
        return 0, True
    if first is not None:
        translations = itertools.chain([first], translations)
    try:
        with _output(output) as out:
            try:
                for count, translation in enumerate(translations, 1):
                    out.write(_format(count, translation, nbest))
                    if count % 64 == 0:
                        out.flush()
            except KeyboardInterrupt:
                interrupted = True
            out.flush()
    except BrokenPipeError:  # the reader of stdout went away (| head): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError as e:
        write_failed(output or "standard output", e)
    except (RuntimeError, MemoryError) as e:
        if not out_of_memory(e):
            raise
        fail("out of memory while translating; lower --beam or --batch-tokens")
    return count, interrupted
