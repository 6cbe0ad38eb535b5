#!/usr/bin/env bash
# KenLM, the oracle of python/tests/test_kenlm.py: builds `lmplz` (and `query`, for bench_ngram) and installs the `kenlm` Python
# module, both from the PyPI `kenlm` source package, into target/kenlm and the given virtual
# environment. Boost, zlib and cmake come from Debian's packages (installed when missing, which
# needs root). Nothing is built when both are already there. Usage: kenlm-oracle.sh VENV
set -euo pipefail
venv="$1"
root="$(cd "$(dirname "$0")/.." && pwd)/target/kenlm"
version="0.3.0"
lmplz="$root/build/bin/lmplz"
if [ ! -x "$lmplz" ] || [ ! -x "$root/build/bin/query" ]; then
    need=()
    for pkg in cmake libboost-program-options-dev libboost-system-dev libboost-thread-dev \
        libboost-test-dev zlib1g-dev libbz2-dev liblzma-dev; do
        dpkg -s "$pkg" > /dev/null 2>&1 || need+=("$pkg")
    done
    if [ "${#need[@]}" -gt 0 ]; then
        echo "kenlm-oracle: installing ${need[*]}" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" > /dev/null 2>&1 || {
            apt-get update -q > /dev/null
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" > /dev/null
        }
    fi
    mkdir -p "$root"
    if [ ! -d "$root/kenlm-$version" ]; then
        "$venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
            --no-binary kenlm "kenlm==$version" -d "$root"
        tar -xzf "$root/kenlm-$version.tar.gz" -C "$root"
    fi
    mkdir -p "$root/build"
    (cd "$root/build" && cmake -S "$root/kenlm-$version" -B . -DCMAKE_BUILD_TYPE=Release > cmake.log 2>&1 \
        && make -j"$(nproc)" lmplz query > make.log 2>&1) || {
        echo "kenlm-oracle: building lmplz failed; see $root/build/*.log" >&2
        exit 1
    }
fi
if ! "$venv/bin/python" -c "import kenlm" 2> /dev/null; then
    [ -f "$root/kenlm-$version.tar.gz" ] || "$venv/bin/python" -m pip download -q \
        --disable-pip-version-check --no-deps --no-binary kenlm "kenlm==$version" -d "$root"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "$root/kenlm-$version.tar.gz"
fi
echo "$lmplz"
