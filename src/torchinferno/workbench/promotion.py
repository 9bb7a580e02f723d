"""Promotion: turn a validated, faster candidate into a named variant of its family.

Promoted variants are persisted as JSON (never by editing source): in a registry file given
explicitly (``--registry PATH``, e.g. inside a run directory) or the user-level default
``<TORCHINFERNO_CACHE_DIR>/promoted_variants.json``. Layout::

    {"version": 1, "families": {"llama3": {"v1-custom-op-fused-rmsnorm-swiglu": {record}}}}

A record is a ``models.variants.Variant`` (name, parent, class_path, ops_module, status
"promoted", notes) plus the evidence: provider, partition, correctness, benchmark, candidate dir
and ``fallback`` (the parent variant). The record is buildable: ``class_path`` is the parent's
class and ``ops_module`` the candidate's runtime ops module (``candidates.runtime_form``), so
``family.build(config, variant=NAME)`` (through ``models/promoted.py``, which reads this file
without importing the workbench) builds the parent's class with that ops module, or the parent
with a warning when the module cannot be loaded. Invariants: a candidate is promoted only if
``correctness.passed``, ``speedup_vs_best_baseline >= 1 + threshold`` and it has a runtime form
(torch-compile candidates are refused: runtime never compiles); names never shadow a built-in
variant.
"""

from __future__ import annotations

import importlib
import json
import re
import time
from pathlib import Path

from torchinferno.errors import ConfigError
from torchinferno.models.promoted import record_variant
from torchinferno.models.variants import Variant
from torchinferno.workbench.artifacts import read_json

DEFAULT_THRESHOLD = 0.05


def default_registry_path() -> Path:
    """``<TORCHINFERNO_CACHE_DIR or ~/.cache/torchinferno>/promoted_variants.json`` (what runtime reads)."""
    from torchinferno.models import promoted

    return promoted.default_registry_path()


def _load(path: Path) -> dict:
    if not path.exists():
        return {"version": 1, "families": {}}
    data = read_json(path, "promoted-variant registry")
    data.setdefault("families", {})
    return data


def builtin_variants(family: str) -> tuple[dict[str, Variant], str | None]:
    """(VARIANTS, DEFAULT_VARIANT) of the family's ``registry.py`` (via ``variants_module``)."""
    from torchinferno.models.registry import get_family

    fam = get_family(family)
    if not fam.variants_module:
        return {}, None
    mod = importlib.import_module(fam.variants_module)
    return dict(getattr(mod, "VARIANTS", {})), getattr(mod, "DEFAULT_VARIANT", None)


def promoted_records(family: str, registry: str | Path | None = None) -> dict[str, dict]:
    from torchinferno.models.registry import get_family

    name = get_family(family).name
    return _load(Path(registry) if registry else default_registry_path())["families"].get(name, {})


def all_variants(family: str, registry: str | Path | None = None) -> dict[str, Variant]:
    """Built-in variants plus promoted ones (as ``Variant`` values with status ``promoted``)."""
    out, _ = builtin_variants(family)
    for name, r in promoted_records(family, registry).items():
        out.setdefault(name, record_variant({**r, "name": name}))
    return out


def gate(correctness: dict, benchmark: dict, threshold: float = DEFAULT_THRESHOLD) -> tuple[bool, str]:
    """The gate every provider's candidate goes through: ``(passed, one-line reason)``.

    Passed iff ``correctness["passed"]`` and ``benchmark["speedup_vs_best_baseline"] >= 1 + threshold``
    (the best baseline is the fastest of the candidate's baselines, e.g. the reference graph).
    ``promote`` adds the runtime-form check on top; offline searches (Helion) record this verdict.
    """
    if not correctness.get("passed"):
        return False, f"max abs error {correctness.get('max_abs_error')} exceeds tolerance {correctness.get('tolerance')}"
    need = 1.0 + threshold
    speed = float(benchmark.get("speedup_vs_best_baseline") or 0.0)
    best = benchmark.get("best_baseline")
    if speed < need:
        return False, f"{speed:.3f}x vs best baseline '{best}' is below the required {need:.3f}x (threshold {threshold})"
    return True, f"{speed:.3f}x vs best baseline '{best}' meets the required {need:.3f}x (threshold {threshold})"


