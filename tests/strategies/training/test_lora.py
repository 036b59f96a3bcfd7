"""LoRA on the FSDP2 trainer (one rank, in-process, the tiny model): only the adapters train, the
reference is the base with the adapters disabled, syncs after the first carry the adapters alone
into the HF engine (a real sender and receiver, verified), and checkpoints hold the adapters and
their optimizer state."""

from __future__ import annotations

import threading

import pytest
import torch

import roll_device as rd
from roll_device.comm import WeightReceiver, WeightSender, plan_sync, weights_hash
from strategies.inference.hf import HfStrategy
from strategies.training.fsdp import FsdpTrainStrategy, token_logprobs
from strategies.training.lora import is_adapter
from strategies.training.losses import policy_loss
from tests.configs import rollout_settings, run_config, trainer_settings, weight_sync
from tests.strategies.training.data import make_batch

LORA = {"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": "all-linear"}
CPU = "cpu"


@pytest.fixture(scope="module")
def trainer(tiny_model_path):
    strategy = FsdpTrainStrategy(rd.get_platform(CPU))
    strategy.initialize(tiny_model_path, trainer_settings("fsdp", lora=LORA))
    yield strategy
    strategy.shutdown()


@pytest.fixture(scope="module")
def plain_logprobs(tiny_model_path):
    """The tiny model's logprobs of the test batch in plain transformers (the base)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    batch = make_batch(0, rows=4)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    return token_logprobs(logits, batch.input_ids, batch.attention_mask)


def _step(trainer: FsdpTrainStrategy) -> dict:
    batch = make_batch(0, rows=4)
    batch.old_logprobs = trainer.forward_logprobs(batch)
    batch.ref_logprobs = trainer.base_logprobs(batch)
    return trainer.train_step(batch, policy_loss(run_config().algorithm.loss_spec()))


def test_only_the_adapters_train(trainer):
    trainable = {name for name, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all(is_adapter(name) for name in trainable)
    in_optimizer = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in trainer.model.parameters() if p.requires_grad}


def test_a_step_changes_the_adapters_and_the_reference_stays_the_base(trainer, plain_logprobs):
    before = dict(trainer.export_weights())
    _step(trainer)
    _step(trainer)
    after = dict(trainer.export_weights())
    changed = {name for name in after if not torch.equal(after[name], before[name])}
    assert changed and all(is_adapter(name) for name in changed)
    batch = make_batch(0, rows=4)
    assert torch.equal(trainer.base_logprobs(batch), plain_logprobs)
    assert (trainer.forward_logprobs(batch) - plain_logprobs).abs().max() > 1e-3


def test_all_linear_on_a_mixture_of_experts_adapts_its_linear_layers_on_the_checkpoints_base(
    tiny_moe_path,
):
    """transformers 5's fused experts and router are parameters, not linear layers: PEFT's own
    all-linear wraps them too, and their base tensors' names then miss the checkpoint."""
    from transformers import AutoModelForCausalLM

    strategy = FsdpTrainStrategy(rd.get_platform(CPU))
    strategy.initialize(tiny_moe_path, trainer_settings("fsdp", lora=LORA))
    try:
        names = [name for name, _ in strategy.model.named_parameters() if is_adapter(name)]
        assert {name.split(".lora_")[0].rpartition(".")[2] for name in names} == {
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
        }
        batch = make_batch(0, rows=4)
        model = AutoModelForCausalLM.from_pretrained(tiny_moe_path, dtype=torch.float32)
        with torch.no_grad():
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        plain = token_logprobs(logits, batch.input_ids, batch.attention_mask)
        torch.testing.assert_close(strategy.base_logprobs(batch), plain, rtol=0, atol=1e-6)
    finally:
        strategy.shutdown()


def _connected(trainer, engine):
    platform = rd.get_platform(CPU)
    plan = plan_sync(platform, platform, colocated=False, same_node=True, forced="auto")
    sender = WeightSender(plan, platform, 1, weight_sync(verify=True))
    receiver = WeightReceiver(sender.endpoint, 1, platform)
    together(sender.connect, receiver.connect)
    return sender, receiver


