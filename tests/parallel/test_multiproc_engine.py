"""The engine on tensor-parallel worker processes (gloo on CPU): LLM(tensor_parallel_size=2) == TP=1."""

import os
import signal
import socket

import pytest

import torchinferno.ports as ports_mod

from torchinferno.checkpoint.auto import save_pretrained
from torchinferno.core.sampling_params import SamplingParams
from torchinferno.engine.llm import LLM
from torchinferno.engine.multiproc_executor import WorkerDiedError
from torchinferno.testing import tiny_model

PROMPTS = [[5, 17, 99, 3, 250, 42], [7, 128, 64], [5, 17, 99, 3, 250, 42, 8, 9]]  # the third, run after, hits the prefix cache
PARAMS = [SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
          SamplingParams(max_tokens=8, temperature=0.9, seed=4, ignore_eos=True),
          SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)]


def test_llm_tp2_equals_tp1_and_a_dead_worker_fails_cleanly(tmp_path, monkeypatch):
    ckpt = save_pretrained(tiny_model("llama3"), tmp_path / "ckpt")
    def run(llm):
        return llm.generate(PROMPTS[:2], PARAMS[:2], use_tqdm=False) + llm.generate(PROMPTS[2:], PARAMS[2:], use_tqdm=False)

    ref = [o.token_ids for o in run(LLM(str(ckpt), block_size=4, num_gpu_blocks=64))]
    # the first rendezvous port is taken before rank 0 binds it (CI, session 22: another test's server got it): the
    # workers fail with "address already in use" and the executor starts them once more on a fresh port
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = [taken.getsockname()[1]]
    real = ports_mod.free_port
    monkeypatch.setattr(ports_mod, "free_port", lambda: ports.pop() if ports else real())
    try:
        llm = LLM(str(ckpt), block_size=4, num_gpu_blocks=64, tensor_parallel_size=2)
    finally:
        taken.close()
    assert not ports  # the taken port was handed out first
    try:
        got = run(llm)
        assert [o.token_ids for o in got] == ref
        assert got[2].num_cached_tokens == 4  # the paged prefix cache served the shared block
        assert "tensor-parallel 2 ranks (gloo)" in llm.engine.core.describe()
        os.kill(llm.engine.executor.pids[1], signal.SIGKILL)
        with pytest.raises(WorkerDiedError, match="rank 1 exit code -9"):
            llm.generate([[1, 2, 3]], [PARAMS[0]], use_tqdm=False)
    finally:
        llm.shutdown()
    assert not any(p.is_alive() for p in llm.engine.executor._procs)

