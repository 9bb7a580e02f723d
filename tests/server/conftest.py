"""A live uvicorn server on a tiny random llama3 (byte tokenizer) in a background thread."""

import pytest

from torchinferno.server.live import LiveServer


@pytest.fixture(scope="module")
def tiny_server():
    s = LiveServer(["--model-kind", "llama3", "--dtype", "float32", "--max-model-len", "128",
                    "--served-model-name", "tiny", "--max-num-seqs", "8"])
    yield s
    s.stop()
