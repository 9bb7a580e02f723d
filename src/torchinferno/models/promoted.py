"""Build-time, read-only lookup of promoted variants (the runtime side of ``workbench/promotion.py``).

``workbench.promotion.promote`` writes promoted variants into a JSON registry
(``{"version": 1, "families": {family: {name: record}}}``, default
``<TORCHINFERNO_CACHE_DIR>/promoted_variants.json``). A record names something buildable: its
``parent`` (a built-in or another promoted variant), the ``class_path`` to instantiate (the
parent's class) and an ``ops_module`` override implementing the family's ops contract.

``load_variant_class(VARIANTS, name, family)`` is what each ``family.build`` calls: a built-in
name returns the variant's class unchanged (no file is read); a promoted name returns the
parent's class with the override ops module injected at construction. If the override cannot
be imported or lacks part of the contract, the parent is built instead and a ``RuntimeWarning``
is emitted once per (family, variant): the safe torch fallback.

Runtime never imports ``torchinferno.workbench`` from here, and nothing is compiled or traced.
"""

from __future__ import annotations

import importlib
import inspect
import json
import warnings
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from torchinferno.errors import ConfigError
from torchinferno.models.variants import Variant, pick_variant

REGISTRY_FILE = "promoted_variants.json"

_registry_stack: list[Path] = []  # explicit registries (``using_registry``), innermost last
_warned: set[tuple[str, str]] = set()
_classes: dict[tuple[type, str], type] = {}


def default_registry_path() -> Path:
    """``<TORCHINFERNO_CACHE_DIR or ~/.cache/torchinferno>/promoted_variants.json``."""
    from torchinferno.env import read_env

    return read_env().cache_dir / REGISTRY_FILE


def registry_path() -> Path:
    """The registry ``family.build`` reads: the innermost ``using_registry`` path, else the default."""
    return _registry_stack[-1] if _registry_stack else default_registry_path()


@contextmanager
def using_registry(path: str | Path | None):
    """Within the block, ``family.build`` resolves promoted names from ``path`` (None: no change)."""
    if path is None:
        yield
        return
    _registry_stack.append(Path(path))
    try:
        yield
    finally:
        _registry_stack.pop()


def read_registry(path: str | Path | None = None) -> dict:
    p = Path(path) if path else registry_path()
    if not p.exists():
        return {"version": 1, "families": {}}
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read promoted-variant registry {p}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"promoted-variant registry {p} is not a JSON object")
    data.setdefault("families", {})
    return data


def promoted_records(family: str, path: str | Path | None = None) -> dict[str, dict]:
    """``{name: record}`` of one family (``family`` is the canonical family name)."""
    return read_registry(path)["families"].get(family, {})


def record_variant(record: dict) -> Variant:
    return Variant(name=record["name"], parent=record["parent"], class_path=record["class_path"],
                   ops_module=record["ops_module"], status="promoted", notes=record.get("notes", ""))


def _warn_once(family: str, name: str, msg: str) -> None:
    if (family, name) not in _warned:
        _warned.add((family, name))
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _contract(ops: ModuleType) -> set[str]:
    """Public functions an ops module defines (or aliases under another name): the family's ops
    contract as the parent implements it. Helpers merely imported under their own name are skipped."""
    return {k for k, v in vars(ops).items() if not k.startswith("_") and callable(v) and not isinstance(v, type)
            and (getattr(v, "__module__", None) == ops.__name__ or getattr(v, "__name__", k) != k)}


def _ops_base(cls: type) -> type | None:
    """The first class of ``cls``'s MRO whose own ``__init__`` takes ``ops``."""
    for b in cls.__mro__:
        init = b.__dict__.get("__init__")
        if init is not None and "ops" in inspect.signature(init).parameters:
            return b
    return None


def with_ops(cls: type, ops: ModuleType) -> type | None:
    """A subclass of ``cls`` that builds exactly like ``cls`` but receives ``ops`` as its ops module.

    A shim subclass of the MRO class that takes ``ops`` is slotted in just above it, so ``cls``'s
    own ``__init__`` (and everything it passes, e.g. ``absorb_decode``) runs unchanged and only the
    ``ops`` argument reaching the base is replaced. None when no class in the MRO takes ``ops``.
    """
    key = (cls, ops.__name__)
    if key in _classes:
        return _classes[key]
    base = _ops_base(cls)
    if base is None:
        return None
    sig = inspect.signature(base.__dict__["__init__"])

    def __init__(self, *args, **kwargs):
        bound = sig.bind(self, *args, **kwargs)
        bound.arguments["ops"] = ops
        # super(), not base.__init__: a promoted child of a promoted variant stacks a second shim
        # below this one, and the innermost (the child's) override must win.
        super(shim, self).__init__(*bound.args[1:], **bound.kwargs)

    short = ops.__name__.rsplit(".", 1)[-1]
    shim = type(f"{base.__name__}_ops_{short}", (base,), {"__init__": __init__, "__module__": cls.__module__})
    bases = (shim,) if base is cls else (cls, shim)
    out = type(f"{cls.__name__.split('_ops_')[0]}_ops_{short}", bases, {"__module__": cls.__module__, "promoted_ops_module": ops.__name__})
    _classes[key] = out
    return out


def _resolve(variants: dict[str, Variant], name: str, family: str, seen: tuple[str, ...] = ()) -> type:
    if name in variants:
        return variants[name].load_class()
    records = promoted_records(family)
    if name not in records:
        pick_variant({**variants, **{n: record_variant(r) for n, r in records.items()}}, name, family)  # raises
    if name in seen:
        raise ConfigError(f"promoted variant '{name}' of {family} has a cyclic parent chain: {' -> '.join(seen + (name,))}")
    rec = records[name]
    parent = rec.get("fallback") or rec["parent"]
    parent_cls = _resolve(variants, parent, family, seen + (name,))
    parent_ops = _ops_of(variants, records, parent)
    try:
        cls = parent_cls if rec["class_path"] == _class_path_of(variants, records, parent) else \
            Variant(name, parent, rec["class_path"], rec["ops_module"], "promoted").load_class()
        if parent_ops is not None and rec["ops_module"] == parent_ops:
            return cls
        ops = importlib.import_module(rec["ops_module"])
        if parent_ops is not None:
            missing = _contract(importlib.import_module(parent_ops)) - set(vars(ops))
            if missing:
                raise ImportError(f"{rec['ops_module']} lacks {', '.join(sorted(missing))} of the {family} ops contract")
        built = with_ops(cls, ops)
        if built is None:
            raise ImportError(f"{rec['class_path']} takes no ops module")
        return built
    except (ImportError, AttributeError, ValueError) as e:
        _warn_once(family, name, f"promoted variant {family}:{name} cannot load its override ({type(e).__name__}: {e}); "
                                 f"building its parent '{parent}' instead")
        return parent_cls


def _ops_of(variants, records, name) -> str | None:
    if name in variants:
        return variants[name].ops_module
    return records[name]["ops_module"] if name in records else None


def _class_path_of(variants, records, name) -> str | None:
    if name in variants:
        return variants[name].class_path
    return records[name]["class_path"] if name in records else None


def load_variant_class(variants: dict[str, Variant], name: str, family: str) -> type:
    """The class ``family.build`` instantiates for ``name`` (built-in or promoted; see the module doc)."""
    return _resolve(variants, name, family)
