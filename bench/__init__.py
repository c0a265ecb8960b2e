"""tfm's benchmarks, run from the repository root as modules: ``python -m bench.run``, ``python -m bench.gpu``, ...

Each measures tfm against a peer (or a lever without and with it) in the same run; bench/README.md
says what each measures and how to read the figures. Importing the package sets OpenMP's waiting and oneDNN's
primitive cache as the tfm command does (transformer.runtime.process: the short spin only with TFM_SHARED_CPU=1),
before any benchmark loads torch. CTranslate2 has its own OpenMP runtime (see bench.decode_speed).
"""

import os

from transformer.runtime.process import configure_before_torch

_spin_exported = "GOMP_SPINCOUNT" in os.environ
configure_before_torch()
SPIN_SET_HERE = not _spin_exported and "GOMP_SPINCOUNT" in os.environ  # set by configure_openmp, not the user
