"""The original README's documented import paths resolve as thin re-exports: every name is the very object of
its real home (no copies), heavy targets stay lazy, and paths with no implementation fail with ImportError."""

import importlib
import subprocess
import sys

import pytest

# (documented module, documented name, real module, real name)
PATHS = [
    ("torchinferno.research", "ResearchHarness", "torchinferno.workbench.research", "ResearchHarness"),
    ("torchinferno.compiler", "compile_forward", "torchinferno.graph.compile", "compile_forward"),
    ("torchinferno.kernels", "rms_norm", "torchinferno.kernels.api", "rms_norm"),
    ("torchinferno.kernels", "swiglu_activation", "torchinferno.kernels.api", "swiglu_activation"),
    ("torchinferno.kernels", "paged_decode_attention", "torchinferno.kernels.api", "paged_decode_attention"),
    ("torchinferno.kernels", "batched_paged_decode_attention", "torchinferno.kernels.api", "batched_paged_decode_attention"),
    ("torchinferno.kernels", "fused_rmsnorm_swiglu", "torchinferno.kernels.custom_ops", "fused_rmsnorm_swiglu"),
    ("torchinferno.kernels", "quantize_nvfp4", "torchinferno.kernels.nvfp4", "quantize_nvfp4"),
    ("torchinferno.kernels", "dequantize_nvfp4", "torchinferno.kernels.nvfp4", "dequantize_nvfp4"),
    ("torchinferno.kernels", "nvfp4_linear_reference", "torchinferno.kernels.nvfp4", "nvfp4_linear_reference"),
    ("torchinferno.graph", "trace_with_make_fx", "torchinferno.graph.capture", "trace_with_make_fx"),
    ("torchinferno.graph", "PassRegistry", "torchinferno.graph.passes", "PassRegistry"),
    ("torchinferno.graph", "annotate_matching_nodes", "torchinferno.graph.passes", "annotate_matching_nodes"),
    ("torchinferno.graph", "replace_call_function_targets", "torchinferno.graph.passes", "replace_call_function_targets"),
    ("torchinferno.graph", "replace_call_module_targets", "torchinferno.graph.passes", "replace_call_module_targets"),
    ("torchinferno.graph", "replace_subgraph_pattern", "torchinferno.graph.patterns", "replace_subgraph_pattern"),
    ("torchinferno", "load_text_tokenizer", "torchinferno.text.tokenizer", "load_tokenizer"),
    ("torchinferno", "load_model_auto", "torchinferno.checkpoint.auto", "load_model_auto"),
    ("torchinferno", "DeepSeekV4ForCausalLM", "torchinferno.models.deepseek_v4.model", "DeepSeekV4ForCausalLM"),
    ("torchinferno.runtime.sampling", "sample", "torchinferno.text.sampling", "sample"),
    ("torchinferno.runtime.paged", "BlockPool", "torchinferno.cache.block_pool", "BlockPool"),
    ("torchinferno.runtime.paged", "PagedKVCache", "torchinferno.cache.kv_cache", "PagedKVCache"),
    ("torchinferno.runtime.paged", "allocate_kv_cache", "torchinferno.cache.kv_cache", "allocate_kv_cache"),
    ("torchinferno.runtime.paged_attention", "TorchAttention", "torchinferno.models.common.attention", "TorchAttention"),
    ("torchinferno.runtime.paged_attention", "paged_attention_reference", "torchinferno.kernels.api", "paged_attention_reference"),
    ("torchinferno.runtime.cudagraphs", "CudaGraphDecodeRunner", "torchinferno.kernels.cuda_graphs", "CudaGraphDecodeRunner"),
    ("torchinferno.runtime.serving", "LLMEngine", "torchinferno.engine.llm_engine", "LLMEngine"),
    ("torchinferno.runtime.serving", "LLM", "torchinferno.engine.llm", "LLM"),
    ("torchinferno.runtime.prefix", "PrefixRouter", "torchinferno.engine.router", "PrefixRouter"),
    ("torchinferno.runtime.prefix", "hash_token_blocks", "torchinferno.cache.block_pool", "hash_token_blocks"),
    ("torchinferno.runtime.prefix", "RadixTree", "torchinferno.engine.radix_tree", "RadixTree"),
    ("torchinferno.runtime.prefix", "make_policy", "torchinferno.engine.route_policy", "make_policy"),
    ("torchinferno.runtime.prefix_cache", "BlockPool", "torchinferno.cache.block_pool", "BlockPool"),
    ("torchinferno.runtime.prefix_cache", "save_prefix", "torchinferno.cache.prefix_snapshot", "save_prefix"),
    ("torchinferno.runtime.prefix_cache", "restore_prefix", "torchinferno.cache.prefix_snapshot", "restore_prefix"),
    ("torchinferno.runtime.offload", "LayerOffloader", "torchinferno.workbench.offload", "LayerOffloader"),
    ("torchinferno.runtime.simulation", "SimulatedExecutor", "torchinferno.sim.executor", "SimulatedExecutor"),
    ("torchinferno.runtime.simulation", "replay_timeslice", "torchinferno.workbench.timeslice", "replay_timeslice"),
    ("torchinferno.runtime.scheduler", "plan", "torchinferno.sim.plan", "plan"),
    ("torchinferno.runtime.scheduler", "ClusterSpec", "torchinferno.sim.cluster", "ClusterSpec"),
    ("torchinferno.runtime.traffic", "TrafficSpec", "torchinferno.sim.traffic", "TrafficSpec"),
    ("torchinferno.runtime.traffic", "generate", "torchinferno.sim.traffic", "generate"),
    ("torchinferno.runtime.fake_dist", "fake_world", "torchinferno.parallel.fake", "fake_world"),
    ("torchinferno.runtime.disaggregated", "DisaggLLM", "torchinferno.disagg.client", "DisaggLLM"),
    ("torchinferno.runtime.disaggregated", "pack_kv", "torchinferno.disagg.kv_io", "pack_kv"),
    ("torchinferno.runtime.disaggregated", "KVTransport", "torchinferno.disagg.transport", "KVTransport"),
    ("torchinferno.runtime.fake_dist", "plan_parallel", "torchinferno.parallel.fake", "plan_parallel"),
    ("torchinferno.runtime.disagg", "DisaggRank", "torchinferno.runtime.disagg_rank", "DisaggRank"),
    ("torchinferno.runtime.disagg", "write_rank_files", "torchinferno.runtime.disagg_files", "write_rank_files"),
    ("torchinferno.runtime.disagg", "run_disagg_request", "torchinferno.runtime.disagg_http", "run_disagg_request"),
]


