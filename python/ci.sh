#!/usr/bin/env bash
# The Python package's tests: build the wheel (maturin, sharing target/ with cargo), install it
# into a fresh virtual environment beside infini-gram 2.6.0 (the engine it is compared with) and
# Ray (infgram.ray: a local three-node cluster on 127.0.0.1 in test_ray.py), build KenLM beside
# it (kenlm-oracle.sh), and run the pytest suite. Needs python3 with venv and pip; fetches
# maturin, pytest, numpy, infini-gram and ray from the package registry on the first run.
set -euo pipefail
cd "$(dirname "$0")"
venv="$(cd .. && pwd)/target/python-venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "maturin>=1.5,<2" pytest numpy "infini-gram==2.6.0" "ray[serve]==2.60.0" "openai>=1.50,<3" "jinja2>=3.1"
wheels="$(cd .. && pwd)/target/wheels"
rm -rf "$wheels"
"$venv/bin/maturin" build --release --quiet -o "$wheels"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheels"/infgram-*.whl
# KenLM (lmplz and its Python module, from the PyPI source package), the oracle of test_kenlm.py.
INFGRAM_LMPLZ="$(bash kenlm-oracle.sh "$venv")"
export INFGRAM_LMPLZ INFGRAM_REQUIRE_KENLM=1 INFGRAM_REQUIRE_RAY=1
# From tests/, so that `import infgram` finds the installed package, not the source folder.
cd tests && "$venv/bin/python" -m pytest -q "$@"
