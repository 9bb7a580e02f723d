"""safetensors_io: round trips, sharding, transformers interop, and one-line errors on bad files."""

from __future__ import annotations

import json
import os

import pytest
import torch

from torchinferno.checkpoint.safetensors_io import (
    TensorInfo,
    iter_tensors,
    read_config,
    save_hf_dir,
    tensor_index,
)
from torchinferno.errors import CheckpointError, ConfigError


def _mixed_tensors() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    base = torch.randn(8, 6)
    emb = torch.randn(10, 4)
    return {
        "a.weight": base,
        "a.t": base.t(),  # non-contiguous view of the same storage
        "b.slice": base[2:5],  # partial view of that storage
        "emb.weight": emb,
        "head.weight": emb,  # tied: same tensor under two names
        "bf16": torch.randn(3, 5).to(torch.bfloat16),
        "ids": torch.arange(7, dtype=torch.int64),
        "flag": torch.tensor([True, False]),
        "scalar": torch.tensor(3.5),
    }


def _load_all(d) -> dict[str, torch.Tensor]:
    return dict(iter_tensors(d))


def test_single_file_round_trip(tmp_path):
    src = _mixed_tensors()
    out = save_hf_dir(tmp_path / "m", {"model_type": "llama", "torch_dtype": torch.bfloat16}, src)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert read_config(out) == {"model_type": "llama", "torch_dtype": "bfloat16"}
    got = _load_all(out)
    assert list(got) == list(tensor_index(out))
    assert set(got) == set(src)
    for k, v in src.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
    info = tensor_index(out)["bf16"]
    assert info == TensorInfo(str((out / "model.safetensors").resolve()), (3, 5), "BF16")
    assert info.torch_dtype == torch.bfloat16 and info.nbytes == 30


def test_sharded_round_trip_and_index(tmp_path):
    src = {f"t{i}": torch.full((25,), float(i)) for i in range(10)}  # 100 bytes each
    src["big"] = torch.zeros(100)  # 400 bytes: larger than a shard, gets its own
    out = save_hf_dir(tmp_path / "m", {"x": 1}, src, max_shard_bytes=250)
    files = sorted(p.name for p in out.glob("*.safetensors"))
    n = len(files)
    assert n == 6 and files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 10 * 100 + 400
    assert list(index["weight_map"]) == sorted(src)
    assert index["weight_map"]["t0"] == index["weight_map"]["t1"] != index["weight_map"]["t2"]
    for f in files:  # greedy packing never exceeds the limit except for a lone oversize tensor
        names = [k for k, v in index["weight_map"].items() if v == f]
        assert sum(src[k].numel() * 4 for k in names) <= 250 or names == ["big"]
    got = _load_all(out)
    assert set(got) == set(src) and all(torch.equal(got[k], src[k]) for k in src)
    # a later single-file save into the same directory removes the old shards and index
    save_hf_dir(out, {"x": 2}, {"only": torch.ones(2)})
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]


def test_streams_generator_and_subset(tmp_path):
    gen = ((f"w{i}", torch.full((4,), float(i))) for i in range(5))
    out = save_hf_dir(tmp_path / "m", {}, gen, max_shard_bytes=40)
    assert (out / "model.safetensors.index.json").is_file()
    got = list(iter_tensors(out, names=["w3", "w1"]))
    assert [n for n, _ in got] == ["w1", "w3"]  # storage order
    assert torch.equal(got[1][1], torch.full((4,), 3.0))
    with pytest.raises(CheckpointError, match="tensor 'nope' not found"):
        iter_tensors(out, names=["w1", "nope"])
    with pytest.raises(ValueError, match="duplicate tensor name 'a'"):
        save_hf_dir(tmp_path / "d", {}, [("a", torch.ones(1)), ("a", torch.ones(1))])
    with pytest.raises(ConfigError, match="max_shard_bytes"):
        save_hf_dir(tmp_path / "e", {}, {}, max_shard_bytes=0)


