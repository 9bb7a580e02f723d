"""A live uvicorn server on a tiny random llama3 (byte tokenizer) in a background thread."""

import socket
import threading
import time

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, argv: list[str]):
        import uvicorn

        from torchinferno.cli.main import build_parser
        from torchinferno.server.launch import build

        self.port = _free_port()
        args = build_parser().parse_args(["serve", *argv, "--port", str(self.port)])
        self.app, self.config, self.engine = build(args)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.05)
        self.base = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.engine.shutdown()


@pytest.fixture(scope="module")
def tiny_server():
    s = LiveServer(["--model-kind", "llama3", "--dtype", "float32", "--max-model-len", "128",
                    "--served-model-name", "tiny", "--max-num-seqs", "8"])
    yield s
    s.stop()
