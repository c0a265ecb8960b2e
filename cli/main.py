"""The ``tfm`` command line: parse, call the library, print.

Library modules are imported inside each command so that ``tfm --help`` answers
without loading torch. Every error a user can fix is printed as one line and
exits with code 2. Process-wide settings (OpenMP, threads, oneDNN's cache) come from transformer/runtime/process.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from cli import decode_flags
from cli.decode_flags import option
from cli.distill_cmd import distill
from cli.exits import OneLineErrors, fail, user_errors
from cli.guards import DECODING_PRECISIONS, check_creatable, check_data_dir, check_output, count
from transformer.runtime.process import configure_before_torch
from transformer.storage.files import check_apart

configure_before_torch()  # before any command loads torch


def _cores() -> int:
    """At most as many training processes as this machine has cores (each GPU's process needs one)."""
    return os.cpu_count() or 1


app = typer.Typer(
    cls=OneLineErrors,
    add_completion=False,
    no_args_is_help=True,
    help="Train and run the translation Transformer of 'Attention Is All You Need'.",
)


@app.command()
def train(
    config: Path = typer.Option(..., "--config", "-c", help="YAML file, or a shipped config's name: base, small, ..."),
    set_: List[str] = typer.Option([], "--set", help="Override a config value: --set train.warmup=200 (repeatable)"),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="Corpus location (sets data.path)"),
    resume: bool = typer.Option(False, "--resume", help="Continue from the run's newest checkpoint"),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Delete an existing run directory of the same name first"
    ),
    init: Optional[str] = typer.Option(
        None, "--init", help="Start from this checkpoint's weights, tokenizer and shape (sets train.init)"
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar (for scripts)"),
    nproc: int = typer.Option(
        1, "--nproc", callback=count(_cores), help="Processes on this machine, one per GPU (DDP via torchrun)"
    ),
) -> None:
    """Train a model; checkpoints go to runs/<name>/."""
    with user_errors():
        from transformer.config_file import load

        overrides = list(set_) + ([f"data.path={data_dir}"] if data_dir else [])
        overrides += [f"train.init={init}"] if init is not None else []
        cfg = load(config, overrides)  # a config error stops here, once, before any process starts
        check_data_dir(data_dir, cfg.data.format)
        if resume and overwrite:
            fail("--resume continues the run and --overwrite deletes it; give one of them")
        if resume and init is not None:
            fail("--resume continues the run from its own checkpoint and --init starts one from another; give one")
        check_creatable(cfg.out_dir, "run directory")
        if nproc > 1:
            from transformer.training.distributed import launch

            flags = [f"--set={s}" for s in overrides] + ["--resume"] * resume + ["--overwrite"] * overwrite
            code = launch(nproc, ["train", f"--config={config}", *flags, *["--quiet"] * quiet])
            raise typer.Exit(code)
        from cli.streams import keep_going_without_readers
        from transformer.training.trainer import Trainer

        keep_going_without_readers()  # `tfm train | head` must not end a run that has hours to go
        result = Trainer(cfg, resume=resume, overwrite=overwrite, quiet=quiet).run()
    if result.exit_code:
        raise typer.Exit(result.exit_code)