def _tiny_hf_model(tie: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, tie_word_embeddings=tie,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def test_sharded_dir_loads_in_transformers(tmp_path):
    from transformers import LlamaForCausalLM

    model = _tiny_hf_model(tie=True)
    sd = model.state_dict()  # lm_head.weight and embed_tokens.weight share storage
    out = save_hf_dir(tmp_path / "m", model.config.to_dict(), sd, max_shard_bytes=20_000)
    assert len(list(out.glob("model-*.safetensors"))) > 2
    loaded = LlamaForCausalLM.from_pretrained(out).eval()
    lsd = loaded.state_dict()
    assert set(lsd) == set(sd)
    for k in sd:
        assert torch.equal(lsd[k], sd[k]), k
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model(ids).logits)


@pytest.mark.parametrize("shard", [None, "20KB"])
def test_tensor_index_reads_transformers_save_pretrained(tmp_path, shard):
    model = _tiny_hf_model(tie=False)
    kw = {} if shard is None else {"max_shard_size": shard}
    model.save_pretrained(tmp_path, **kw)
    sharded = (tmp_path / "model.safetensors.index.json").is_file()
    assert sharded == (shard is not None)
    index = tensor_index(tmp_path)
    sd = model.state_dict()
    assert set(index) == set(sd)
    for k, v in sd.items():
        assert index[k].shape == tuple(v.shape) and index[k].torch_dtype == v.dtype, k
    if sharded:
        assert len({i.file for i in index.values()}) > 1
    got = _load_all(tmp_path)
    assert all(torch.equal(got[k], sd[k]) for k in sd)


# ------------------------------------------------------------------------------------- errors


@pytest.fixture()
def saved(tmp_path):
    src = {"first": torch.ones(16), "last.weight": torch.arange(64, dtype=torch.float32)}
    return save_hf_dir(tmp_path / "m", {"model_type": "llama"}, src)


def test_garbage_header_names_file(saved):
    f = saved / "model.safetensors"
    f.write_bytes(os.urandom(64) + b"x" * 1000)
    with pytest.raises(CheckpointError, match=r"corrupt safetensors file .*model\.safetensors"):
        tensor_index(saved)
    # plausible length but not JSON
    f.write_bytes((20).to_bytes(8, "little") + b"\xff" * 20 + b"\0" * 64)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: header is not valid JSON"):
        list(iter_tensors(saved))


def test_truncated_file_names_file_and_tensor(saved):
    f = saved / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:-10])
    with pytest.raises(CheckpointError) as e:
        tensor_index(saved)
    msg = str(e.value)
    assert "truncated" in msg and str(f.resolve()) in msg and "'last.weight'" in msg and "\n" not in msg
    with pytest.raises(CheckpointError, match="last.weight"):
        list(iter_tensors(saved))


def test_header_shape_mismatch_names_tensor(saved):
    f = saved / "model.safetensors"
    data = f.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    header["first"]["shape"] = [17]
    raw = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(raw) == n
    f.write_bytes(data[:8] + raw + data[8 + n :])
    with pytest.raises(CheckpointError, match=r"tensor 'first' spans 64 bytes but shape \[17\] F32 needs 68"):
        tensor_index(saved)


def test_index_naming_missing_shard(tmp_path):
    src = {f"t{i}": torch.ones(32) for i in range(4)}
    out = save_hf_dir(tmp_path / "m", {}, src, max_shard_bytes=200)
    victim = sorted(out.glob("model-*.safetensors"))[-1]
    victim.unlink()
    with pytest.raises(CheckpointError) as e:
        tensor_index(out)
    assert victim.name in str(e.value) and "missing shard" in str(e.value) and "'t3'" in str(e.value)


def test_index_entry_absent_from_shard(tmp_path):
    out = save_hf_dir(tmp_path / "m", {}, {"a": torch.ones(32), "b": torch.ones(32)}, max_shard_bytes=128)
    idx = out / "model.safetensors.index.json"
    data = json.loads(idx.read_text())
    data["weight_map"]["ghost"] = data["weight_map"]["a"]
    idx.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="'ghost'.*header lacks it"):
        tensor_index(out)


def test_config_errors_name_path(tmp_path):
    with pytest.raises(CheckpointError, match=r"missing config\.json: .*config\.json"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"invalid JSON in .*config\.json"):
        read_config(tmp_path)
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        tensor_index(tmp_path)