def promote(candidate_dir: str | Path, name: str | None = None, threshold: float = DEFAULT_THRESHOLD,
            registry: str | Path | None = None, parent: str | None = None) -> dict:
    """Promote the candidate in ``candidate_dir`` if correct and faster; returns the stored record."""
    from torchinferno.models.registry import get_family

    d = Path(candidate_dir)
    part = read_json(d / "partition.json", "candidate partition.json")
    prov = read_json(d / "provider.json", "candidate provider.json")
    corr = read_json(d / "correctness.json", "candidate correctness.json")
    bench = read_json(d / "benchmark.json", "candidate benchmark.json")
    if not part.get("family"):
        raise ConfigError(f"{d}/partition.json names no model family; cannot promote into a variant registry")
    family = get_family(part["family"]).name
    passed, why = gate(corr, bench, threshold)
    if not passed:
        raise ConfigError(f"not promoted: {why}")
    speed = float(bench.get("speedup_vs_best_baseline") or 0.0)
    from torchinferno.workbench.candidates import runtime_form

    runtime = runtime_form(family, prov["provider"], part)
    builtins, default = builtin_variants(family)
    run_variant = (part.get("run_config") or {}).get("variant")
    parent = parent or run_variant or default
    known = all_variants(family, registry)
    if parent not in known:
        raise ConfigError(f"unknown parent variant '{parent}' for {family} (valid: {', '.join(sorted(known))})")
    label = part.get("pattern") or part["kind"]
    name = name or re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{parent}-{prov['provider']}-{label}")
    if name in builtins:
        raise ConfigError(f"'{name}' is a built-in {family} variant; choose another --name")
    base = known[parent]
    record = {
        "name": name, "family": family, "parent": parent, "fallback": parent,
        "class_path": base.class_path, "ops_module": runtime["ops_module"], "status": "promoted",
        "notes": f"{prov['provider']} for {label}: {speed:.3f}x vs {bench.get('best_baseline')}, "
                 f"max err {corr.get('max_abs_error'):.2e}",
        "provider": prov, "partition": {k: v for k, v in part.items() if k not in ("run_config", "input_ids")},
        "correctness": corr, "benchmark": bench, "threshold": threshold,
        "candidate_dir": str(d.resolve()), "promoted_unix": round(time.time(), 3),
        "runtime": f"builds {parent}'s class with {runtime['description']}; falls back to {parent} (with a warning) "
                   f"if the ops module cannot be loaded",
    }
    path = Path(registry) if registry else default_registry_path()
    data = _load(path)
    data["families"].setdefault(family, {})[name] = record
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return record


def variant_rows(family: str | None = None, registry: str | Path | None = None) -> list[dict]:
    """Rows for ``model-variants``: built-in + promoted variants of every registered family (or one).

    Same keys as ``cli/variants_cmds.variant_rows`` (``variant``, ``parent``, ``status``, ...) plus
    ``promoted`` evidence (candidate dir, speedup) on promoted rows.
    """
    from torchinferno.models.registry import family_names, get_family

    rows = []
    for f in [get_family(family).name] if family else family_names():
        _, default = builtin_variants(f)
        promoted = promoted_records(f, registry)
        for v in all_variants(f, registry).values():
            row = {"family": f, "variant": v.name, "parent": v.parent, "status": v.status, "default": v.name == default,
                   "class_path": v.class_path, "ops_module": v.ops_module, "notes": v.notes}
            if v.name in promoted:
                r = promoted[v.name]
                row["promoted"] = {"candidate_dir": r.get("candidate_dir"), "fallback": r.get("fallback", r["parent"]),
                                   "speedup_vs_best_baseline": (r.get("benchmark") or {}).get("speedup_vs_best_baseline")}
            rows.append(row)
    return rows


def lineages(name: str, family: str | None = None, registry: str | Path | None = None) -> dict[str, list[str]]:
    """``{family: [name, parent, ..., v0]}`` for every family (or one) that has variant ``name``."""
    from torchinferno.models.registry import family_names, get_family
    from torchinferno.models.variants import lineage

    chains = {}
    for f in [get_family(family).name] if family else family_names():
        vs = all_variants(f, registry)
        if name in vs:
            chains[f] = [v.name for v in lineage(vs, name)]
    if not chains:
        valid = sorted({r["variant"] for r in variant_rows(family, registry)})
        raise ConfigError(f"unknown variant '{name}' (valid: {', '.join(valid)})")
    return chains
