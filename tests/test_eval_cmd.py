"""`tfm eval` (cli/eval_cmd.py): inputs that do not line up are refused before any work."""

import json

from cli_helpers import one_error_line
from tiny import SAMPLE
from typer.testing import CliRunner

from cli.main import app


def test_eval_refuses_files_of_different_line_counts(tiny_checkpoint, tmp_path):
    hyp, ref = tmp_path / "hyp.en", tmp_path / "ref.en"
    hyp.write_text("a\nb\n", encoding="utf-8")
    ref.write_text("a\nb\nc\n", encoding="utf-8")
    r = CliRunner().invoke(app, ["eval", "--hyp", str(hyp), "--ref", str(ref)])
    assert r.exit_code == 2 and "2 hypotheses but 3 references" in one_error_line(r.stderr)
    src = tmp_path / "src.de"
    src.write_text("Ein Hund.\nDie Frau.\n", encoding="utf-8")
    r = CliRunner().invoke(
        app,
        [
            "eval",
            "--checkpoint",
            str(tiny_checkpoint),
            "--src",
            str(src),
            "--ref",
            str(ref),
            "--device",
            "cpu",
            "--beam",
            "1",
        ],
    )
    assert r.exit_code == 2 and "src.de has 2 lines but" in one_error_line(r.stderr)
    assert not (tiny_checkpoint / "eval").exists()


