"""Every family's tiny config takes field overrides (models/common/config_overrides.py)."""

import pytest

from torchinferno.errors import ConfigError
from torchinferno.models.deepseek_v32.config import (
    tiny_deepseek_v3_config, tiny_deepseek_v3_no_q_lora_config, tiny_deepseek_v32_config,
)
from torchinferno.models.dsv4.config import tiny_dsv4_config, tiny_dsv4_no_q_lora_config
from torchinferno.models.llama3.config import debug_config

TINY = [debug_config, tiny_deepseek_v32_config, tiny_deepseek_v3_config, tiny_deepseek_v3_no_q_lora_config,
        tiny_dsv4_config, tiny_dsv4_no_q_lora_config]


@pytest.mark.parametrize("tiny", TINY, ids=lambda f: f.__name__)
def test_overrides_alias_and_special_ids(tiny):
    base = tiny()
    assert (base.bos_token_id, base.eos_token_id) == (256, 257)  # the defaults are unchanged
    cfg = tiny(vocab_size=128, max_seq_len=32)
    assert cfg.vocab_size == 128 and cfg.max_position_embeddings == 32
    assert (cfg.eos_token_id, cfg.bos_token_id, cfg.pad_token_id) == (127, 126, None)  # moved into the vocab
    assert tiny(max_position_embeddings=32) == tiny(max_seq_len=32)
    assert tiny(vocab_size=300) == tiny(vocab_size=300, bos_token_id=256, eos_token_id=257)  # still in range: kept
    assert tiny(vocab_size=128, eos_token_id=3).eos_token_id == 3


@pytest.mark.parametrize("tiny", TINY, ids=lambda f: f.__name__)
def test_bad_overrides_are_one_line_config_errors(tiny):
    with pytest.raises(ConfigError, match=r"unknown field 'vocab' \(valid: .*max_seq_len.*vocab_size"):
        tiny(vocab=128)
    with pytest.raises(ConfigError, match="name the same field"):
        tiny(max_seq_len=32, max_position_embeddings=32)
    with pytest.raises(ConfigError, match=r"eos_token_id=500 is outside the vocabulary \[0, 128\)"):
        tiny(vocab_size=128, eos_token_id=500)
    with pytest.raises(ConfigError, match="vocab_size' must be a positive integer"):
        tiny(vocab_size=0)


def test_eos_lists_and_family_validation():
    assert debug_config(eos_token_id=[257, 5]).eos_token_id == [257, 5]
    from dataclasses import replace

    from torchinferno.models.common.config_overrides import override_config

    listed = replace(debug_config(), eos_token_id=[257, 5, 258])
    assert override_config(listed, {"vocab_size": 128}, "t").eos_token_ids == [127, 5]
    with pytest.raises(ConfigError, match="n_group"):
        tiny_deepseek_v32_config(n_group=3)  # the dataclass's own checks still apply
