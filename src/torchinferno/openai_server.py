"""``python -m torchinferno.openai_server``: the OpenAI-compatible server (same flags as ``torchinferno serve``)."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from torchinferno.cli.main import main as cli_main

    return cli_main(["serve", *(argv if argv is not None else __import__("sys").argv[1:])])


if __name__ == "__main__":
    raise SystemExit(main())