def test_eval_alpha_and_the_command_are_recorded_beside_the_beam(tiny_checkpoint, tmp_path):
    src, ref = tmp_path / "src.de", tmp_path / "ref.en"
    src.write_text("Ein Hund.\nDie Frau.\n", encoding="utf-8")
    ref.write_text("A dog.\nThe woman.\n", encoding="utf-8")
    out = tmp_path / "out"
    r = CliRunner().invoke(
        app,
        [
            "eval",
            "--checkpoint",
            str(tiny_checkpoint),
            "--src",
            str(src),
            "--ref",
            str(ref),
            "--device",
            "cpu",
            "--beam",
            "2",
            "--alpha",
            "1.5",
            "--output-dir",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    saved = json.loads((out / "src.de.beam2.alpha1.5.json").read_text())
    assert saved["alpha"] == 1.5 and saved["beam"] == 2 and (out / "src.de.beam2.alpha1.5.hyp").is_file()
    assert saved["command"] == (
        f"tfm eval --checkpoint {tiny_checkpoint} --src {src} --ref {ref} --beam 2 --alpha 1.5"
    )  # the command that gives this report again


def test_eval_records_the_precision_auto_chose(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    src, ref = tmp_path / "src.de", tmp_path / "ref.en"
    src.write_text("Ein Hund.\n", encoding="utf-8")
    ref.write_text("A dog.\n", encoding="utf-8")
    out = tmp_path / "out"
    args = ["eval", "--checkpoint", str(tiny_checkpoint), "--src", str(src), "--ref", str(ref), "--device", "cpu"]
    r = CliRunner().invoke(app, [*args, "--precision", "auto", "--output-dir", str(out)])
    assert r.exit_code == 0, r.output
    saved = json.loads(next(out.glob("*.json")).read_text())
    assert saved["precision"] in ("fp32", "bf16", "int8") and saved["command"].endswith("--precision auto")
    assert (tmp_path / "cache" / "tfm" / "cpu-precision.json").is_file()


def test_several_alphas_one_report_each_as_if_evaluated_alone(tiny_checkpoint, tmp_path):
    """`--alpha` repeated: one beam search, one report per length penalty, each the same as evaluating at that
    penalty alone, with the command that gives it again; a report that exists already stops it before any work."""
    src, ref = tmp_path / "src.de", tmp_path / "ref.en"
    src.write_text("Ein Hund läuft.\nDie Frau.\nEin Mann fährt Fahrrad im Park.\n", encoding="utf-8")
    ref.write_text("A dog runs.\nThe woman.\nA man rides a bike in the park.\n", encoding="utf-8")
    args = ["eval", "--checkpoint", str(tiny_checkpoint), "--src", str(src), "--ref", str(ref), "--device", "cpu"]
    grid, alone = tmp_path / "grid", tmp_path / "alone"
    r = CliRunner().invoke(app, [*args, "--beam", "3", "--alpha", "0", "--alpha", "2.5", "--output-dir", str(grid)])
    assert r.exit_code == 0, r.output
    assert "alpha 0:" in r.stdout and "alpha 2.5:" in r.stdout and "highest BLEU on src.de: alpha" in r.stdout
    for alpha in ("0", "2.5"):
        r = CliRunner().invoke(app, [*args, "--beam", "3", "--alpha", alpha, "--output-dir", str(alone)])
        assert r.exit_code == 0, r.output
        stem = f"src.de.beam3.alpha{alpha}"
        assert (grid / f"{stem}.hyp").read_text() == (alone / f"{stem}.hyp").read_text()
        saved = json.loads((grid / f"{stem}.json").read_text())
        assert saved["alpha"] == float(alpha) and saved["command"].endswith(f"--beam 3 --alpha {alpha}")
    r = CliRunner().invoke(app, [*args, "--beam", "3", "--alpha", "1", "--alpha", "0", "--output-dir", str(grid)])
    assert r.exit_code == 2 and "src.de.beam3.alpha0" in one_error_line(r.stderr)
    assert not (grid / "src.de.beam3.alpha1.hyp").exists()
    r = CliRunner().invoke(app, [*args, "--alpha", "1", "--alpha", "-2"])
    assert r.exit_code == 2 and "--alpha -2 is out of range" in one_error_line(r.stderr)


def test_alphas_that_would_name_one_report_are_refused_before_any_work(tiny_checkpoint, tmp_path):
    src = tmp_path / "src.de"
    src.write_text("Ein Hund läuft.\n", encoding="utf-8")
    args = ["eval", "--checkpoint", str(tiny_checkpoint), "--src", str(src), "--ref", str(src), "--device", "cpu"]
    r = CliRunner().invoke(app, [*args, "--alpha", "1", "--alpha", "1.0000001", "--output-dir", str(tmp_path / "o")])
    assert r.exit_code == 2 and "name the same report (alpha1)" in one_error_line(r.stderr)
    assert not (tmp_path / "o").exists()


def test_the_int8_alpha_grid_is_each_alpha_evaluated_alone(tiny_run, tmp_path):
    """int8 quantizes each row of activations on its own, so the grid's one beam search gives what each alpha's own
    search gives, whatever the batches held."""
    lines = (SAMPLE / "valid.de").read_text(encoding="utf-8").splitlines()[:24]
    src, ref = tmp_path / "src.de", tmp_path / "ref.en"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ref.write_text("\n".join(lines) + "\n", encoding="utf-8")
    best = tiny_run.run_dir / "best"
    args = [
        "eval",
        "--checkpoint",
        str(best),
        "--src",
        str(src),
        "--ref",
        str(ref),
        "--precision",
        "int8",
        "--beam",
        "3",
    ]
    grid, alone = tmp_path / "grid", tmp_path / "alone"
    assert CliRunner().invoke(app, [*args, "--alpha", "0", "--alpha", "2", "--output-dir", str(grid)]).exit_code == 0
    for alpha in ("0", "2"):
        assert CliRunner().invoke(app, [*args, "--alpha", alpha, "--output-dir", str(alone)]).exit_code == 0
        stem = f"src.de.beam3.alpha{alpha}"
        assert (grid / f"{stem}.hyp").read_text() == (alone / f"{stem}.hyp").read_text()


def test_output_dir_a_folder_tfm_wrote_of_another_kind_is_refused_and_left_as_it_was(tiny_run):
    """Found by the command-line property test: `tfm eval --output-dir runs/tiny/best` wrote its reports into the
    checkpoint it evaluated and rewrote that checkpoint's record."""
    best = tiny_run.run_dir / "best"
    for folder, kind in ((best, "checkpoint"), (tiny_run.run_dir, "run")):
        before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
        r = CliRunner().invoke(app, ["eval", "--checkpoint", str(best), "--output-dir", str(folder), "--device", "cpu"])
        assert r.exit_code == 2 and f"is a {kind} folder tfm wrote, not a folder of reports" in one_error_line(r.stderr)
        assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before
