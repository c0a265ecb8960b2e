"""One decoding system in a process of its own, driven by bench.decode_speed's ``own_processes``.

Loads CHECKPOINT, builds SYSTEM (tfm, transformers or ctranslate2) in PRECISION (fp32 or int8) with
length penalty ALPHA (``decode_speed.build``; for ctranslate2 the model the parent exported into WORKDIR, without
loading the checkpoint's weights), prints "ready", then answers each JSON line
``{"lines": [...], "beam": k}`` on stdin with the JSON list of translations, until stdin closes. SHORTLIST, if
given, is a lexical shortlist for tfm.
Importing the bench package sets OpenMP's waiting as in the parent.
Run: python -m bench.decode_worker CHECKPOINT SYSTEM PRECISION ALPHA WORKDIR [SHORTLIST]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench import decode_speed
from transformer import checkpoint


def main(ckpt: str, system: str, precision: str, alpha: str, workdir: str, shortlist: str | None = None) -> None:
    if system == "ctranslate2":  # the parent exported it; loading the model here would start torch's threads
        decode = decode_speed.exported_ct2(Path(ckpt), precision, float(alpha), Path(workdir))
    else:
        loaded = checkpoint.load(Path(ckpt))
        decode = decode_speed.build(loaded, system, precision, float(alpha), Path(workdir), shortlist)
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        print(json.dumps(decode(request["lines"], request["beam"])), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
