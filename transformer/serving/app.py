"""The HTTP app of ``tfm serve`` on Starlette: the JSON API, the page, and every refusal as one line of JSON.

``POST /translate`` and ``POST /attention`` are checked (checks.py) and queued on the Batcher, whose thread owns
the model and does all its tensor work; the event loop only awaits the result, so many clients wait at once while
one chunk is translated.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from transformer.checkpoint import Loaded
from transformer.decoding.attention_maps import attention_maps
from transformer.decoding.translator import Translation, target_of
from transformer.errors import UserError
from transformer.serving.batcher import Batcher, Busy, Closed, OutOfMemory
from transformer.serving.checks import Limits, RequestError, check_attention, check_translate, read_json

STATIC = Path(__file__).parent / "static"
PAGE_FILES = {
    "/": ("index.html", "text/html"),
    "/page.js": ("page.js", "text/javascript"),
    "/page.css": ("page.css", "text/css"),
}
ROUTES = "POST /translate, POST /attention, GET /health, GET /info and GET / (the page)"
PAGE_HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:", "Cache-Control": "no-cache"}


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def _body(request: Request, limits: Limits) -> bytes:
    """The request's body, refused (413) as soon as it is known to exceed ``max_body`` bytes, announced or not, and
    (408) when it has not all come within ``body_timeout_s``."""
    limit = limits.max_body
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"the body has {int(declared):,} bytes; send at most {limit:,} per request")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise RequestError(413, f"the body has over {limit:,} bytes; send at most {limit:,} per request")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestError(
            408, f"the body did not arrive within {limits.body_timeout_s:g} s; send the whole request at once"
        ) from None
    except ClientDisconnect:
        raise RequestError(400, "the client closed the connection before the body ended") from None
    return b"".join(chunks)


def _hypotheses(t: Translation) -> list[dict[str, Any]]:
    links = t.alignments or [None] * len(t.texts)
    return [
        {"text": text, "score": round(score, 4), **({"alignment": a} if a is not None else {})}
        for text, score, a in zip(t.texts, t.scores, links)
    ]


def _translation(t: Translation, nbest: int) -> dict[str, Any]:
    """One line's answer: the best text and its score (None for an empty line), its alignment when asked for, and
    the n-best when asked for."""
    best = {"text": t.best, "score": round(t.scores[0], 4) if t.scores else None}
    if t.alignments is not None:
        best["alignment"] = t.alignments[0] if t.alignments else ""
    return {**best, "nbest": _hypotheses(t)} if nbest > 1 else best


def create_app(members: list[Loaded], batcher: Batcher, limits: Limits) -> Starlette:
    """The app serving ``members`` (one checkpoint, or an ensemble's) through ``batcher`` (whose Translator holds the
    default decode settings); the attention picture is the first member's."""
    loaded = members[0]
    cfg, tokenizer = loaded.cfg, loaded.tokenizer
    max_positions = batcher.translator.max_positions - cfg.data.tagged  # a multilingual source's tag takes one
    defaults, targets = batcher.translator.decode, tuple(batcher.translator.targets)
    pages = {path: ((STATIC / name).read_bytes(), kind) for path, (name, kind) in PAGE_FILES.items()}

    async def translate(request: Request) -> JSONResponse:
        obj = read_json(await _body(request, limits))
        req = check_translate(obj, limits, tokenizer, max_positions, defaults, cfg.data.lowercase, targets)
        out = await asyncio.wrap_future(batcher.translate(req.lines, req.lengths, req.decode, req.align))
        d = req.decode
        return JSONResponse(
            {
                "translations": [_translation(t, d.nbest) for t in out],
                "beam": d.beam,
                "alpha": d.alpha,
                "nbest": d.nbest,
            }
        )

    async def attention(request: Request) -> JSONResponse:
        body = read_json(await _body(request, limits))
        req = check_attention(body, tokenizer, max_positions, cfg.model.depths[1], cfg.data.lowercase, targets)
        d = cfg.decode
        tag = tokenizer.tags[target_of(cfg, req.to)] if cfg.data.tagged else None

        def draw() -> dict[str, Any]:
            maps = attention_maps(
                loaded.model,
                tokenizer,
                req.text,
                "cross",
                req.layer - 1,
                d.max_len_a,
                d.max_len_b,
                cfg.data.lowercase,
                tag,
            )
            return {
                "translation": maps.translation,
                "layer": maps.layer + 1,
                "source": maps.cols,
                "output": maps.rows,
                "weights": maps.weights.double().round(decimals=4).tolist(),
            }

        return JSONResponse(await asyncio.wrap_future(batcher.run(draw)))

    async def health(request: Request) -> JSONResponse:
        if not batcher.alive:
            return _error(503, "the model's worker has stopped; restart tfm serve")
        return JSONResponse({"status": "ok", "pending": batcher.pending, "chunks": batcher.chunks})

    async def info(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "checkpoint": str(loaded.path),
                "step": loaded.meta.get("step"),
                "ensemble": [{"checkpoint": str(m.path), "step": m.meta.get("step")} for m in members],
                "source": cfg.data.src_lang,
                "target": cfg.data.tgt_lang,
                "directions": [f"{src}-{tgt}" for src, tgt in cfg.data.pairs()],
                "targets": list(targets),
                "vocab_size": tokenizer.vocab_size,
                "config": dataclasses.asdict(cfg),
                "decode": {
                    k: getattr(defaults, k) for k in ("beam", "alpha", "max_len_a", "max_len_b", "batch_tokens")
                },
                "device": str(batcher.translator.device),
                "precision": batcher.translator.precision,
                "limits": dataclasses.asdict(limits),
            }
        )

    async def page(request: Request) -> Response:
        body, kind = pages[request.url.path]
        return Response(body, media_type=kind, headers=PAGE_HEADERS)

    routes = [
        Route("/translate", translate, methods=["POST"]),
        Route("/attention", attention, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/info", info, methods=["GET"]),
        *(Route(path, page, methods=["GET"]) for path in pages),
    ]
    return Starlette(routes=routes, exception_handlers=_HANDLERS)


async def _refused(request: Request, e: Exception) -> JSONResponse:
    """The one-line JSON answer to each kind of failure: the client's, the server's state's, or a bug's (500, whose
    traceback uvicorn logs: Starlette raises the exception again once the answer is sent)."""
    if isinstance(e, RequestError):
        return _error(e.status, str(e), {"Connection": "close"} if e.status == 408 else None)
    if isinstance(e, HTTPException):
        return _error(e.status_code, f"{request.method} {request.url.path}: {e.detail}; the routes are {ROUTES}")
    if isinstance(e, Busy):
        return _error(503, f"the server is busy ({e}); retry in a moment", {"Retry-After": "1"})
    if isinstance(e, Closed):
        return _error(503, f"{e}; retry when it is back")
    if isinstance(e, OutOfMemory):
        return _error(
            413, "out of memory translating this request alone; send fewer or shorter sentences or a smaller beam"
        )
    if isinstance(e, UserError):
        return _error(422, str(e))
    return _error(500, f"internal error ({type(e).__name__}); the server's log has the traceback")


_HANDLERS = {kind: _refused for kind in (RequestError, HTTPException, Busy, Closed, OutOfMemory, UserError, Exception)}
