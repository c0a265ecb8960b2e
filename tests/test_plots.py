"""Pictures: each is a valid PNG of the documented size; without matplotlib, one clear error line.

The drawing tests are skipped only where matplotlib is missing (it is in the dev extra, so CI runs them).
"""

from __future__ import annotations

import json
import struct
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
from tiny import tiny_config
from typer.testing import CliRunner

from cli.main import app
from transformer import checkpoint, plots
from transformer.decoding.attention_maps import attention_maps
from transformer.model.transformer import Transformer
from transformer.text.corpus import load_split
from transformer.text.tokenizer import train_tokenizer

needs_matplotlib = pytest.mark.skipif(find_spec("matplotlib") is None, reason="matplotlib not installed (tfm[plot])")
SENTENCE = "Ein Mann fährt Fahrrad."


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG signature and IHDR header; fails on anything that is not a PNG."""
    head = Path(path).read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", head[16:24])


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """An untrained tiny model (h=2, N=1) saved as a checkpoint: enough to draw its attention."""
    root = tmp_path_factory.mktemp("plots")
    cfg = tiny_config(root, decode={"max_len_b": 4})
    tok = train_tokenizer(cfg.tokenizer, load_split(cfg.data, "train"))
    return checkpoint.save(root / "ckpt", cfg, tok, Transformer(cfg.model, tok.vocab_size, tok.pad_id), {"step": 0})


@needs_matplotlib
def test_training_curves_png(tmp_path):
    entries = [{"step": s, "kind": "train", "loss": 5 / s, "lr": 1e-3 * min(1, s / 4)} for s in range(1, 9)]
    entries += [{"step": s, "kind": "valid", "valid_loss": 6 / s, "valid_bleu": 3.0 * s} for s in (4, 8)]
    entries.append({"step": 8, "kind": "train", "loss": 0.6, "lr": 1e-3})  # a resumed run repeats a step
    lines = [json.dumps(e) for e in entries] + ['{"step": 9, "kin']  # and a line cut short by a crash
    (tmp_path / "log.jsonl").write_text("\n".join(lines) + "\n")
    out = plots.plot_training(tmp_path)
    assert out == tmp_path / "training.png" and png_size(out) == plots.CURVES_SIZE
    assert [e["loss"] for e in plots.read_log(tmp_path)["train"]][-1] == 0.6


def test_landmarks_are_the_last_validation_by_20_minutes_and_the_best():
    train = [{"step": s, "kind": "train", "elapsed_s": 60.0 * s} for s in range(10, 70, 10)]  # one step a minute
    valid = [{"step": s, "kind": "valid", "valid_bleu": b} for s, b in ((15, 10.0), (20, 20.0), (40, 35.0), (60, 33.0))]
    marks = plots.landmarks({"train": train, "valid": valid})
    assert marks == {
        "best": {"step": 40, "minutes": 40.0, "bleu": 35.0},
        "20 min": {"step": 20, "minutes": 20.0, "bleu": 20.0},
    }
    assert list(plots.landmarks({"train": train[:1], "valid": valid[:2]})) == []  # no clock from one entry
    short = [{"step": s, "kind": "train", "elapsed_s": 50.0 * s} for s in (10, 20)]  # ends at minute 16.7
    assert list(plots.landmarks({"train": short, "valid": valid[:2]})) == ["best"]


@needs_matplotlib
def test_attention_one_head_and_all_heads(ckpt, tmp_path):
    loaded = checkpoint.load(ckpt)
    maps = attention_maps(loaded.model, loaded.tokenizer, SENTENCE, "cross", max_len_b=4)
    assert maps.weights.shape == (2, len(maps.rows), len(maps.cols))
    assert maps.cols[-1] == "<END>" and maps.rows[-1] == "<END>"
    assert png_size(plots.plot_attention(maps, tmp_path / "one.png", head=1)) == plots.PANEL_SIZE
    assert png_size(plots.plot_attention(maps, tmp_path / "all.png")) == (2 * plots.PANEL_SIZE[0], plots.PANEL_SIZE[1])
    encoder = attention_maps(loaded.model, loaded.tokenizer, SENTENCE, "encoder")
    assert encoder.rows == encoder.cols == maps.cols
    decoder = attention_maps(loaded.model, loaded.tokenizer, SENTENCE, "decoder", max_len_b=4)
    assert decoder.cols[0] == "<START>" and len(decoder.cols) == len(decoder.rows)


def test_a_model_trained_on_lowercased_text_is_shown_its_input_lowercased(ckpt):
    loaded = checkpoint.load(ckpt)
    shouted = attention_maps(loaded.model, loaded.tokenizer, SENTENCE.upper(), lowercase=True)
    lowered = attention_maps(loaded.model, loaded.tokenizer, SENTENCE.lower())
    assert shouted.cols == lowered.cols and shouted.weights.equal(lowered.weights)
    assert attention_maps(loaded.model, loaded.tokenizer, SENTENCE.upper()).cols != lowered.cols


@needs_matplotlib
def test_cli_attention_and_plot(ckpt, tmp_path):
    cli = CliRunner()
    out = tmp_path / "self.png"
    r = cli.invoke(
        app,
        [
            "attention",
            SENTENCE,
            "--checkpoint",
            str(ckpt),
            "--layer",
            "1",
            "--head",
            "2",
            "--self",
            "decoder",
            "--output",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    assert png_size(out) == plots.PANEL_SIZE
    r = cli.invoke(app, ["attention", SENTENCE, "--checkpoint", str(ckpt), "--layer", "2"])
    assert r.exit_code == 2 and "layer 2 does not exist; the model has layers 1..1" in r.output
    r = cli.invoke(app, ["plot", str(tmp_path)])
    assert r.exit_code == 2 and "log.jsonl not found" in r.output


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_picture_that_cannot_be_written_is_one_line(ckpt):
    r = CliRunner().invoke(app, ["attention", SENTENCE, "--checkpoint", str(ckpt), "--output", "/dev/full"])
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines()[-1].startswith("error: cannot write /dev/full: no space left")


def test_missing_matplotlib_is_one_clear_error(ckpt, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import now raises ImportError
    r = CliRunner().invoke(app, ["attention", SENTENCE, "--checkpoint", str(ckpt), "--output", str(tmp_path / "a.png")])
    assert r.exit_code == 2
    assert r.output.strip().splitlines()[-1] == (
        "error: drawing needs matplotlib, which is not installed; pip install matplotlib"
    )


@needs_matplotlib
def test_validation_bleu_gets_a_minutes_axis_with_the_20th_minute_marked():
    from matplotlib.figure import Figure

    ax = Figure().subplots()
    train = [{"step": s, "elapsed_s": 60.0 * s / 10} for s in (10, 100, 400)]  # a minute every 10 updates
    plots._minutes_axis(ax, {"train": train, "valid": []})
    assert len(ax.child_axes) == 1 and ax.child_axes[0].get_xlabel() == "minutes"
    assert [line.get_xdata()[0] for line in ax.get_lines()] == [200.0]  # minute 20 = update 200
    short = Figure().subplots()
    plots._minutes_axis(short, {"train": train[:2], "valid": []})  # 10 minutes in all: no 20th minute to mark
    assert short.get_lines() == [] and len(short.child_axes) == 1
    labelled = Figure().subplots()
    plots._minutes_axis(
        labelled, {"train": train, "valid": [{"step": 200, "valid_bleu": 9.0}, {"step": 400, "valid_bleu": 12.5}]}
    )
    assert sorted(t.get_text() for t in labelled.texts) == [
        "20 min: BLEU 9.0 at minute 20",
        "best: BLEU 12.5 at minute 40",
    ]


def test_a_damaged_log_line_is_skipped_and_the_intact_ones_plotted(tmp_path):
    """A line that is not UTF-8 (a torn write, another program's bytes) tells nothing: the rest still reads."""
    good = [json.dumps({"step": s, "kind": "train", "loss": 1.0 / s, "lr": 1e-3}) for s in (1, 2)]
    (tmp_path / "log.jsonl").write_bytes(good[0].encode() + b"\n\xff\xfe{\x80 torn\n" + good[1].encode() + b"\n")
    assert [e["step"] for e in plots.read_log(tmp_path)["train"]] == [1, 2]
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "log.jsonl").mkdir()
    with pytest.raises(plots.PlotError, match="cannot be read"):
        plots.read_log(tmp_path / "dir")