@app.command()
def translate(
    text: Optional[str] = typer.Argument(None, help="Sentence to translate; omit to read --input or stdin"),
    checkpoint: Optional[List[Path]] = typer.Option(
        None, "--checkpoint", help="Checkpoint directory (default: newest run's best); repeat it for an ensemble"
    ),
    input_: Optional[Path] = typer.Option(None, "--input", "-i", help="File with one sentence per line"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write translations here (default: stdout)"),
    beam: Optional[int] = option("beam", "Beam size (default: the config's, 4)"),
    greedy: bool = typer.Option(False, "--greedy", help="Greedy search (same as --beam 1)"),
    alpha: Optional[float] = option("alpha", "Beam length penalty (default: the config's)"),
    nbest: int = option("nbest", "Print the K best (or K samples): 'line ||| text ||| score'", default=1),
    batch_tokens: Optional[int] = option("batch_tokens", "Source tokens per batch", "--batch-size"),
    to: Optional[str] = option("to", "Language to translate into (needed by a model of several)"),
    sample: Optional[bool] = option("sample", "Draw each token from the model instead of searching"),
    temperature: Optional[float] = option("temperature", "Sampling: logits over this (default 1)"),
    top_k: Optional[int] = option("top_k", "Sampling: from the K most probable tokens only"),
    top_p: Optional[float] = option("top_p", "Sampling: from the tokens holding P of the probability"),
    seed: Optional[int] = option("seed", "Sampling: with each line's number, seeds its draws"),
    align_layer: Optional[int] = option("align_layer", "Layer --align reads (default: the last)"),
    shortlist: Optional[str] = option("shortlist", "A file of tfm shortlist: score only the tokens it lists"),
    align: bool = typer.Option(False, "--align", help="Print each line's word alignment: 'text ||| i-j ...'"),
    prefix: Optional[str] = typer.Option(None, "--prefix", help="Start every translation with this text"),
    prefix_file: Optional[Path] = typer.Option(None, "--prefix-file", help="One prefix a line, one per input line"),
    device: str = typer.Option("auto", "--device", help="auto|cpu|cuda|cuda:N|mps"),
    precision: str = typer.Option("fp32", "--precision", help=DECODING_PRECISIONS),
    runs: Path = typer.Option(Path("runs"), "--runs", help="Where to look for the newest run"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --output file"),
) -> None:
    """Translate a sentence, a file or stdin with a trained checkpoint: beam search, greedy search or sampling."""
    from cli.translate_cmd import run_translate
    from transformer.decoding.translator import TranslateOptions

    with user_errors():
        beam = 1 if greedy else beam
        options = TranslateOptions(device, precision, **decode_flags.settings(locals()))
        run_translate(text, checkpoint, input_, output, runs, overwrite, options, align, prefix, prefix_file)


@app.command()
def serve(
    checkpoint: Optional[List[Path]] = typer.Option(
        None, "--checkpoint", help="Checkpoint directory (default: newest run's best); repeat it for an ensemble"
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)"),
    port: int = typer.Option(8000, "--port", help="Port to listen on (0: any free port)"),
    device: str = typer.Option("auto", "--device", help="auto|cpu|cuda|cuda:N|mps"),
    precision: str = typer.Option("fp32", "--precision", help=DECODING_PRECISIONS),
    batch_tokens: Optional[int] = option("batch_tokens", "Source tokens per batch (default: the config's)"),
    shortlist: Optional[str] = option("shortlist", "A file of tfm shortlist: score only the tokens it lists"),
    max_wait_ms: float = typer.Option(
        5.0, "--max-wait-ms", help="How long a request waits for others to join its batch"
    ),
    runs: Path = typer.Option(Path("runs"), "--runs", help="Where to look for the newest run"),
) -> None:
    """Serve a checkpoint over HTTP: POST /translate (JSON), GET /health, GET /info, and a page at / that shows
    the attention (needs the serve extra)."""
    from cli.serve_cmd import run_serve
    from transformer.decoding.translator import TranslateOptions

    with user_errors():
        options = TranslateOptions(device, precision, **decode_flags.settings(locals()), nbest=1)
        run_serve(checkpoint, host, port, max_wait_ms, runs, options)


@app.command(name="eval")
def eval_(
    checkpoint: Optional[List[Path]] = typer.Option(
        None, "--checkpoint", help="Checkpoint directory (default: newest run's best); repeat it for an ensemble"
    ),
    split: Optional[str] = typer.Option(None, "--split", help="Split to score (default: the config's test split)"),
    src: Optional[Path] = typer.Option(None, "--src", help="Source file to translate instead of a split"),
    ref: Optional[Path] = typer.Option(None, "--ref", help="Reference file for --src or --hyp"),
    hyp: Optional[Path] = typer.Option(None, "--hyp", help="Score this hypothesis file against --ref (no model)"),
    beam: Optional[int] = option("beam", "Beam size (default: the config's, 4)"),
    alpha: Optional[List[float]] = option(
        "alpha", "Beam length penalty (default: the config's); repeat it to score several from one beam search"
    ),
    data_dir: Optional[str] = typer.Option(
        None, "--data-dir", help="Corpus location (overrides the checkpoint's data.path)"
    ),
    device: str = typer.Option("auto", "--device", help="auto|cpu|cuda|cuda:N|mps"),
    precision: str = typer.Option("fp32", "--precision", help=DECODING_PRECISIONS),
    runs: Path = typer.Option(Path("runs"), "--runs", help="Where to look for the newest run"),
    output_dir: Optional[Path] = typer.Option(
        None, "--output-dir", help="Write hypotheses and scores here (default: <checkpoint>/eval)"
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a report of the same split and settings"),
    to: Optional[str] = option("to", "A multilingual model's direction into this language only"),
    shortlist: Optional[str] = option("shortlist", "A file of tfm shortlist: score only the tokens it lists"),
    from_: Optional[str] = typer.Option(
        None, "--from", help="A multilingual model's direction from this language only"
    ),
) -> None:
    """Translate the test split (each direction of a multilingual model) and print sacreBLEU (with its signature)
    and chrF."""
    from cli.eval_cmd import run_eval
    from transformer.decoding.translator import TranslateOptions

    with user_errors():
        if (src is None) != (ref is None) and hyp is None:
            fail("--src and --ref go together; give both, or neither to use the config's test split")
        grid = alpha
        alpha = grid[0] if grid else None  # the first; tfm eval scores each of a grid from one beam search
        options = TranslateOptions(device, precision, **decode_flags.settings(locals()), nbest=1)
        run_eval(checkpoint, split, src, ref, hyp, data_dir, runs, output_dir, grid, overwrite, options, from_)


@app.command()
def score(
    src: Path = typer.Option(..., "--src", help="Source sentences, one a line"),
    tgt: Path = typer.Option(..., "--tgt", help="Their translations to score, one a line"),
    checkpoint: Optional[List[Path]] = typer.Option(
        None, "--checkpoint", help="Checkpoint directory (default: newest run's best); repeat it for an ensemble"
    ),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the scores here (default: stdout)"),
    format_: str = typer.Option("tsv", "--format", help="tsv (line, log-prob, score, tokens) or jsonl"),
    tokens: bool = typer.Option(False, "--tokens", help="Add each token's log-probability (<END> last)"),
    alpha: Optional[float] = option("alpha", "Length penalty of the score (default: the config's)"),
    to: Optional[str] = option("to", "A multilingual model's target language"),
    batch_tokens: Optional[int] = option("batch_tokens", "Source tokens per batch"),
    device: str = typer.Option("auto", "--device", help="auto|cpu|cuda|cuda:N|mps"),
    precision: str = typer.Option("fp32", "--precision", help=DECODING_PRECISIONS),
    runs: Path = typer.Option(Path("runs"), "--runs", help="Where to look for the newest run"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --output file"),
) -> None:
    """Score given translations: each pair's log-probability under the model (forced decoding, the search's own
    step), its score as translate prints it (length-normalised) and its BPE tokens, to filter a corpus or rank
    candidates."""
    from cli.score_cmd import run_score
    from transformer.decoding.translator import TranslateOptions

    with user_errors():
        options = TranslateOptions(device, precision, **decode_flags.settings(locals()))
        run_score(checkpoint, src, tgt, output, format_, tokens, runs, overwrite, options)


@app.command()
def shortlist(
    checkpoint: Path = typer.Option(..., "--checkpoint", help="The checkpoint it is for (its tokenizer and data)"),
    output: Path = typer.Option(..., "--output", "-o", help="File to write, then give to --shortlist"),
    src: Optional[Path] = typer.Option(None, "--src", help="Source sentences (default: the training split's)"),
    tgt: Optional[Path] = typer.Option(None, "--tgt", help="Their translations, one a line"),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="Corpus location (overrides data.path)"),
    per_token: int = typer.Option(
        50, "--per-token", callback=count(100_000), help="Target tokens listed per source token"
    ),
    frequent: int = typer.Option(
        100, "--frequent", callback=count(1_000_000), help="Most frequent target tokens kept for every sentence"
    ),
    max_pairs: int = typer.Option(
        1_000_000, "--max-pairs", callback=count(10**9), help="Count at most this many pairs, the first ones"
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --output file"),
) -> None:
    """Count a lexical shortlist: the target tokens each source token brings into translations, so that decoding
    with --shortlist scores those alone (faster where the output layer is a large share of a step)."""
    from cli.shortlist_cmd import run_shortlist

    with user_errors():
        run_shortlist(checkpoint, output, src, tgt, data_dir, per_token, frequent, max_pairs, overwrite)


@app.command()
def average(
    run: Path = typer.Argument(..., help="Run directory, e.g. runs/base"),
    last: int = typer.Option(
        5, "--last", callback=count(1_000_000), help="How many of the newest step checkpoints to average"
    ),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Checkpoint to write (default: <run>/avg<K>)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --output"),
) -> None:
    """Average the weights of a run's last K checkpoints (the paper averaged the last 5) into a new checkpoint."""
    with user_errors():
        from transformer.training.average import average as average_checkpoints

        path = average_checkpoints(run, last, output or run / f"avg{last}", overwrite)
    print(f"averaged the last {last} checkpoints of {run} into {path}", file=sys.stderr)


@app.command()
def plot(
    run: Path = typer.Argument(..., help="Run directory, e.g. runs/base"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="PNG to write (default: <run>/training.png)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --output file"),
) -> None:
    """Draw train/valid loss, learning rate and valid BLEU against steps from log.jsonl (needs matplotlib)."""
    with user_errors():
        from transformer.plots import CURVES, plot_training

        if output is not None and os.path.realpath(output) == os.path.realpath(run / CURVES):
            output = None  # the default picture, named: replaced where tfm drew it, as without --output
        if output is not None:
            check_output(output, overwrite, (run / "log.jsonl",))
        else:  # <run>/training.png, replaced only where tfm drew it (plot_training checks)
            check_apart(run / CURVES, (run / "log.jsonl",))
        path = plot_training(run, output)
    print(path)


@app.command()
def attention(
    sentence: str = typer.Argument(..., help="Source sentence; it is translated greedily first"),
    layer: Optional[int] = typer.Option(None, "--layer", callback=count(1000), help="Layer, 1..N (default: the last)"),
    head: str = typer.Option("all", "--head", help="Head, 1..h, or 'all' for a grid of every head"),
    self_: Optional[str] = typer.Option(
        None, "--self", help="encoder|decoder: self-attention instead of cross-attention"
    ),
    checkpoint: Optional[Path] = typer.Option(
        None, "--checkpoint", help="Checkpoint directory (default: newest run's best)"
    ),
    output: Path = typer.Option(Path("attention.png"), "--output", "-o", help="PNG to write"),
    runs: Path = typer.Option(Path("runs"), "--runs", help="Where to look for the newest run"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --output file"),
    to: Optional[str] = option("to", "Language to translate into (needed by a model of several)"),
) -> None:
    """Draw a heatmap of encoder-decoder attention (or --self attention) for one sentence (needs matplotlib)."""
    with user_errors():
        if self_ not in (None, "encoder", "decoder"):
            fail(f"--self takes encoder or decoder, not '{self_}'")
        if head != "all" and not (head.isdigit() and int(head) >= 1):
            fail(f"--head takes a head number from 1 or 'all', not '{head}'")
        from transformer import checkpoint as ckpt
        from transformer.decoding.attention_maps import attention_maps
        from transformer.decoding.translator import target_of
        from transformer.plots import plot_attention

        path = checkpoint or ckpt.newest(runs)
        check_output(output, overwrite, ckpt.read_files(path))
        loaded = ckpt.load(path, "cpu")
        target = target_of(loaded.cfg, to)
        d = loaded.cfg.decode
        maps = attention_maps(
            loaded.model,
            loaded.tokenizer,
            sentence,
            self_ or "cross",
            -1 if layer is None else layer - 1,
            d.max_len_a,
            d.max_len_b,
            loaded.cfg.data.lowercase,
            loaded.tokenizer.tags[target] if loaded.cfg.data.tagged else None,
        )
        path = plot_attention(maps, output, None if head == "all" else int(head) - 1)
    print(path)


@app.command()
def export(
    checkpoint: List[Path] = typer.Option(..., "--checkpoint", help="Checkpoint directory, e.g. runs/small/best"),
    output: Path = typer.Option(..., "--output", "-o", help="Directory to write the exported model into"),
    format_: str = typer.Option(
        "ctranslate2", "--format", help="ctranslate2 or hf (a MarianMTModel folder for transformers)"
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --output"),
) -> None:
    """Convert a checkpoint for CTranslate2 or Hugging Face transformers, weights and vocabulary included."""
    with user_errors():
        if len(checkpoint) > 1:
            fail(
                f"tfm export writes one model and {len(checkpoint)} checkpoints were given (CTranslate2 and Marian "
                "folders hold one model, not an ensemble); export each --checkpoint on its own"
            )
        from transformer.export.write import export as export_checkpoint

        path = export_checkpoint(checkpoint[0], output, format_, overwrite)
    print(path)


@app.command(name="configs")
def configs_() -> None:
    """List the configs that ship with tfm and what each is for (use one with --config NAME)."""
    from configs import describe, shipped

    for name, path in shipped().items():
        print(f"{name:<18} {describe(path)}")


app.command()(distill)


def main() -> None:
    """Entry point for ``python -m cli``."""
    app()
