#!/usr/bin/env bash
# The README's install, checked as a new user meets it: build the wheel from a clean export of the tree (what a
# fresh clone holds), install it into a new venv (torch first and alone, then the wheel, both under
# constraints.txt, so nothing pulls a multi-GB CUDA torch), and run `torchdoctor --version`, `torchdoctor demo`
# (torch alone: no diffusers in this venv) and one scan of a file TARGET and of a checkpoint, from outside the
# tree so the source checkout is never what runs.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
py=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

git archive --format=tar HEAD | tar -x -C "$work" --one-top-level=tree
if "$py" -c "import build" 2>/dev/null; then
    "$py" -m build --wheel --outdir "$work/dist" "$work/tree"
else  # offline machines: setuptools of the build interpreter, no isolated build env to download
    "$py" -m pip wheel -q --no-deps --no-build-isolation -w "$work/dist" "$work/tree"
fi
wheel=$(ls "$work"/dist/torchdoctor-*.whl)

"$py" -m venv "$work/venv"
v="$work/venv/bin"
"$v/python" -m pip install -q -c "$root/constraints.txt" torch==2.13.0
"$v/python" -m pip install -q -c "$root/constraints.txt" "$wheel"

cd "$work"
fail() { echo "wheel-check: $*" >&2; exit 1; }
"$v/torchdoctor" --version | grep -q "^torchdoctor .* (torch 2.13.0" || fail "--version"
"$v/python" -c "import torchdoctor, sys; sys.exit(0 if torchdoctor.__file__.startswith('$work/venv') else 1)" \
    || fail "torchdoctor is not imported from the installed wheel"
"$v/torchdoctor" demo >demo.txt || fail "demo (exit $?): $(tail -5 demo.txt)"
grep -q "^culprit: attn.to_q.lora_B.default.weight$" demo.txt || fail "demo names another culprit"
cat >app.py <<'PY'
from torch import nn

def model():
    m = nn.Sequential(nn.Linear(2, 2))
    m[0].bias.data = m[0].bias.data.double()
    return m
PY
set +e
"$v/torchdoctor" scan app.py:model >scan.txt; code=$?
set -e
[ "$code" = 1 ] && grep -q "0.bias" scan.txt || fail "scan app.py:model (exit $code): $(cat scan.txt)"
"$v/python" -c "import torch; torch.save({'w': torch.ones(2, dtype=torch.bfloat16)}, 'ckpt.pt')"
"$v/torchdoctor" scan ckpt.pt --dtype bfloat16 >/dev/null || fail "scan ckpt.pt (exit $?)"
echo "wheel-check: ok ($(basename "$wheel"): --version, demo, scan of a TARGET and of a checkpoint)"
