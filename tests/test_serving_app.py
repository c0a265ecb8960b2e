"""The HTTP app of tfm serve, served by uvicorn on 127.0.0.1 with the tiny trained checkpoint: answers equal the
Translator's and `tfm attention`'s data, every bad request gets a 4xx and one line of JSON, and the server keeps
serving after each (out of memory on one request included)."""

from __future__ import annotations

import dataclasses
import http.client
import json
import re

import pytest
import torch
from serve_helpers import Client, call, post, serving, translator_of

from transformer import checkpoint
from transformer.decoding.attention_maps import attention_maps
from transformer.decoding.translator import Translator
from transformer.serving.checks import Limits

LIMITS = Limits(max_body=4096, max_sentences=8, max_beam=4)
LINES = ["Ein Mann fährt Fahrrad.", "", "Der Hund läuft im Park.", "Zwei Kinder spielen im Wasser."]


@pytest.fixture(scope="module")
def loaded(tiny_run):
    return checkpoint.load(tiny_run.run_dir / "best")


@pytest.fixture(scope="module")
def translator(loaded) -> Translator:
    return translator_of(loaded)


@pytest.fixture(scope="module")
def url(loaded, translator):
    with serving(loaded, LIMITS, translator) as url:
        yield url


def still_serving(url: str) -> None:
    status, answer = post(url, "/translate", {"text": ["Ein Mann."]})
    assert status == 200 and len(answer["translations"]) == 1
    assert call(url, "GET", "/health")[1]["status"] == "ok"


def test_health_and_info_describe_the_model(url, loaded):
    status, health = call(url, "GET", "/health")
    assert status == 200 and health["status"] == "ok"
    status, info = call(url, "GET", "/info")
    assert status == 200
    assert (info["source"], info["target"]) == ("de", "en")
    assert info["checkpoint"] == str(loaded.path) and info["step"] == loaded.meta["step"]
    assert info["config"] == dataclasses.asdict(loaded.cfg)
    assert info["decode"]["beam"] == loaded.cfg.decode.beam
    assert info["limits"] == dataclasses.asdict(LIMITS)


def test_translations_and_scores_are_the_translators(url, translator):
    status, answer = post(url, "/translate", {"text": LINES})
    assert status == 200
    expected = translator.translate_chunk(LINES)
    assert [t["text"] for t in answer["translations"]] == [t.best for t in expected]
    assert answer["translations"][1] == {"text": "", "score": None}
    assert answer["translations"][0]["score"] == pytest.approx(expected[0].scores[0], abs=1e-4)
    assert (answer["beam"], answer["nbest"]) == (translator.decode.beam, 1)


def test_settings_of_a_request_are_used(url, translator):
    status, answer = post(url, "/translate", {"text": LINES, "beam": 3, "nbest": 2, "alpha": 0})
    assert status == 200
    decode = dataclasses.replace(translator.decode, beam=3, nbest=2, alpha=0.0)
    expected = translator.with_decode(decode).translate_chunk(LINES)
    assert [[h["text"] for h in t["nbest"]] for t in answer["translations"]] == [t.texts for t in expected]
    assert (answer["beam"], answer["nbest"], answer["alpha"]) == (3, 2, 0.0)
    status, answer = post(url, "/translate", {"text": LINES, "beam": 1})
    greedy = translator.with_decode(dataclasses.replace(translator.decode, beam=1)).translate_chunk(LINES)
    assert [t["text"] for t in answer["translations"]] == [t.best for t in greedy]


def test_samples_and_alignments_are_the_translators(url, translator):
    """A sampling request draws what translate draws for the same lines and seed (its lines numbered from 1, whatever
    else the server decodes), and ``align`` answers each hypothesis's Pharaoh pairs."""
    body = {"text": LINES, "sample": True, "nbest": 2, "seed": 7, "top_k": 5, "align": True}
    status, answer = post(url, "/translate", body)
    assert status == 200
    decode = dataclasses.replace(translator.decode, beam=1, nbest=2, sample=True, seed=7, top_k=5)
    expected = translator.with_decode(decode).translate_chunk(LINES, align=True)
    assert [[h["text"] for h in t["nbest"]] for t in answer["translations"]] == [t.texts for t in expected]
    assert [[h["alignment"] for h in t["nbest"]] for t in answer["translations"]] == [t.alignments for t in expected]
    assert [t["alignment"] for t in answer["translations"]] == [(t.alignments or [""])[0] for t in expected]
    status, again = post(url, "/translate", body)
    assert again["translations"] == answer["translations"]
    status, plain = post(url, "/translate", {"text": LINES[:1]})
    assert "alignment" not in plain["translations"][0]


def test_attention_is_the_data_tfm_attention_draws(url, loaded):
    status, answer = post(url, "/attention", {"text": LINES[0], "layer": 1})
    assert status == 200
    d = loaded.cfg.decode
    maps = attention_maps(loaded.model, loaded.tokenizer, LINES[0], "cross", 0, d.max_len_a, d.max_len_b)
    assert answer["translation"] == maps.translation and answer["layer"] == 1
    assert (answer["output"], answer["source"]) == (maps.rows, maps.cols)
    assert torch.tensor(answer["weights"]).double() == pytest.approx(maps.weights.double(), abs=1e-4)


