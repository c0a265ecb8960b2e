"""The decoder's incremental step exists once: ``Transformer.decode_step`` running ``DecoderLayer.step``, both in
model/transformer.py. Speed comes from modules swapped into that model; a second copy of the step (as decoding once
had beside the model) would double what a reader must check and let a bug in one copy hide from the other's tests.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

from transformer.decoding.ensemble import Ensemble

LIBRARY = Path(__file__).resolve().parents[1] / "transformer"
STEPS = {"decode_step", "step"}  # what a decoder step is called: the model's, and a layer's


def step_definitions(library: Path = LIBRARY) -> set[tuple[str, str, str]]:
    """(file, class, method) of every method named as a decoder step in the library, and (file, "", name) of every
    function so named outside a class."""
    found = set()
    for path in library.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = str(path.relative_to(library.parent))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found |= {(where, node.name, f.name) for f in node.body if _named_step(f)}
        found |= {(where, "", f.name) for f in tree.body if _named_step(f)}
    return found


def _named_step(node: ast.AST) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in STEPS


def test_the_decoder_step_is_defined_once_in_the_model():
    assert step_definitions() == {
        ("transformer/model/transformer.py", "Transformer", "decode_step"),
        ("transformer/model/transformer.py", "DecoderLayer", "step"),
        ("transformer/decoding/ensemble.py", "Ensemble", "decode_step"),  # its members' own steps, combined
    }


def test_an_ensembles_step_is_its_members_own_steps_combined():
    """An ensemble calls each member's decode_step and combines their distributions; it computes no layer itself."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(Ensemble.decode_step)))
    called = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert "decode_step" in called and not called & {"step", "self_step", "cross_step", "generator", "embed", "norm"}


def test_a_second_step_would_be_found(tmp_path):
    """The check above can fail: a lean copy of the layer step, as decoding/lean_step.py held, is seen."""
    copy = tmp_path / "transformer" / "decoding"
    copy.mkdir(parents=True)
    (copy / "lean.py").write_text("class LeanLayer:\n    def step(self, y):\n        return y\n", encoding="utf-8")
    assert step_definitions(tmp_path / "transformer") == {("transformer/decoding/lean.py", "LeanLayer", "step")}
