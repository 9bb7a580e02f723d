"""Where a prefill/decode pair's ranks run: one device per tensor-parallel rank of each role, and the transport's
store ports (one per KV pair, plus the decode role's fan-out group with tensor parallelism)."""

from __future__ import annotations

from torchinferno.errors import ConfigError

__all__ = ["distinct_ports", "role_devices"]


def role_devices(devices: str, tp: int, flag: str) -> list[str]:
    """One device per TP rank of a role: ``cpu`` for every rank, a single device at TP 1, or a comma list of
    ``tp`` distinct CUDA devices. ``flag`` names the option in the one-line error."""
    devs = [d.strip() for d in devices.split(",") if d.strip()]
    if devs == ["cpu"]:
        return ["cpu"] * tp
    if len(devs) == 1 and tp == 1:
        return devs
    if len(devs) != tp or len(set(devs)) != tp or any(not d.startswith("cuda:") for d in devs):
        raise ConfigError(f"{flag} {devices!r}: --tensor-parallel-size {tp} per role needs cpu or a comma list of "
                          f"{tp} distinct CUDA devices (e.g. {','.join(f'cuda:{i}' for i in range(tp))})")
    return devs


def distinct_ports(n: int, base: int) -> list[int]:
    """``n`` store ports: ``base + i``, or distinct free ports when ``base`` is 0."""
    from torchinferno.ports import free_port

    if base:
        return [base + i for i in range(n)]
    ports: list[int] = []
    while len(ports) < n:
        p = free_port()
        if p not in ports:
            ports.append(p)
    return ports
