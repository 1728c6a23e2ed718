#!/usr/bin/env bash
# Creates the Python venv the oracle scripts in tools/oracle/ run in: PyPI transformers, gguf,
# torch, numpy, jinja2 and their dependencies at the exact versions of requirements.txt.
#
#   tools/oracle/make_venv.sh                 # -> .cache/oracle-venv (git-ignored)
#   tools/oracle/make_venv.sh /tmp/my-venv
#   .cache/oracle-venv/bin/python tools/oracle/make_gguf_goldens.py
#   .cache/oracle-venv/bin/python tools/oracle/make_model_goldens.py
#
# Run by hand only: no test, no CI step and scripts/setup.sh never call it (the tests read the
# committed golden files). PyPI's Linux torch wheel is the CUDA build and pulls the nvidia-*
# wheels (about 4 GB installed); the oracles run it on the CPU all the same. Needs Python 3.11
# (the versions below were resolved on 3.11.7).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${1:-$ROOT/.cache/oracle-venv}"
PY="${PYTHON:-python3}"

# The direct requirements (keep in step with tools/oracle/README.md); requirements.txt is what
# pip resolved for them, every package pinned.
#   torch==2.15.0 transformers==5.24.0 tokenizers==0.23.3 gguf==0.19.0 numpy==2.4.6
#   jinja2==3.1.6 accelerate==1.16.0 (transformers needs it to load a GGUF) sentencepiece==0.2.3

if [[ ! -x "$VENV/bin/python" ]]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --disable-pip-version-check -r "$ROOT/tools/oracle/requirements.txt"
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("torch", "transformers", "tokenizers", "gguf", "numpy", "jinja2", "accelerate"):
    print(f"{name}=={md.version(name)}")
PY
echo "oracle venv ready: $VENV"
