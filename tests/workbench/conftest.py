"""Fixtures for workbench tests: one tiny llama3 profile-run shared by the module tests."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_threaded(one_thread):  # tests/conftest.py
    yield


@pytest.fixture(scope="session")
def llama_run(tmp_path_factory):
    """A profile-run directory of tiny llama3 (batch 2, 6 prompt tokens, 4 new tokens, dense cache)."""
    from torchinferno.cli.main import main

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("runs") / "llama"
    try:
        rc = main(["profile-run", str(d), "--model-kind", "llama3", "--batch-size", "2", "--prompt-tokens", "6",
                   "--new-tokens", "4", "--seed", "3"])
    finally:
        torch.set_num_threads(n)
    assert rc == 0
    return d
