"""An in-process server on a free loopback port (uvicorn in a background thread).

For tests, notebooks and benchmarks that need a real HTTP endpoint without a subprocess.
"""

from __future__ import annotations

import threading
import time

from torchinferno.ports import free_port


class LiveServer:
    """``LiveServer(["--model-kind", "llama3"])`` takes the flags of ``torchinferno serve``."""

    def __init__(self, argv: list[str], start_timeout: float = 60.0):
        import argparse

        import uvicorn

        from torchinferno.server.launch import add_server_args, build

        self.port = free_port()
        parser = argparse.ArgumentParser(prog="serve")
        add_server_args(parser)
        args = parser.parse_args([*argv, "--port", str(self.port)])
        self.app, self.config, self.engine = build(args)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + start_timeout
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                self.engine.shutdown()
                raise RuntimeError("server did not start")
            time.sleep(0.05)
        self.base = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.engine.shutdown()

    def __enter__(self) -> "LiveServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
