#!/usr/bin/env bash
# A venv for bench/kvpress_compare.py: PyPI's kvpress (it pins transformers < 5.3), gguf
# (transformers' gguf_file= loader) and torch, CPU only. Nothing in the build or the
# tests needs it (the kvpress results are committed as JSON under docs/results/).
#
#   tools/kvpress_venv.sh [VENV_DIR]        # default: .venv-kvpress (git-ignored)
#
# torch: the unpacked torch 2.11.0 that `scripts/setup.sh --cuda` leaves in
# .cache/torch-cu130 is reused through a .pth file when it is there (it runs on the CPU
# without a GPU); otherwise PyPI's torch 2.11.0 wheel is installed (a CUDA build that also
# runs on the CPU; pip brings its nvidia-* dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-kvpress}"
TORCH_DIR="${ECHOKV_TORCH_CUDA_PREFIX:-$PWD/.cache/torch-cu130}"
python3 -m venv "$VENV"
PY="$VENV/bin/python"
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$PY" -m pip install -q --upgrade pip
if [ -d "$TORCH_DIR/torch" ] && [ -d "$TORCH_DIR"/torch-2.11.0.dist-info ]; then
  echo "$(cd "$TORCH_DIR" && pwd)" > "$SITE/echokv-torch.pth"
  echo "torch: reusing $TORCH_DIR"
else
  "$PY" -m pip install -q torch==2.11.0
fi
"$PY" -m pip install -q kvpress==0.5.5 gguf==0.19.0
"$PY" -c 'import kvpress, transformers, torch; print("kvpress", kvpress.__version__ if hasattr(kvpress, "__version__") else "?", "transformers", transformers.__version__, "torch", torch.__version__)'
