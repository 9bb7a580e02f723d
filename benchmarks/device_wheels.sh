#!/usr/bin/env bash
# Run here (not on the GPU machine), from the repo root, once per checkout: downloads into .whl/ (git-ignored) the
# wheels the GPU image lacks, at the versions this checkout's .venv has: the engine's transport (msgspec, pyzmq),
# the HTTP server (fastapi/uvicorn/pydantic and their needs), prometheus_client. Device calls then name ".whl" in
# the run tool's carry, and benchmarks/device_env.sh installs them to /tmp/site there.
set -euo pipefail
PY=${PY:-.venv/bin/python}
PKGS="msgspec pyzmq fastapi uvicorn pydantic pydantic_core starlette anyio sniffio h11 click typing-inspection
  annotated-types annotated-doc opentelemetry-api prometheus_client httptools"
pins=$($PY -m pip list --format=freeze 2>/dev/null)
mkdir -p .whl
for p in $PKGS; do
  v=$(grep -i "^${p//_/[-_]}==" <<<"$pins" | head -1) || { echo "not in .venv: $p" >&2; exit 1; }
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl "$v"
done
ls .whl
