"""The README.md of an exported Hugging Face folder: what the model is, how to run it, its scores and config.

Scores come from the checkpoint's own ``tfm eval`` reports (``<checkpoint>/eval/*.json``), each with its
sacreBLEU signature and the command that produced it, so the folder can be pushed to the Hub as it is.
"""

from __future__ import annotations

import json
from pathlib import Path

from transformer.checkpoint import EVAL, Loaded


def _scores(checkpoint: Path) -> list[dict]:
    """The eval reports of this model written into the checkpoint, sorted by file name; unreadable files and the
    reports of ensembles it led are skipped."""
    reports = []
    for path in sorted((checkpoint / EVAL).glob("*.json")):
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(report, dict) and "bleu" in report and "members" not in report:  # not an ensemble's
            reports.append(report)
    return reports


def _score_lines(checkpoint: Path) -> list[str]:
    reports = _scores(checkpoint)
    if not reports:
        return [
            f"Not scored yet: `tfm eval --checkpoint {checkpoint}` before exporting puts the test BLEU here.",
        ]
    lines = ["| split | BLEU | BLEU (lowercased) | chrF | beam | alpha | command |", "|---|---|---|---|---|---|---|"]
    for r in reports:
        command = r.get("command", f"tfm eval --checkpoint {r.get('checkpoint', checkpoint)}")
        lc = f"{r['bleu_lc']:.2f}" if "bleu_lc" in r else "-"
        chrf = f"{r['chrf']:.2f}" if "chrf" in r else "-"
        lines.append(
            f"| {r.get('split', '?')} | {r['bleu']:.2f} | {lc} | {chrf} | {r.get('beam', '?')} | "
            f"{r.get('alpha', '?')} | `{command}` |"
        )
    lines.append("")
    lines += [f"- `{r['bleu_signature']}`" for r in reports if "bleu_signature" in r]
    return lines


def _lowercase_lines(lowercase: bool) -> list[str]:
    """What a user of a model trained on lowercased text must do that the exported tokenizer does not."""
    if not lowercase:
        return []
    return [
        "The model was trained on lowercased text (`data.lowercase: true`): lowercase each sentence before the "
        "tokenizer (`sentence.lower()`), as `tfm translate` does; the tokenizer keeps case.",
        "",
    ]


def _directions_lines(loaded: Loaded) -> list[str]:
    """How to ask a multilingual model for a target language, and where a model started from (``train.init``)."""
    cfg, lines = loaded.cfg, []
    if cfg.data.tagged:
        tags = ", ".join(f"`>>{t}<<`" for t in sorted(loaded.tokenizer.tags))
        lines += [
            f"It translates {', '.join(cfg.data.directions or [])} in one model. Start each sentence with the tag of "
            f"the language to translate into ({tags}), as OPUS-MT's multilingual models are used: "
            f'`tokenizer([">>{cfg.data.pairs()[0][1]}<< your sentence"], ...)`.',
            "",
        ]
    if cfg.train.init is not None:
        lines += [
            f"Its training started from `{cfg.train.init}` (weights SHA-256 `{cfg.train.init_fingerprint}`).",
            "",
        ]
    return lines


def model_card(loaded: Loaded) -> str:
    """Markdown with Hub metadata, usage for transformers 4 and 5, the scores and the training config."""
    cfg, m = loaded.cfg, loaded.cfg.model
    d = cfg.data
    languages = sorted({lang for pair in d.pairs() for lang in pair}) if d.tagged else [d.src_lang, d.tgt_lang]
    title = ", ".join(d.directions or []) if d.tagged else f"{d.src_lang} -> {d.tgt_lang}"
    depth = f"N={m.N}" if m.depths == (m.N, m.N) else "{} encoder and {} decoder layers".format(*m.depths)
    config_yaml = (loaded.path / "config.yaml").read_text(encoding="utf-8").rstrip()
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: translation",
        f"language: [{', '.join(languages)}]",
        "tags: [translation, marian, tfm]",
        "---",
        "",
        f"# {cfg.name}: {title}",
        "",
        f"The Transformer of *Attention Is All You Need* ({depth}, d_model={m.d_model}, d_ff={m.d_ff}, h={m.h}), "
        f"trained from scratch with tfm on `{cfg.data.path}` ({cfg.data.format}) for "
        f"{loaded.meta.get('step', '?')} updates and exported as a MarianMTModel (`tfm export --format hf`). "
        "It computes tfm's own network: the residual stream's dimensions are reordered so that Marian's "
        "sinusoids equal tfm's.",
        "",
        *_directions_lines(loaded),
        "## Use",
        "",
        "```python",
        "from transformers import AutoTokenizer, MarianMTModel",
        "",
        'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")',
        'model = MarianMTModel.from_pretrained("path/to/this/folder")',
        'batch = tokenizer(["your sentence"], return_tensors="pt", padding=True)',
        "print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))",
        "```",
        "",
        'With transformers 4, `pipeline("translation", model="path/to/this/folder")` works too '
        "(transformers 5 removed that pipeline).",
        "",
        *_lowercase_lines(cfg.data.lowercase),
        f"Beam search uses {cfg.decode.beam} beams. tfm normalises a hypothesis's log-probability by GNMT's "
        f"((5 + length) / 6) ** alpha (alpha {cfg.decode.alpha:g} in this model's config); transformers divides "
        f"by length ** length_penalty, so `generation_config.json` sets length_penalty "
        f"{round(2 * cfg.decode.alpha / 3, 4):g} (2/3 alpha: the two grow alike at 10-token outputs) and beam "
        "results can differ on a few lines. Greedy search (`num_beams=1`) gives tfm's tokens.",
        "",
        "## Scores",
        "",
        *_score_lines(loaded.path),
        "",
        "## Training config",
        "",
        "```yaml",
        config_yaml,
        "```",
        "",
    ]
    return "\n".join(lines)
