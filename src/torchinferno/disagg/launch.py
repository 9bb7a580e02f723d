"""Starting a prefill/decode pair: where each role's ranks run, which transport each KV pair uses, and the two
engine-core processes (prefill first, then decode), on store ports picked here.

Invariant: :func:`start_role_cores` returns both roles' cores started and ready, or raises with none left running.
A store port picked automatically (``DisaggConfig.port == 0``) and taken by another process before its role bound it
fails that role's startup (``disagg.transport`` binds at startup); the pair then starts once more on fresh ports.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torchinferno.disagg.roles import RoleConfig
from torchinferno.disagg.topology import distinct_ports, role_devices
from torchinferno.disagg.transport import BACKENDS, FanoutConfig, TransportConfig, pick_backend
from torchinferno.engine.core_client import EngineCoreProcess
from torchinferno.engine.core_proc import CoreProcessConfig
from torchinferno.errors import ConfigError
from torchinferno.ports import once_more_if_port_taken

__all__ = ["DisaggConfig", "PairPlan", "plan_pair", "start_role_cores"]

ROLES = ("prefill", "decode")  # start order; the index is the role's rank in every KV pair


@dataclass(frozen=True)
class DisaggConfig:
    prefill_device: str = "cpu"
    decode_device: str = "cpu"
    host: str = "127.0.0.1"
    port: int = 0  # the transport's store (TP: pair i on port + i, the decode fan-out on port + N); 0 = free ports
    backend: str = "auto"  # auto | gloo | nccl | cuda-ipc
    timeout_s: float = 60.0
    profile: bool = False  # synchronized pack / wire / unpack timings
    record_path: str | None = None  # JSONL: one disaggregated_runtime_integrity record per completed request


@dataclass(frozen=True)
class PairPlan:
    """Each role's devices (one per TP rank) and each KV pair's transport (pair ``i``: prefill rank ``i`` ->
    decode rank ``i``)."""

    tp: int
    devices: dict[str, list[str]]
    backends: list[str]

    @property
    def backend(self) -> str:
        return self.backends[0] if len(set(self.backends)) == 1 else ",".join(self.backends)


def plan_pair(engine_config, disagg: DisaggConfig) -> PairPlan:
    """Devices and transports from the flags, or a one-line ``ConfigError`` naming the flag."""
    if engine_config.pipeline_parallel_size > 1:
        raise ConfigError("--disaggregation-mode prefill-decode: --pipeline-parallel-size is not supported per "
                          "role (use --tensor-parallel-size N: N ranks per role)")
    tp = engine_config.tensor_parallel_size
    devices = {"prefill": role_devices(disagg.prefill_device, tp, "--prefill-devices"),
               "decode": role_devices(disagg.decode_device, tp, "--decode-devices")}
    backends = [pick_backend(p, d) if disagg.backend == "auto" else disagg.backend
                for p, d in zip(devices["prefill"], devices["decode"])]
    for backend in backends:
        if backend not in BACKENDS:
            raise ConfigError(f"disaggregation transport {backend!r}: valid are auto, {', '.join(BACKENDS)}")
    return PairPlan(tp, devices, backends)


def start_role_cores(plan: PairPlan, model, engine_config, tokenizer, disagg: DisaggConfig, warmup: bool | None,
                     start_timeout_s: float, step_log: str | None) -> dict[str, EngineCoreProcess]:
    """Both roles' engine-core processes, started in :data:`ROLES` order (module docstring: retry, invariant)."""
    def start() -> dict[str, EngineCoreProcess]:
        cores: dict[str, EngineCoreProcess] = {}
        try:
            for role, cfg in zip(ROLES, _core_configs(plan, model, engine_config, tokenizer, disagg, warmup,
                                                      step_log)):
                cores[role] = EngineCoreProcess(cfg, start_timeout_s)
            return cores
        except BaseException:
            for c in cores.values():
                c.shutdown(timeout_s=5)
            raise

    return once_more_if_port_taken(start, retry=not disagg.port)


def _core_configs(plan: PairPlan, model, engine_config, tokenizer, disagg: DisaggConfig, warmup: bool | None,
                  step_log: str | None) -> list[CoreProcessConfig]:
    tp = plan.tp
    ports = distinct_ports(tp + (1 if tp > 1 else 0), disagg.port)
    fanout = FanoutConfig(0, tp, disagg.host, ports[tp], disagg.timeout_s) if tp > 1 else None
    eos = tuple(getattr(tokenizer, "eos_token_ids", ()) or ())
    pdevs, ddevs = plan.devices["prefill"], plan.devices["decode"]
    utilization = {role: engine_config.gpu_memory_utilization for role in ROLES}
    if (set(pdevs) & set(ddevs) and pdevs[0].startswith("cuda")
            and engine_config.kv_cache_memory is None and engine_config.num_gpu_blocks is None):
        # Shared GPUs, two roles, started in order: the prefill role sizes its pool to half the share; the decode
        # role's sizing counts the prefill process as used memory, so it takes the rest of the share.
        utilization["prefill"] /= 2
    out = []
    for rank, role in enumerate(ROLES):
        pairs = tuple(TransportConfig(rank, disagg.host, port, b, disagg.timeout_s, disagg.profile)
                      for port, b in zip(ports[:tp], plan.backends))
        ecfg = dataclasses.replace(engine_config, gpu_memory_utilization=utilization[role])
        devices = plan.devices[role]
        device = devices[0] if tp == 1 or devices[0] == "cpu" else ",".join(devices)
        role_cfg = RoleConfig(role, pairs[0], pairs if tp > 1 else (), fanout if role == "decode" else None)
        out.append(CoreProcessConfig(dataclasses.replace(model, device=device), ecfg, eos, warmup,
                                     f"{step_log}.{role}" if step_log else None, disagg=role_cfg))
    return out
