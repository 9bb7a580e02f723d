# Sourced by the device scripts (benchmarks/device_*.sh) on the GPU machine, from the repo root: the environment
# every run needs (NVLink multicast off, as the device README requires), $OUT, and the carried wheels (.whl:
# fastapi/uvicorn/pydantic/pyzmq/msgspec/helion, see the device README; fastapi >= 0.16x also imports opentelemetry-api
# and annotated-doc, so carry those wheels too or serve exits at startup) installed to /tmp/site.
set -o pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=src
if compgen -G ".whl/*.whl" > /dev/null; then  # benchmarks/device_wheels.sh fetched them; the run carried .whl
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=src:/tmp/site
fi

# logged LOG SECONDS CMD...: CMD under `timeout`, stdout and stderr to LOG, then its exit status appended as "rc=N"
logged() { local log=$1 t=$2; shift 2; timeout "$t" "$@" > "$log" 2>&1; echo "rc=$?" >> "$log"; }
