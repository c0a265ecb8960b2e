"""bench.decode_speed: each decoding system in a worker process of its own translates as it does in this one."""

from pathlib import Path

import pytest

from bench.decode_speed import own_processes
from transformer import checkpoint

LINES = ["Ein Mann fährt Fahrrad.", "Der Hund läuft.", "Zwei Kinder spielen im Park."]


@pytest.mark.parametrize("system", ["tfm", "ctranslate2"])
@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_a_worker_process_translates_as_this_process_does(
    tiny_checkpoint: Path, tmp_path: Path, precision: str, system: str
):
    """CTranslate2's worker decodes the model its parent exported."""
    if system == "ctranslate2":
        pytest.importorskip("ctranslate2")
    loaded = checkpoint.load(tiny_checkpoint)
    with own_processes(loaded, (system,), precision, 0.6, tmp_path, apart=False) as here:
        want = [here[system](LINES, beam) for beam in (1, 3)]
    with own_processes(loaded, (system,), precision, 0.6, tmp_path) as apart:
        assert [apart[system](LINES, beam) for beam in (1, 3)] == want


def test_a_system_that_cannot_start_is_an_error_not_a_hang(tiny_checkpoint: Path, tmp_path: Path):
    loaded = checkpoint.load(tiny_checkpoint)
    with pytest.raises(RuntimeError, match="did not start"):
        with own_processes(loaded, ("transformers",), "int8", 0.6, tmp_path):
            pass