def together(background, foreground):
    thread = threading.Thread(target=background)
    thread.start()
    result = foreground()
    thread.join()
    return result


def test_every_sync_carries_the_adapters_alone_into_the_hf_engine(trainer, tiny_model_path):
    """From the first sync on: the engine's base, loaded from the checkpoint, is the trainer's."""
    engine = HfStrategy(rd.get_platform(CPU))
    engine.use_adapters(trainer.settings.lora)
    engine.initialize(tiny_model_path, rollout_settings("hf", max_batch_size=8, update_bucket_bytes=65536))
    sender, receiver = _connected(trainer, engine)
    stats = []
    try:
        for version in (1, 2):
            _step(trainer)
            named = trainer.export_adapters(snapshot=False, to_rank=0)
            send = lambda named=named, version=version: sender.send(named, version)
            stats.append(together(send, lambda: receiver.receive(engine.update_weights)))
            assert engine.weights_hash() == weights_hash(trainer.export_weights())
    finally:
        together(sender.close, receiver.close)
    adapters = dict(trainer.export_adapters())
    model_bytes = sum(t.numel() * t.element_size() for _, t in trainer.export_weights())
    for sync in stats:
        assert sync.tensors == len(adapters) and sync.nbytes < model_bytes / 10
    batch = make_batch(1, rows=4)
    with torch.no_grad():
        logits = engine.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    served = token_logprobs(logits, batch.input_ids, batch.attention_mask)
    mask = batch.attention_mask.bool()
    assert (served - trainer.forward_logprobs(batch))[mask].abs().max() < 1e-5
    engine.shutdown()


@pytest.fixture(scope="module")
def saved(trainer, tmp_path_factory):
    """A checkpoint after one more step, with the adapters and Adam's state it holds."""
    _step(trainer)
    directory = tmp_path_factory.mktemp("lora-checkpoint") / "policy"
    trainer.save_checkpoint(str(directory))
    adam = {name: {k: v.clone() for k, v in s.items()} for name, s in _adam_state(trainer).items()}
    return directory, dict(trainer.export_adapters()), adam


def test_a_checkpoint_holds_the_adapters_and_their_optimizer_state(trainer, saved):
    directory, adapters, adam = saved
    _step(trainer)
    trainer.load_checkpoint(str(directory))
    restored = dict(trainer.export_adapters())
    assert all(torch.equal(restored[name], adapters[name]) for name in adapters)
    for name, entries in _adam_state(trainer).items():
        assert torch.equal(entries["exp_avg"], adam[name]["exp_avg"])


def test_export_writes_the_adapter_and_the_merged_model_with_equal_greedy_output(
    trainer, saved, tiny_model_path, tmp_path
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from roll_device.commands.export import write_model

    directory, _adapters, _adam = saved
    trainer.load_checkpoint(str(directory))  # the trainer's policy is the checkpoint's
    write_model(directory, tiny_model_path, tmp_path / "adapter")
    write_model(directory, tiny_model_path, tmp_path / "merged", merge=True)
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
    prompt = make_batch(2, rows=2).input_ids[:, :6]
    greedy = [
        m.generate(prompt, max_new_tokens=8, do_sample=False, min_new_tokens=8) for m in (adapted, merged)
    ]
    assert torch.equal(greedy[0], greedy[1])
    batch = make_batch(3, rows=2)
    with torch.no_grad():
        logits = merged(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    exported = token_logprobs(logits, batch.input_ids, batch.attention_mask)
    mask = batch.attention_mask.bool()
    assert (exported - trainer.forward_logprobs(batch))[mask].abs().max() < 1e-5


def _adam_state(trainer) -> dict[str, dict[str, torch.Tensor]]:
    names = {id(p): name for name, p in trainer.model.named_parameters()}
    return {
        names[id(p)]: {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in s.items()}
        for p, s in trainer.optimizer.state.items()
    }
