"""``tfm distill``: a teacher translates the training sources (stage translate), a student trains on its translations
(stage train), then is scored on the test split (stage eval); each stage can run alone."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from cli.exits import fail, user_errors
from cli.guards import DECODING_PRECISIONS, check_data_dir

if TYPE_CHECKING:
    from transformer.config import Config
    from transformer.decoding.translator import TranslateOptions

STAGES = ("all", "translate", "train", "eval")


def distill(
    config: Path = typer.Option(..., "--config", "-c", help="The student's config: a YAML file or a shipped name"),
    teacher: Optional[List[str]] = typer.Option(
        None, "--teacher", help="A teacher checkpoint (sets distill.teachers); repeat it for an ensemble"
    ),
    set_: List[str] = typer.Option([], "--set", help="Override a config value (repeatable)"),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="Corpus location (sets data.path)"),
    stage: str = typer.Option("all", "--stage", help="all, or one stage alone: translate, train or eval"),
    device: str = typer.Option("auto", "--device", help="Where the teachers translate: auto|cpu|cuda|cuda:N|mps"),
    precision: str = typer.Option("fp32", "--precision", help=DECODING_PRECISIONS),
    resume: bool = typer.Option(False, "--resume", help="Continue the student's training from its checkpoint"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Start the distilled corpus and the student again"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars (for scripts)"),
) -> None:
    """Distil teachers into a student: the teachers translate the training sources (in pieces: a killed run goes on
    where it stopped), the student trains on their translations with their tokenizer, then is scored on the test
    split (sequence-level knowledge distillation)."""
    with user_errors():
        from transformer.config_file import load
        from transformer.decoding.translator import TranslateOptions

        overrides = list(set_) + ([f"data.path={data_dir}"] if data_dir else [])
        overrides += [f"distill.teachers={json.dumps(teacher)}"] if teacher else []  # JSON is YAML: any path
        cfg = load(config, overrides)
        check_data_dir(data_dir, cfg.data.format)
        if resume and overwrite:
            fail("--resume continues the student and --overwrite starts it again; give one of them")
        options = TranslateOptions(device, precision, beam=cfg.distill.beam, alpha=cfg.distill.alpha, nbest=1)
        code = run_distill(cfg, stage, options, resume, overwrite, quiet)
    if code:
        raise typer.Exit(code)


def run_distill(cfg: Config, stage: str, options: TranslateOptions, resume: bool, overwrite: bool, quiet: bool) -> int:
    """Run ``stage`` (or every stage) of the distillation ``cfg`` describes; the exit code of its training."""
    from transformer.storage import manifest
    from transformer.training import distill

    if stage not in STAGES:
        fail(f"--stage takes {', '.join(STAGES)}, not '{stage}'")
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    student = distill.student_config(cfg)
    if stage in ("all", "translate"):
        out = distill.folder(cfg)
        if overwrite and manifest.kind(out) == distill.KIND:
            if (foreign := manifest.first_foreign(out)) is not None:
                fail(f"{out} holds {foreign}, which tfm did not write; move it, then run again with --overwrite")
            manifest.delete(out)
        found = distill.teachers(cfg, options, log)
        distill.distil(cfg, found, quiet, log)
    if stage in ("all", "train"):
        from transformer.training.trainer import Trainer

        distill.check_corpus(cfg)
        if cfg.distill.from_teacher and not resume:
            student = distill.from_teacher(student, log)
        result = Trainer(student, resume=resume, overwrite=overwrite and not resume, quiet=quiet).run()
        if result.exit_code:
            return result.exit_code
    if stage in ("all", "eval"):
        from cli.eval_cmd import run_eval
        from transformer.decoding.translator import TranslateOptions

        best = student.out_dir / "best"
        run_eval(
            [best], None, None, None, None, None, Path(student.run_dir), None, None, True, TranslateOptions("auto")
        )
    return 0
