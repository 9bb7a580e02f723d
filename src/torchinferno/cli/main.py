"""Entry point: builds the subcommand parser from the command-group modules and runs one.

Expected failures (``TorchInfernoError``, missing files) print one line to stderr and exit 1;
set TORCHINFERNO_DEBUG=1 for the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# One module per command group; each exposes ``register(subparsers)``.
COMMAND_GROUPS = (
    "torchinferno.cli.model_cmds",
    "torchinferno.cli.bench_cmds",
    "torchinferno.cli.audit_cmds",
    "torchinferno.cli.engine_cmds",
    "torchinferno.cli.serve_cmds",
    "torchinferno.cli.router_cmds",  # router, bench-router, research
    "torchinferno.cli.bench_suite_cmds",
    "torchinferno.cli.gpu_cmds",
    "torchinferno.cli.moe_cmds",  # bench-moe, tune-moe
    "torchinferno.cli.deepseek_cmds",
    "torchinferno.cli.deepseek_v4_cmds",
    "torchinferno.cli.profile_cmds",  # before variants_cmds: its model-variants adds promoted variants
    "torchinferno.cli.variants_cmds",  # validate-model-variants (model-variants is in profile_cmds)
    "torchinferno.cli.sim_measure_cmds",  # sim-calibrate, sim-validate
    "torchinferno.cli.sim_cmds",  # sim-smoke, traffic-smoke, sim-plan
    "torchinferno.cli.parallel_cmds",  # plan-parallel
    "torchinferno.cli.disagg_cmds",  # disagg-init, disagg-smoke (rank files)
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchinferno", description="TorchInferno: a torch-native LLM inference workbench")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for mod in COMMAND_GROUPS:
        importlib.import_module(mod).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from torchinferno.env import apply_platform_defaults, read_env, warn_unread_env

    apply_platform_defaults()  # before anything imports torch
    from torchinferno.errors import TorchInfernoError

    parser = build_parser()
    args = parser.parse_args(argv)
    warn_unread_env()  # one line per TORCHINFERNO_* knob of the original that we do not read
    try:
        rc = args.func(args)
        return int(rc or 0)
    except (TorchInfernoError, FileNotFoundError, NotADirectoryError, PermissionError) as e:
        if read_env().debug:
            raise
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"error: {msg}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `torchinferno audit | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
