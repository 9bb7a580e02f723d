"""A live OpenAI server on a tiny random llama3 (byte tokenizer), uvicorn in a background thread."""

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def tiny_base_url():
    from torchinferno.bench.microbench import in_thread_server
    from torchinferno.cli.main import build_parser
    from torchinferno.server.launch import build

    args = build_parser().parse_args(["serve", "--model-kind", "llama3", "--dtype", "float32", "--max-model-len", "128",
                                      "--served-model-name", "tiny", "--max-num-seqs", "8"])
    app, _, engine = build(args)
    try:
        with in_thread_server(app) as url:
            yield url
    finally:
        engine.shutdown()