@pytest.mark.parametrize("mod,name,home,real", PATHS, ids=[f"{m}.{n}" for m, n, _, _ in PATHS])
def test_documented_path_is_the_real_object(mod, name, home, real):
    assert getattr(importlib.import_module(mod), name) is getattr(importlib.import_module(home), real)


@pytest.mark.parametrize("mod", sorted({m for m, *_ in PATHS} | {"torchinferno.runtime"}))
def test_all_lists_only_real_names(mod):
    m = importlib.import_module(mod)
    for name in getattr(m, "__all__", []):
        assert getattr(m, name) is not None


@pytest.mark.parametrize("missing", ["flex", "options"])
def test_runtime_paths_without_an_implementation_do_not_exist(missing):
    with pytest.raises(ImportError):
        importlib.import_module(f"torchinferno.runtime.{missing}")


def test_register_kernel_replacement_passes_rewrites_leaf_calls_and_patterns():
    import torch
    from torch import fx

    from torchinferno.graph import PassRegistry, trace_with_make_fx
    from torchinferno.kernels import api, reference
    from torchinferno.kernels.passes import register_kernel_replacement_passes

    reg = PassRegistry()
    assert register_kernel_replacement_passes(reg) is reg
    assert reg.names()[0] == "kernel-leaf-calls" and "pattern:fused-rmsnorm-swiglu" in reg.names()

    g = fx.Graph()  # leaf calls of the references, as a symbolic trace with wrapped functions records them
    x_, w_ = g.placeholder("x"), g.placeholder("w")
    normed = g.call_function(reference.ref_rms_norm, (x_, w_, 1e-6))
    g.output(g.call_function(reference.ref_swiglu, (g.call_function(torch.cat, ([normed, normed], -1)),)))
    gm = fx.GraphModule(torch.nn.Module(), g)
    x, w = torch.randn(3, 8), torch.rand(8) + 0.5
    ref = gm(x, w)
    reports = reg.run(gm, only=["kernel-leaf-calls"])
    assert reports[0].changed == 2
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert api.rms_norm in targets and api.swiglu_activation in targets
    torch.testing.assert_close(gm(x, w), ref, rtol=1e-5, atol=1e-5)

    def mlp(h, w_up):  # silu(gate) * up over a split projection: the library "swiglu" pattern
        gate, up = (h @ w_up.t()).chunk(2, -1)
        return torch.nn.functional.silu(gate) * up

    h, w_up = torch.randn(4, 8), torch.randn(12, 8)
    aten = trace_with_make_fx(mlp, (h, w_up))
    assert reg.run(aten, only=["pattern:swiglu"])[0].changed == 1
    torch.testing.assert_close(aten(h, w_up), mlp(h, w_up), rtol=1e-5, atol=1e-5)


def test_importing_kernels_registers_no_custom_op():
    code = ("import torch, torchinferno.kernels as k; assert not hasattr(torch.ops.torchinferno, 'fused_rmsnorm_swiglu'); "
            "k.fused_rmsnorm_swiglu; assert hasattr(torch.ops.torchinferno, 'fused_rmsnorm_swiglu')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
