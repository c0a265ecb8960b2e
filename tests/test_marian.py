"""``tfm export --format hf``: a MarianMTModel folder that transformers reloads and that computes tfm's network
(skipped without transformers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from tiny import ROOT, tiny_config

from transformer import checkpoint
from transformer.decoding.search import beam_search, greedy_search
from transformer.errors import ExportError
from transformer.export.marian import residual_order
from transformer.export.write import export
from transformer.model.transformer import Transformer, sinusoids

transformers = pytest.importorskip("transformers")

LINES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch.", "<END> Hallo"]


@pytest.fixture(params=[True, False], ids=["tied", "untied"])
def saved(request, tmp_path, sample_tokenizer):
    """A randomly initialised tiny post-norm checkpoint, its embeddings tied or not."""
    cfg = tiny_config(tmp_path, model={"dropout": 0.0, "tie_embeddings": request.param})
    torch.manual_seed(0)
    model = Transformer(cfg.model, sample_tokenizer.vocab_size, sample_tokenizer.pad_id)
    return checkpoint.save(tmp_path / "ckpt", cfg, sample_tokenizer, model, {"step": 0})


def _reload(folder):
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return tokenizer, transformers.MarianMTModel.from_pretrained(folder).eval()


def test_residual_order_turns_tfm_sinusoids_into_marians():
    d = 16
    pos = torch.arange(5, dtype=torch.float64)[:, None]
    freq = 10000 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    marian = torch.cat([torch.sin(pos * freq), torch.cos(pos * freq)], 1).float()
    assert torch.allclose(sinusoids(0, 5, d)[:, residual_order(d)], marian, atol=1e-6)


def test_reloaded_export_computes_tfm_logits(saved, tmp_path):
    out = export(saved, tmp_path / "hf", fmt="hf")
    tokenizer, marian = _reload(out)
    loaded = checkpoint.load(saved)
    batch = tokenizer(LINES, return_tensors="pt", padding=True)
    tgt = torch.tensor([[1, 40, 41, 42, 2], [1, 50, 2, 0, 0], [1, 60, 61, 2, 0], [1, 2, 0, 0, 0]])
    with torch.no_grad():
        ours = loaded.model.eval()(batch.input_ids, tgt)
        theirs = marian(**batch, decoder_input_ids=tgt, decoder_attention_mask=(tgt != 0).long()).logits
    keep = tgt != 0
    assert torch.allclose(ours[keep], theirs[keep], atol=1e-4), (ours - theirs)[keep].abs().max()


def test_tokenizer_encodes_and_decodes_as_tfm(saved, tmp_path):
    out = export(saved, tmp_path / "hf", fmt="hf")
    tokenizer, _ = _reload(out)
    tok = checkpoint.load(saved).tokenizer
    for line in LINES + ["  spaces\tand\u00e9 ünïcödé 漢字 "]:
        ids = tokenizer(line).input_ids
        assert ids == tok.encode(line) + [tok.end_id]  # a literal "<END>" in the text stays text
        assert tokenizer.decode(ids, skip_special_tokens=True) == tok.decode(ids)
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id) == (0, 2, 1)
    settings = json.loads((out / "tokenizer_config.json").read_text())
    assert settings["tokenizer_class"] == "PreTrainedTokenizerFast"  # the name transformers 4 loads too


def test_generation_config_carries_tfms_decoding_defaults(saved, tmp_path):
    out = export(saved, tmp_path / "hf", fmt="hf")
    cfg = checkpoint.read_config(saved)
    gen = transformers.GenerationConfig.from_pretrained(out)
    assert (gen.num_beams, gen.decoder_start_token_id, gen.eos_token_id, gen.pad_token_id) == (cfg.decode.beam, 1, 2, 0)
    assert gen.suppress_tokens == [0, 1]  # <PAD> and <START> are never generated
    assert gen.length_penalty == pytest.approx(2 * cfg.decode.alpha / 3, abs=1e-4)
    rule = int(cfg.decode.max_len_a * (cfg.data.max_len + 1) + cfg.decode.max_len_b) + 1  # longest source + <END>
    assert gen.max_new_tokens == min(rule, cfg.model.max_positions - 1)


def test_greedy_and_beam_search_give_tfms_tokens(tiny_run, tmp_path):
    """Greedy, and beam search where the two length penalties agree (tfm's alpha 0, transformers' 0)."""
    out = export(tiny_run.run_dir / "best", tmp_path / "hf", fmt="hf")
    tokenizer, marian = _reload(out)
    loaded = checkpoint.load(tiny_run.run_dir / "best")
    tok = loaded.tokenizer
    for line in LINES:
        src = torch.tensor([tok.encode(line) + [tok.end_id]])
        limit = src.size(1) + 8
        greedy = greedy_search(loaded.model, src, tok.start_id, tok.end_id, max_len_b=8)[0].tokens
        beam = beam_search(loaded.model, src, tok.start_id, tok.end_id, beam=3, alpha=0.0, max_len_b=8)[0][0].tokens
        with torch.no_grad():
            hf_greedy = marian.generate(src, num_beams=1, max_new_tokens=limit)[0, 1:].tolist()
            hf_beam = marian.generate(src, num_beams=3, length_penalty=0.0, max_new_tokens=limit)[0, 1:].tolist()
        if len(greedy) < limit:  # tfm stopped on <END>, not on its length limit
            assert hf_greedy[: len(greedy) + 1] == greedy + [tok.end_id], line
        if len(beam) < limit:
            assert hf_beam[: len(beam) + 1] == beam + [tok.end_id], line


def test_export_loads_and_translates_with_no_tfm_code(tiny_run, tmp_path):
    """In a fresh interpreter where importing tfm's packages fails, transformers alone reloads and translates."""
    out = export(tiny_run.run_dir / "best", tmp_path / "hf", fmt="hf")
    script = textwrap.dedent(
        f"""
        import sys
        class NoTfm:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("transformer", "cli", "configs"):
                    raise ImportError("tfm code imported: " + name)
        sys.meta_path.insert(0, NoTfm())
        from transformers import AutoTokenizer, MarianMTModel
        tok = AutoTokenizer.from_pretrained({str(out)!r})
        model = MarianMTModel.from_pretrained({str(out)!r})
        batch = tok(["Ein Mann fährt Fahrrad."], return_tensors="pt")
        print(tok.batch_decode(model.generate(**batch, num_beams=2, max_new_tokens=8), skip_special_tokens=True)[0])
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip()


def test_export_refuses_pre_norm_and_an_existing_folder(tmp_path, sample_tokenizer, saved):
    cfg = tiny_config(tmp_path, model={"norm_first": True})
    model = Transformer(cfg.model, sample_tokenizer.vocab_size, sample_tokenizer.pad_id)
    pre = checkpoint.save(tmp_path / "pre", cfg, sample_tokenizer, model, {"step": 0})
    with pytest.raises(ExportError, match="pre-norm"):
        export(pre, tmp_path / "hf-pre", fmt="hf")
    assert not (tmp_path / "hf-pre").exists()
    export(saved, tmp_path / "hf", fmt="hf")
    with pytest.raises(ExportError, match="already exists"):
        export(saved, tmp_path / "hf", fmt="hf")


def test_export_without_transformers_is_one_line(saved, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ExportError, match="pip install transformers"):
        export(saved, tmp_path / "hf", fmt="hf")
    assert not (tmp_path / "hf").exists()


def test_tfm_export_hf_command(tiny_run, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-m", "cli", "export", "--checkpoint", str(tiny_run.run_dir / "best")]
        + ["--output", str(tmp_path / "hf"), "--format", "hf"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(tmp_path / "hf")
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "README.md"} <= {
        p.name for p in (tmp_path / "hf").iterdir()
    }


def test_a_multilingual_export_reads_the_target_tag_from_the_text(tiny_tagged_run, tmp_path):
    """As OPUS-MT's models: ">>de<< text" encodes to the tag's id and the text's, and the model translates it as tfm
    does with --to de (greedy)."""
    loaded = checkpoint.load(tiny_tagged_run.run_dir / "best")
    out = export(loaded.path, tmp_path / "hf", fmt="hf")
    tokenizer, marian = _reload(out)
    tok = loaded.tokenizer
    for target, line in (("de", "A man rides a bike."), ("en", "Ein Mann fährt Fahrrad.")):
        ids = tokenizer(f">>{target}<< {line}").input_ids
        assert ids == [tok.tags[target], *tok.encode(line), tok.end_id]
        ours = greedy_search(loaded.model, torch.tensor([ids]), tok.start_id, tok.end_id, max_len_b=8)[0].tokens
        with torch.no_grad():
            theirs = marian.generate(torch.tensor([ids]), num_beams=1, max_new_tokens=len(ids) + 8)[0, 1:].tolist()
        if len(ours) < len(ids) + 8:
            assert theirs[: len(ours) + 1] == ours + [tok.end_id], line


def test_an_encoder_and_a_decoder_of_different_depths_export_exactly(tmp_path, sample_tokenizer):
    """A student's shape (3 encoder layers, 1 decoder layer): the Marian folder computes tfm's logits."""
    cfg = tiny_config(tmp_path, model={"dropout": 0.0, "encoder_layers": 3, "decoder_layers": 1})
    torch.manual_seed(0)
    model = Transformer(cfg.model, sample_tokenizer.vocab_size, sample_tokenizer.pad_id)
    assert (len(model.encoder.layers), len(model.decoder.layers)) == (3, 1)
    saved = checkpoint.save(tmp_path / "ckpt", cfg, sample_tokenizer, model, {"step": 0})
    out = export(saved, tmp_path / "hf", fmt="hf")
    tokenizer, marian = _reload(out)
    assert (marian.config.encoder_layers, marian.config.decoder_layers) == (3, 1)
    batch = tokenizer(LINES, return_tensors="pt", padding=True)
    tgt = torch.tensor([[1, 40, 41, 42, 2], [1, 50, 2, 0, 0], [1, 60, 61, 2, 0], [1, 2, 0, 0, 0]])
    with torch.no_grad():
        ours = checkpoint.load(saved).model.eval()(batch.input_ids, tgt)
        theirs = marian(**batch, decoder_input_ids=tgt, decoder_attention_mask=(tgt != 0).long()).logits
    keep = tgt != 0
    assert torch.allclose(ours[keep], theirs[keep], atol=1e-4), (ours - theirs)[keep].abs().max()
