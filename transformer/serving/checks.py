"""What a request may ask, checked before it reaches the model.

Every refusal is a ``RequestError``: an HTTP status (400 a body that is not the JSON asked for, 413 too much,
422 a value out of range) and one line that names the problem and the fix, as the command line's errors do.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from typing import Any

from transformer.config import RANGES, DecodeConfig, check_decode, out_of_range
from transformer.decoding.translator import clean_line, source_line
from transformer.errors import ConfigError, UserError
from transformer.text.tokenizer import Tokenizer

EXAMPLE = '{"text": ["Ein Mann fährt Fahrrad."], "beam": 5}'
# The decode settings (DecodeConfig's fields) a request may set; the others are the server's: its batch size, lengths.
REQUEST = ("beam", "nbest", "alpha", "to", "sample", "temperature", "top_k", "top_p", "seed")


@dataclass(frozen=True)
class Limits:
    """What one request may hold (bytes, sentences, beam), how many sentences may wait, how many connections may be
    open and how long a client may take to send its request's headers and body (connections.py): what bounds the
    server's memory and keeps it answering under any load."""

    max_body: int = 1 << 20
    max_sentences: int = 256
    max_beam: int = 16
    max_pending: int = 4096
    max_connections: int = 256
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0


class RequestError(UserError):
    """A request the server refuses: ``status`` is its HTTP status, the message one line for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class TranslateRequest:
    """Lines to translate, their source tokens (what batches are sized by), the settings to translate them with, and
    whether to answer each hypothesis's word alignment."""

    lines: list[str]
    lengths: list[int]
    decode: DecodeConfig
    align: bool = False


@dataclass
class AttentionRequest:
    """One sentence, the layer (1-based) whose encoder-decoder attention the page draws, and the target language."""

    text: str
    layer: int
    to: str | None = None


