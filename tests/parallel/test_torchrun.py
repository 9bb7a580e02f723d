"""Under torchrun every process is one rank running the same engine in lockstep (TorchrunExecutor)."""

import json
import os
import subprocess
import sys

from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.assembly import ModelSpec
from torchinferno.engine.llm import LLM
from torchinferno.ports import free_port

SCRIPT = """
import json, sys
from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.assembly import ModelSpec
from torchinferno.engine.llm import LLM
from torchinferno.env import read_env
llm = LLM(ModelSpec(model_kind="llama3", dtype="float32", prepack=False), tensor_parallel_size=2, block_size=4,
          num_gpu_blocks=64)
ps = [SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
      SamplingParams(max_tokens=6, temperature=0.9, seed=4, ignore_eos=True)]
out = [o.token_ids for o in llm.generate([[5, 17, 99, 3], [7, 128, 64]], ps, use_tqdm=False)]
rank = read_env().torchrun_rank
with open(sys.argv[1] + f"/rank{rank}.json", "w") as f:  # one file per rank: their stdout lines interleave
    json.dump({"tokens": out, "describe": llm.engine.core.describe()}, f)
"""


def test_torchrun_ranks_run_the_engine_in_lockstep(tmp_path):
    ps = [SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
          SamplingParams(max_tokens=6, temperature=0.9, seed=4, ignore_eos=True)]
    spec = ModelSpec(model_kind="llama3", dtype="float32", prepack=False)
    want = [o.token_ids for o in LLM(spec, block_size=4, num_gpu_blocks=64).generate(
        [[5, 17, 99, 3], [7, 128, 64]], ps, use_tqdm=False)]
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                        "127.0.0.1", "--master-port", str(free_port()), str(script), str(tmp_path)],
                       capture_output=True, text=True, timeout=240, env=env, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["tokens"] == want
        assert f"tensor-parallel rank {rank}/2 under torchrun" in got["describe"]
