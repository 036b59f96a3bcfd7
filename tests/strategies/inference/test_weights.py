"""Weights on their way into a rollout engine: buckets that keep layers whole, checks of names and
fused groups, the byte encoding."""

import pytest
import torch

from roll_device.errors import ConfigError
from strategies.inference.weights import check_update, group_key, weight_buckets


def layer(i, nbytes_each=400):
    n = nbytes_each // 4
    return [
        (f"model.layers.{i}.self_attn.{p}.weight", torch.full((n,), float(i)))
        for p in ("q_proj", "k_proj", "v_proj")
    ]


def test_group_keys():
    assert group_key("model.layers.12.mlp.up_proj.weight") == "model.layers.12"
    assert group_key("model.embed_tokens.weight") == "model.embed_tokens"
    assert group_key("lm_head.weight") == "lm_head"
    assert group_key("scale") == "scale"


def test_buckets_close_only_between_layers():
    named = [("model.embed_tokens.weight", torch.zeros(100))] + layer(0) + layer(1) + layer(2)
    buckets = list(weight_buckets(iter(named), bucket_bytes=1000))
    assert [[n.split(".")[2] if "layers" in n else n for n, _ in b] for b in buckets] == [
        ["model.embed_tokens.weight", "0", "0", "0"],  # 400 + 1200 > 1000 but a layer is never split
        ["1", "1", "1"],
        ["2", "2", "2"],
    ]
    assert [n for b in buckets for n, _ in b] == [n for n, _ in named]
    one = list(weight_buckets(iter(named), bucket_bytes=1 << 20))
    assert len(one) == 1


def test_layers_arriving_in_two_runs_are_refused():
    named = layer(0)[:1] + layer(1) + layer(0)[1:]
    with pytest.raises(ConfigError, match="weights of 'model.layers.0' arrived in two separate runs"):
        list(weight_buckets(iter(named), 1 << 20))


def test_duplicates_and_bad_bucket_size_are_refused():
    with pytest.raises(ConfigError, match="sent twice"):
        list(weight_buckets(iter(layer(0) + layer(0)[:1]), 1 << 20))
    with pytest.raises(ConfigError, match="update_bucket_bytes must be a positive integer"):
        list(weight_buckets(iter(layer(0)), 0))


def test_check_update_names_unknown_and_partial_fused_groups():
    fused = [[n for n, _ in layer(0)]]
    known = set(fused[0]) | {"lm_head.weight"}
    check_update(known, known, fused)
    with pytest.raises(ConfigError, match=r"no weight named \['model.layers.0.mlp.up_proj.weight'\]"):
        check_update(["model.layers.0.mlp.up_proj.weight"], known, fused)
    with pytest.raises(ConfigError, match="are fused with .*k_proj.*: send them in the same update"):
        check_update([fused[0][0]], known, fused)
