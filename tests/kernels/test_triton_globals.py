"""Every ``@triton.jit`` function of kernels/triton/ reads only globals the GPU compiler accepts.

Triton's front end (3.x) refuses a kernel that reads a plain module-level number (``NO_SINK = -1e30``; the H100
run of session 18 failed four DSA tests on it), while the interpreter that runs our kernels on CPU accepts it,
so nothing else in CI catches this. A jit function may read: modules, functions (jit or not), classes, and
``tl.constexpr`` values. This walks each function's source for the global names it loads.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
import textwrap
import types

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


def _jit_functions():
    import torchinferno.kernels.triton as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
        for name, obj in vars(mod).items():
            if isinstance(obj, triton.runtime.JITFunction) and obj.fn.__module__ == mod.__name__:
                yield f"{info.name}.{name}", obj.fn


def _global_loads(source: str) -> set[str]:
    """Names the function in ``source`` loads that it never binds itself (parameters, assignments, loop targets)."""
    tree = ast.parse(textwrap.dedent(source))
    func = tree.body[0]
    bound = {a.arg for a in func.args.args + func.args.kwonlyargs}
    loads = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else bound).add(node.id)
    return loads - bound


def _bad_globals(source: str, env: dict) -> list[str]:
    bad = []
    for name in sorted(_global_loads(source)):
        if name in env:
            value = env[name]
        elif hasattr(builtins, name):
            continue
        else:
            bad.append(f"{name} (undefined)")
            continue
        ok = isinstance(value, (types.ModuleType, type, tl.constexpr, triton.runtime.JITFunction)) or callable(value)
        if not ok:
            bad.append(f"{name} = {value!r} ({type(value).__name__})")
    return bad


JIT = sorted(_jit_functions())


def test_the_walk_finds_the_kernels():
    assert len(JIT) >= 30, [n for n, _ in JIT]


@pytest.mark.parametrize("name,fn", JIT, ids=[n for n, _ in JIT])
def test_jit_function_reads_only_constexpr_globals(name, fn):
    bad = _bad_globals(inspect.getsource(fn), fn.__globals__)
    assert not bad, f"{name} reads globals the GPU compiler rejects: {bad}"


def test_the_check_flags_a_plain_number_and_an_undefined_name():
    src = "def k(X, B: tl.constexpr):\n    y = tl.full([B], LIMIT, tl.float32) + OK + MISSING\n    return y\n"
    env = {"tl": tl, "LIMIT": -1.0e30, "OK": tl.constexpr(3)}
    assert _bad_globals(src, env) == ["LIMIT = -1e+30 (float)", "MISSING (undefined)"]