def test_the_page_is_served_with_its_script_and_style_and_names_nothing_outside(url):
    status, html = call(url, "GET", "/")
    assert status == 200 and 'src="page.js"' in html and 'href="page.css"' in html
    assert not re.search(r"(src|href)=\"(https?:)?//", html)
    status, script = call(url, "GET", "/page.js")
    assert status == 200 and 'call("attention"' in script and "http" not in script
    assert call(url, "GET", "/page.css")[0] == 200


def chunked(url: str, size: int) -> tuple[int, dict]:
    """A body sent in chunks, without Content-Length: the limit must hold for it too."""
    conn = http.client.HTTPConnection(*url.removeprefix("http://").split(":"))
    body = b'{"text": ["' + b"a" * size + b'"]}'
    conn.request("POST", "/translate", body=iter([body[i : i + 1024] for i in range(0, len(body), 1024)]))
    response = conn.getresponse()
    return response.status, json.loads(response.read())


BAD = {
    "malformed JSON": (b'{"text": [', 400),
    "not an object": (b'["Ein Mann."]', 400),
    "empty body": (b"", 400),
    "invalid UTF-8": (b'{"text": ["\xc3\x28"]}', 400),
    "text a string": (b'{"text": "Ein Mann."}', 400),
    "a number in text": (b'{"text": ["Ein Mann.", 7]}', 400),
    "beam a string": (b'{"text": ["a"], "beam": "5"}', 400),
    "unknown key": (b'{"text": ["a"], "beams": 5}', 400),
    "too many sentences": (json.dumps({"text": ["a"] * 9}).encode(), 413),
    "body over the limit": (json.dumps({"text": ["a" * 5000]}).encode(), 413),
    "over-long sentence": (json.dumps({"text": ["Mann " * 100]}).encode(), 422),
    "beam 0": (b'{"text": ["a"], "beam": 0}', 422),
    "beam over the limit": (b'{"text": ["a"], "beam": 5}', 422),
    "nbest over the beam": (b'{"text": ["a"], "beam": 2, "nbest": 3}', 422),
    "alpha NaN": (b'{"text": ["a"], "alpha": NaN}', 422),
    "alpha 1e308": (b'{"text": ["x"], "alpha": 1e308}', 422),
    "alpha past any float": (b'{"text": ["x"], "alpha": 1' + b"0" * 400 + b"}", 422),
    "beam past any integer type": (b'{"text": ["x"], "beam": 1' + b"0" * 400 + b"}", 422),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_requests_get_a_4xx_and_one_line_and_the_server_keeps_serving(url, name):
    body, expected = BAD[name]
    status, answer = call(url, "POST", "/translate", body)
    assert status == expected, answer
    assert list(answer) == ["error"] and answer["error"] and "\n" not in answer["error"]
    still_serving(url)


@pytest.mark.parametrize(
    "method, path, body, expected",
    [
        ("GET", "/nowhere", None, 404),
        ("GET", "/translate", None, 405),
        ("DELETE", "/info", None, 405),
        ("POST", "/attention", b'{"text": "Ein Mann.", "layer": 9}', 422),
        ("POST", "/attention", b'{"text": ["Ein Mann."]}', 400),
        ("POST", "/attention", b'{"text": "  "}', 422),
    ],
)
def test_wrong_routes_and_bad_attention_requests_get_a_4xx_and_one_line(url, method, path, body, expected):
    status, answer = call(url, method, path, body)
    assert status == expected and list(answer) == ["error"] and "\n" not in answer["error"]
    still_serving(url)


def test_a_body_over_the_limit_is_refused_when_sent_in_chunks_too(url):
    status, answer = chunked(url, 5000)
    assert status == 413 and "at most 4,096" in answer["error"]
    still_serving(url)


def test_out_of_memory_fails_that_request_only(url, monkeypatch):
    real = Translator.translate_chunk

    def short_of_memory(self, lines, first_line_no=1, prefixes=None, align=False):
        if "Riesig" in lines:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 80000000000 bytes")
        return real(self, lines, first_line_no)

    monkeypatch.setattr(Translator, "translate_chunk", short_of_memory)
    status, answer = post(url, "/translate", {"text": ["Riesig"]})
    assert status == 413 and "out of memory" in answer["error"]
    still_serving(url)


def test_one_connection_serves_many_requests_good_and_bad(url):
    client = Client(url)
    try:
        for _ in range(3):
            assert client.post("/translate", {"text": ["Ein Mann."]})[0] == 200
            assert client.call("POST", "/translate", b"{")[0] == 400
            assert client.post("/translate", {"text": ["a" * 5000]})[0] == 413  # its body is left unread
    finally:
        client.close()