def read_json(body: bytes) -> dict[str, Any]:
    """The body as a JSON object: UTF-8 (strictly: JSON has no other encoding), parsed, and an object."""
    if not body.strip():
        raise RequestError(400, f"the body is empty; send a JSON object such as {EXAMPLE}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(400, f"the body is not valid UTF-8 (byte {e.start}); send UTF-8 JSON") from None
    try:
        value = json.loads(text)
    except ValueError as e:
        if "digits" in str(e):  # Python's bound on the digits of an int read from text
            raise RequestError(400, "a number in the body has thousands of digits; send numbers such as 5") from None
        raise RequestError(400, f"the body is not valid JSON ({e}); send an object such as {EXAMPLE}") from None
    except RecursionError:
        raise RequestError(400, "the body's JSON is nested too deeply; send an object such as " + EXAMPLE) from None
    if not isinstance(value, dict):
        raise RequestError(400, f"the body is JSON but not an object; send an object such as {EXAMPLE}")
    return value


def _known_keys(obj: dict[str, Any], allowed: tuple[str, ...]) -> None:
    if unknown := sorted(set(obj) - set(allowed)):
        raise RequestError(400, f"unknown key {unknown[0]!r}; the keys are {', '.join(allowed)}")


def _integer(obj: dict[str, Any], key: str, default: int) -> int:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(400, f"{key} must be an integer, not {json.dumps(value)[:40]}")
    return value


def _in_range(key: str, value: int, low: int, high: int, why: str) -> int:
    if not low <= value <= high:
        digits = len(str(value))
        shown = value if digits <= 20 else f"{str(value)[:12]}... ({digits:,} digits)"
        raise RequestError(422, f"{key} {shown} is out of range; it must be {low} to {high} ({why})")
    return value


def source_lengths(lines: list[str], tokenizer: Tokenizer, max_positions: int, lowercase: bool = False) -> list[int]:
    """Source tokens of each line as the Translator cleans (and, for a ``lowercase`` model, lowercases) and encodes
    it; a line that does not fit the model's positions with its <END> is refused (the server never truncates: a
    client would not see the warning)."""
    lengths = [len(ids) for ids in tokenizer.encode_batch([source_line(s, lowercase) for s in lines])] if lines else []
    for no, n in enumerate(lengths, 1):
        if n + 1 > max_positions:
            raise RequestError(
                422, f"sentence {no}: {n} tokens, the model has {max_positions} positions; shorten or split it"
            )
    return lengths


def check_translate(
    obj: dict[str, Any],
    limits: Limits,
    tokenizer: Tokenizer,
    max_positions: int,
    decode: DecodeConfig,
    lowercase: bool = False,
    targets: tuple[str, ...] = (),
) -> TranslateRequest:
    """A ``POST /translate`` body: ``text`` a list of strings; the decode settings a request may set (REQUEST:
    ``beam``, ``alpha``, ``nbest``, sampling's, ``to``; default: the checkpoint's ``decode``), each checked by its type
    and range as a config file's are; ``align`` true for word alignments. ``to`` is one of the model's ``targets``
    (needed where it has several); ``lowercase``: the model's input is lowercased (data.lowercase)."""
    _known_keys(obj, ("text", *REQUEST, "align"))
    if "text" not in obj:
        raise RequestError(400, f"the key 'text' is missing; send an object such as {EXAMPLE}")
    lines = obj["text"]
    if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
        raise RequestError(400, f"text must be a list of strings, e.g. {EXAMPLE}")
    if len(lines) > limits.max_sentences:
        raise RequestError(
            413, f"{len(lines)} sentences in one request; send at most {limits.max_sentences} per request"
        )
    given = {key: _setting(key, obj[key]) for key in REQUEST if key in obj and key not in ("beam", "nbest", "to")}
    sampling = given.get("sample", decode.sample)
    beam_limit = min(limits.max_beam, tokenizer.vocab_size)
    beam = _in_range("beam", _integer(obj, "beam", 1 if sampling else decode.beam), 1, beam_limit, "1 is greedy search")
    most, why = (limits.max_beam, "samples a request may ask") if sampling else (beam, "at most the beam")
    nbest = _in_range("nbest", _integer(obj, "nbest", 1), 1, most, why)
    to = _target(obj, decode.to, targets)
    settings = dataclasses.replace(decode, **given, beam=beam, nbest=nbest, to=to)
    try:
        check_decode(settings, tokenizer.vocab_size)
    except ConfigError as e:
        raise RequestError(422, str(e)) from None
    align = obj.get("align", False)
    if not isinstance(align, bool):
        raise RequestError(400, f"align must be true or false, not {json.dumps(align)[:40]}")
    lengths = source_lengths(lines, tokenizer, max_positions, lowercase)
    return TranslateRequest(lines, lengths, settings, align)


_KINDS = typing.get_type_hints(DecodeConfig)


def _setting(key: str, value: Any) -> Any:
    """A request's value of decode setting ``key``, of the field's type and within its range (config.RANGES), as a
    config file's would be."""
    kind = _KINDS[key]
    if kind is bool and not isinstance(value, bool):
        raise RequestError(400, f"{key} must be true or false, not {json.dumps(value)[:40]}")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise RequestError(400, f"{key} must be an integer, not {json.dumps(value)[:40]}")
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise RequestError(400, f"{key} must be a number, not {json.dumps(value)[:40]}")
    if f"decode.{key}" in RANGES and (want := out_of_range(f"decode.{key}", value)) is not None:
        shown = value if len(str(value)) <= 20 else f"{str(value)[:12]}..."
        raise RequestError(422, f"{key} {shown} is out of range; it must be {want}")
    return float(value) if kind is float else value


def _target(obj: dict[str, Any], default: str | None, targets: tuple[str, ...]) -> str | None:
    """``to``: one of the model's target languages; required where it has several."""
    to = obj.get("to", default)
    if to is not None and not isinstance(to, str):
        raise RequestError(400, f"to must be a language code as a string, not {json.dumps(to)[:40]}")
    if to is None and len(targets) > 1:
        raise RequestError(422, f'the model translates into {", ".join(targets)}; send "to" with one of them')
    if to is not None and targets and to not in targets:
        raise RequestError(
            422, f"to {to[:40]!r}: the model does not translate into it; its targets: {', '.join(targets)}"
        )
    return to


def check_attention(
    obj: dict[str, Any],
    tokenizer: Tokenizer,
    max_positions: int,
    layers: int,
    lowercase: bool = False,
    targets: tuple[str, ...] = (),
) -> AttentionRequest:
    """A ``POST /attention`` body: ``text`` one non-empty sentence, ``layer`` 1..layers (default: the last); ``to``
    and ``lowercase`` as for check_translate."""
    _known_keys(obj, ("text", "layer", "to"))
    text = obj.get("text")
    if not isinstance(text, str):
        raise RequestError(400, 'text must be one sentence as a string, e.g. {"text": "Ein Mann fährt Fahrrad."}')
    if not clean_line(text):
        raise RequestError(422, "the sentence is empty; type a sentence to translate")
    layer = _in_range("layer", _integer(obj, "layer", layers), 1, layers, "the model's layers")
    to = _target(obj, None, targets)
    source_lengths([text], tokenizer, max_positions, lowercase)
    return AttentionRequest(text, layer, to)
