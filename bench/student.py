"""A distillation student against the model it replaces (bench.run's student section, ``--student DIR``).

Each model decodes in tfm and in CTranslate2 (on its ``tfm export``), fp32 and int8, and the student in tfm with a
lexical shortlist too where one is given (``--shortlist``), every system in a process of its own, all timed in one
interleaved grid (greedy and beam 5, batches of 32 and 1: bench.decode_speed.measure), each model at its own length
penalty. Then what each costs to hold: parameters, weights on disk (tfm's safetensors and CTranslate2's model.bin)
and the peak memory of ``tfm translate`` over the test sources, fp32 and int8.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from bench import startup
from bench.decode_speed import Worker, ct2_folder
from transformer import checkpoint

MODELS = ("recipe", "student")
ENGINES = ("tfm", "ctranslate2")
PRECISIONS = ("fp32", "int8")
CT2_WEIGHTS = "model.bin"
SHORTLIST = " shortlist"  # how a system's name says it decodes with the student's lexical shortlist


def label(engine: str, precision: str, model: str) -> str:
    """A system's name in the grid: ``tfm`` alone is the recipe model in tfm in fp32, the one the others are
    compared with (bench.decode_speed.measure's reference)."""
    return " ".join(x for x in (engine, precision if precision != "fp32" else "", "student" * (model != "recipe")) if x)


def workers(
    recipe: checkpoint.Loaded, student: checkpoint.Loaded, workdir: Path, shortlist: Path | None = None
) -> dict[str, Worker]:
    """Every engine and precision for both models, each model's CTranslate2 export in a folder of its own; with a
    ``shortlist``, the student in tfm with it as well (``tfm student shortlist``, ``tfm int8 student shortlist``)."""
    made = {
        label(engine, precision, name): Worker(loaded, engine, precision, loaded.cfg.decode.alpha, workdir / name)
        for name, loaded in zip(MODELS, (recipe, student))
        for engine in ENGINES
        for precision in PRECISIONS
    }
    for p in PRECISIONS if shortlist else ():
        alpha = student.cfg.decode.alpha
        made[label("tfm", p, "student") + SHORTLIST] = Worker(student, "tfm", p, alpha, workdir / "student", shortlist)
    return made


def ratios(row: dict[str, Any]) -> dict[str, float]:
    """The student's sentences/s in tfm over the recipe model's in tfm, and over CTranslate2 int8's on the recipe
    model, in each precision."""

    def speed(engine: str, precision: str, model: str) -> float:
        return row[label(engine, precision, model)]["sentences_per_s"]

    out = {}
    for p in PRECISIONS:
        out[f"student_vs_recipe_{p}"] = speed("tfm", p, "student") / speed("tfm", p, "recipe")
        out[f"student_{p}_vs_ct2_int8_recipe"] = speed("tfm", p, "student") / speed("ctranslate2", "int8", "recipe")
        if (listed := label("tfm", p, "student") + SHORTLIST) in row:
            shortlisted = row[listed]["sentences_per_s"]
            out[f"student_shortlist_vs_recipe_{p}"] = shortlisted / speed("tfm", p, "recipe")
            out[f"student_shortlist_{p}_vs_ct2_int8_recipe"] = shortlisted / speed("ctranslate2", "int8", "recipe")
    return out


def costs(loaded: checkpoint.Loaded, test_lines: Path, workdir: Path) -> dict[str, Any]:
    """What a model costs to hold: its shape and parameters, its weights on disk in tfm and as CTranslate2's export
    (written by bench.decode_speed.in_workers into ``workdir``), and the peak RSS of ``tfm translate`` over
    ``test_lines`` at its own decode settings, fp32 and int8."""
    m = loaded.cfg.model
    encoder, decoder = m.depths
    export = ct2_folder(workdir, "fp32", loaded.cfg.decode.alpha) / CT2_WEIGHTS
    return {
        "path": str(loaded.path),
        "shape": {"encoder_layers": encoder, "decoder_layers": decoder, "d_model": m.d_model, "d_ff": m.d_ff},
        "vocab": loaded.tokenizer.vocab_size,
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
        "weights_mb": (loaded.path / checkpoint.WEIGHTS).stat().st_size / 2**20,
        "ctranslate2_mb": export.stat().st_size / 2**20,
        "rss_fp32": startup.translate_memory(loaded.path, test_lines, []),
        "rss_int8": startup.translate_memory(loaded.path, test_lines, ["--precision", "int8"]),
    }


def table_lines(result: dict[str, Any], targets: dict[str, float]) -> list[str]:
    """The section's rows of bench.run's table: the student's speed against each target, then its costs."""
    lines = []
    for r in result["grid"]:
        search = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
        for listed, p in itertools.product(("", SHORTLIST), PRECISIONS):
            if (system := label("tfm", p, "student") + listed) not in r:
                continue
            ours = r[system]["sentences_per_s"]
            kind = "student" + listed.replace(" ", "_")
            for key, peer, target in (
                (f"{kind}_vs_recipe_{p}", label("tfm", p, "recipe"), targets["student_vs_recipe"]),
                (f"{kind}_{p}_vs_ct2_int8_recipe", label("ctranslate2", "int8", "recipe"), targets["student_vs_ct2"]),
            ):
                ratio = r["ratios"][key]
                name = (
                    f"student{listed} {p} {search} batch {r['batch']} sent/s vs recipe in "
                    f"{peer.replace('ctranslate2', 'ct2')}"
                )
                lines.append(
                    f"{name:<60} {ours:>10.1f} {r[peer]['sentences_per_s']:>10.1f} {ratio:>6.2f}x "
                    f"{'>=' + str(target):>8} {'yes' if ratio >= target else 'NO':>4}"
                )
        ct2 = r[label("ctranslate2", "int8", "student")]["sentences_per_s"]
        lines.append(f"{'  ct2 int8 on the student sent/s':<60} {ct2:>10.1f}")
    for name, c in result["models"].items():
        lines.append(
            f"{name + ': parameters; MB tfm, ct2 weights; RSS fp32, int8':<60} {c['parameters']:>10,} "
            f"{c['weights_mb']:>6.1f} {c['ctranslate2_mb']:>6.1f} "
            f"{c['rss_fp32']['peak_rss_mb']:>6.0f} {c['rss_int8']['peak_rss_mb']:>6.0f}"
        )
    return lines
