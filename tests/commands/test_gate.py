"""Bad input is refused when the composed config is read into the run's typed configuration,
before Ray or any worker starts: one line that names the key, the value and what is allowed (no
Ray in these tests)."""

import json
import re
from pathlib import Path

import pytest
import ray
import yaml
from omegaconf import OmegaConf

from roll_device.cluster.submit import OUTPUTS_ENV, SUBMITTED_TO_ENV
from roll_device.commands.compose import compose
from roll_device.commands.gate import (
    check_before_start,
    check_checkpointed_roles,
    check_model,
    check_model_files,
    check_same_model,
    check_same_trainer,
    check_simulation,
    check_submitted_run_dir,
    load_config,
    read_config,
)
from roll_device.commands.run import run_checked
from roll_device.doctor.preflight import PreflightError
from roll_device.errors import ConfigError
from roll_device.pipeline.experiment import RUN_CONFIG_FILE
from roll_device.pipeline.run_plan import plan_here
from roll_device.pipeline.state import POLICY_DIR, Checkpoints, PipelineState

BAD_VALUES = [
    (
        ["+reward.kwargs.x=1"],
        "reward.kwargs={'x': 1} is for a user function, and reward.function=null takes none",
    ),
    (
        ["reward.function=math", "+reward.kwargs.x=1"],
        "reward.kwargs={'x': 1} is for a user function, and reward.function=math takes none",
    ),
    (["max_steps=abc"], "max_steps='abc': input should be a valid integer"),
    (
        ["max_steps=0"],
        "max_steps=0: input should be greater than or equal to 1 (a run needs at least one step)",
    ),
    (["max_steps=2.5"], "max_steps=2.5: input should be a valid integer"),
    (["save_every=abc"], "save_every='abc': input should be a valid integer"),
    (["save_every=-1"], "save_every=-1: input should be greater than or equal to 0"),
    (["seed=true"], "seed=True: input should be a valid integer"),
    # vLLM refused them in the rollout's worker, after the workers started
    (["seed=-1"], "seed=-1: input should be greater than or equal to 0 (from 0 to 2**32 - 1, the range vLLM"),
    (["rollout.seed=4294967296"], "rollout.seed=4294967296: input should be less than 4294967296 (from 0"),
    (["resume=maybe"], "resume='maybe': input should be True, False or 'latest_valid'"),
    (["trainer.lr=abc"], "trainer.lr='abc': input should be a valid number"),
    (["trainer.lr=-1"], "trainer.lr=-1: input should be greater than 0"),
    (
        ["trainer.micro_batch_size=0"],
        "trainer.micro_batch_size=0: input should be greater than or equal to 1 (rows per forward/backward)",
    ),
    (
        ["trainer.mixed_precision=fp16"],
        "trainer.mixed_precision='fp16': input should be 'bf16' or 'fp32' (null: bf16 where the kind",
    ),
    (["+trainer.momentum=0.9"], "unknown key trainer.momentum: the keys here are name, lr,"),
    (["trainer=megatron", "+trainer.zero_stage=1"], "unknown key trainer.zero_stage"),
    (
        ["trainer=megatron", "trainer.tensor_parallel=x"],
        "trainer.tensor_parallel='x': input should be a valid integer",
    ),
    (["data.prompts_per_step=0"], "data.prompts_per_step=0: input should be greater than or equal to 1"),
    (
        ["data.epochs=0"],
        "data.epochs=0: input should be greater than or equal to 1 (null cycles until max_steps)",
    ),
    (["data.eval_size=-1"], "data.eval_size=-1: input should be greater than or equal to 0"),
    (["data.format=csv"], "data.format='csv': input should be 'auto', 'jsonl', 'parquet' or 'arrow'"),
    (["+reward.weight=2"], "unknown key reward.weight: the keys here are function"),
    (["eval.size=0"], "eval.size=0: input should be greater than or equal to 1"),
    (["model.chat_template=maybe"], "model.chat_template='maybe': input should be a valid boolean"),
    (
        ["rollout=hf", "rollout.prefill_graphs=yes please"],
        "rollout.prefill_graphs='yes please': input should be",
    ),
    (["data.prompt_length=abc"], "data.prompt_length='abc': input should be a valid integer"),
    (["algorithm.temperature=-1"], "algorithm.temperature=-1: input should be greater than or equal to 0"),
    (["algorithm.clip_ratio=0"], "algorithm.clip_ratio=0: input should be greater than 0"),
    (["algorithm.name="], "algorithm.name='': string should have at least 1 character"),
    (["algorithm.kl_coef=-0.1"], "algorithm.kl_coef=-0.1: input should be greater than or equal to 0"),
    (["algorithm.ppo_epochs=0"], "algorithm.ppo_epochs=0: input should be greater than or equal to 1"),
    (["algorithm.mini_batches=0"], "algorithm.mini_batches=0: input should be greater than or equal to 1"),
    (
        ["algorithm.importance_correction=sometimes"],
        "algorithm.importance_correction='sometimes': input should be 'stale' or 'always'",
    ),
    (
        ["trainer.lr_schedule=cosine", "trainer.warmup_steps=30"],
        "trainer.warmup_steps=30 leaves no step of the cosine schedule's 30 optimizer steps",
    ),
    (["trainer.lr_schedule=linear"], "trainer.lr_schedule='linear': input should be 'constant' or 'cosine'"),
    (["trainer.min_lr_ratio=2"], "trainer.min_lr_ratio=2: input should be less than or equal to 1"),
    (
        ["algorithm.mini_batches=65"],
        (
            "algorithm.mini_batches=65 cuts the batch of 64 sequences into 65 parts, but each part needs a row "
            "for each of the 1 actor_train replicas: set mini_batches <= 64, or raise data.prompts_per_step"
        ),
    ),
    (
        [
            "algorithm=ppo",
            "algorithm.mini_batches=33",
            "roles.critic.num_devices=2",
            "roles.critic.colocate_with=null",
        ],
        "each part needs a row for each of the 2 critic replicas: set mini_batches <= 32",
    ),
    (["algorithm.max_new_tokens=many"], "algorithm.max_new_tokens='many': input should be a valid integer"),
    (
        ["algorithm.samples_per_prompt=1"],
        (
            "algorithm.samples_per_prompt=1: algorithm.advantage=grpo compares the samples of one prompt: "
            "use 2 or more (one sample a prompt suits gae, reinforce_pp)"
        ),
    ),
    (
        ["algorithm=dapo", "algorithm.samples_per_prompt=1"],
        "algorithm.samples_per_prompt=1: algorithm.dynamic_sampling=true compares the samples of one prompt",
    ),
    (
        ["algorithm.samples_per_prompt=0"],
        "algorithm.samples_per_prompt=0: input should be greater than or equal to 1",
    ),
    (
        ["+algorithm.discount=1"],
        "unknown key algorithm.discount: the keys here are name, samples_per_prompt,",
    ),
    (
        ["weight_sync.path=bogus"],
        "weight_sync.path='bogus' is not a path: choose one of auto, colocated, collective, bridge",
    ),
    (["weight_sync.timeout_s=0"], "weight_sync.timeout_s=0: input should be greater than 0"),
    (["weight_sync.bucket_bytes=lots"], "weight_sync.bucket_bytes='lots': input should be a valid integer"),
    (["weight_sync.verify=maybe"], "weight_sync.verify='maybe': input should be a valid boolean"),
    (["+weight_sync.retries=3"], "unknown key weight_sync.retries: the keys here are path,"),
    (["rollout.graph_mode=bogus"], "rollout.graph_mode='bogus': input should be 'NONE', 'PIECEWISE'"),
    (
        ["rollout.dtype=int8"],
        "rollout.dtype='int8': input should be 'auto', 'float32', 'bfloat16' or 'float16'",
    ),
    (
        ["rollout.gpu_memory_utilization=1.5"],
        "rollout.gpu_memory_utilization=1.5: input should be less than or equal to 1",
    ),
    (["rollout.max_num_seqs=0"], "rollout.max_num_seqs=0: input should be greater than or equal to 1"),
    (
        ["rollout.tensor_parallel_size=2"],
        (
            "roles.actor_infer.num_devices=1 is not a multiple of the 2 devices of one engine "
            "(rollout.tensor_parallel_size): set it to engines x 2"
        ),
    ),
    (
        ["rollout=hf", "rollout.max_batch_size=-2"],
        "rollout.max_batch_size=-2: input should be greater than or equal to 1",
    ),
    (["rollout=hf", "+rollout.max_num_seqs=4"], "unknown key rollout.max_num_seqs: the keys here are name,"),
    (
        ["rollout.logprobs_mode=raw"],
        "rollout.logprobs_mode='raw': input should be 'raw_logprobs' or 'processed_logprobs'",
    ),
    (
        ["roles.actor_infer.num_devices=two"],
        "roles.actor_infer.num_devices='two': input should be a valid integer",
    ),
    (
        ["+roles.actor_train.gpus=2"],
        "unknown key roles.actor_train.gpus: the keys here are device, num_devices,",
    ),
    (["model.tiny_hidden=16"], "model.tiny_hidden=16: input should be greater than or equal to 32"),
    (["cluster.cpu_per_worker=0"], "cluster.cpu_per_worker=0: input should be greater than 0"),
    (["cluster.num_cpus=abc"], "cluster.num_cpus='abc': input should be a valid integer"),
    (["cluster.resources={X:-1}"], "cluster.resources.X=-1: input should be greater than or equal to 0"),
    (["+max_step=3"], "unknown key max_step: the keys here are seed, max_steps, resume,"),
    (
        ["roles.reference.strategy=megatron"],
        "roles.reference.strategy='megatron' but the trainer section is fsdp's: choose trainer=megatron",
    ),
    (["max_steps=${nothing}"], "max_steps: Interpolation key 'nothing' not found"),
    (
        ["trainer=megatron", "trainer.pipeline_parallel=3"],
        "is not a multiple of trainer.tensor_parallel x trainer.pipeline_parallel = 1 x 3",
    ),
    (
        ["nosuchkey=1"],
        ("nosuchkey is not a key of the configuration: `roll-device run --cfg job` prints every key"),
    ),
    (
        ["rollout.temperature=0.5"],
        "rollout.temperature is not a key of the configuration: did you mean eval.temperature or algorithm.temperature?",
    ),
    (
        ["data.prompt_per_step=4"],
        "data.prompt_per_step is not a key of the configuration: did you mean data.prompts_per_step?",
    ),
    (
        ["rollout.env={CUDA_LAUNCH_BLOCKING:1}"],
        (
            "rollout.env.CUDA_LAUNCH_BLOCKING is not a key of the configuration: `roll-device run --cfg job` "
            "prints every key; a new key is added with +rollout.env.CUDA_LAUNCH_BLOCKING=VALUE"
        ),
    ),
    (
        ["cluster.runtime_env={pip: [x]}"],
        "cluster.runtime_env is not a key of this configuration but of cluster=remote: choose cluster=remote to set it",
    ),
    (
        ["cluster.nodes=[]"],
        "cluster.nodes is not a key of this configuration but of cluster=sim: choose cluster=sim to set it",
    ),
    (["trainer.lr=inf"], "trainer.lr=inf: input should be a finite number"),
    (["algorithm.clip_ratio=nan"], "algorithm.clip_ratio=nan: input should be a finite number"),
    (["roles.actor_train=null"], "roles.actor_train is missing: the GRPO pipeline needs it"),
    (
        ["roles.reward.strategy=model"],
        "roles.reward.strategy=model scores with a reward model: set reward.model_path to its directory",
    ),
    (["roles.reward.strategy=judge"], "roles.reward.strategy='judge' is unknown: choose rule, model"),
    (
        ["reward.model_path=/rm"],
        "reward.model_path=/rm is read by roles.reward.strategy=model, and the strategy is rule: set",
    ),
    (
        ["roles.reward.strategy=model", "reward.model_path=/rm", "reward.function=math"],
        "reward.function=math and the reward model reward.model_path=/rm both score responses: keep one",
    ),
    (
        ["experiment=agentic_game", "roles.reward.strategy=model", "reward.model_path=/rm"],
        (
            "roles.reward.strategy=model is single-turn only: with agentic.environment=guess_number set "
            "roles.reward.strategy=rule"
        ),
    ),
    (
        ["eval.samples_per_prompt=4"],
        "eval.samples_per_prompt=4 at eval.temperature=0 gives the same greedy response each time: set",
    ),
    (["eval.top_p=0"], "eval.top_p=0: input should be greater than 0"),
    (["eval.temperature=-1.0"], "eval.temperature=-1.0: input should be greater than or equal to 0"),
    (["reward.dtype=fp8"], "reward.dtype='fp8': input should be 'auto', 'float32', 'bfloat16' or 'float16'"),
    (["reward.micro_batch_size=0"], "reward.micro_batch_size=0: input should be greater than or equal to 1"),
    (
        ["experiment=nope"],
        "experiment=nope: no such option; choose one of agentic_game, agentic_tools, arithmetic_math, mixed_devices, moe, qwen05b_shapes,",
    ),
]


ALGORITHM_REFUSALS = [
    (
        ["algorithm.advantage=gae"],
        (
            "algorithm.advantage=gae needs a critic's values: configure roles.critic (algorithm=ppo does), or "
            "choose another algorithm.advantage"
        ),
    ),
    (
        ["algorithm=ppo", "algorithm.advantage=grpo", "algorithm.gamma=null", "algorithm.lam=null"],
        (
            "roles.critic is configured but algorithm.advantage=grpo does not use its values: set "
            "algorithm.advantage=gae, or roles.critic=null"
        ),
    ),
    (
        ["algorithm=rloo", "algorithm.gamma=0.99"],
        "algorithm.gamma applies to algorithm.advantage=gae only (got rloo): set algorithm.gamma=null",
    ),
    (
        ["algorithm.lam=0.95"],
        "algorithm.lam applies to algorithm.advantage=gae only (got grpo): set algorithm.lam=null",
    ),
    (["algorithm=ppo", "algorithm.value_clip=0"], "algorithm.value_clip=0: input should be greater than 0"),
    (
        ["algorithm.policy_loss=sapo"],
        "algorithm.policy_loss='sapo': unknown policy loss, choose one of cispo, gspo, ppo_clip",
    ),
    (
        ["algorithm.policy_loss=nope.mod:fn"],
        "algorithm.policy_loss='nope.mod:fn': cannot import 'nope.mod:fn'",
    ),
    (["algorithm.loss_agg=sum"], "algorithm.loss_agg='sum': choose one of token-mean, seq-mean-token-mean,"),
    (
        ["algorithm=ppo2"],
        "algorithm=ppo2: no such option; choose one of dapo, dr_grpo, grpo, gspo, ppo, reinforce_pp, rloo",
    ),
    (
        ["algorithm=rloo", "algorithm.norm_std=false"],
        "algorithm.norm_std=false applies to algorithm.advantage=grpo only (got rloo): set algorithm.norm_std=true",
    ),
    (
        ["algorithm=dr_grpo", "algorithm.std_unbiased=false"],
        "algorithm.std_unbiased=false applies to algorithm.advantage=grpo with algorithm.norm_std=true only",
    ),
    (
        ["algorithm=gspo", "algorithm.clip_ratio_c=3"],
        "algorithm.clip_ratio_c (the dual clip) applies to algorithm.policy_loss=ppo_clip only (got gspo)",
    ),
    (["algorithm.clip_ratio_c=1"], "algorithm.clip_ratio_c=1: input should be greater than 1"),
    (
        ["algorithm.kl_estimator=k4"],
        "algorithm.kl_estimator='k4': input should be 'k1', 'k2', 'k3' or 'low_var_kl'",
    ),
    (
        ["algorithm=reinforce_pp", "algorithm.kl_estimator=k2"],
        "algorithm.kl_estimator=k2 applies to the KL in the loss, but algorithm.kl_in_reward=true puts k1 in the reward",
    ),
    (
        ["algorithm=dapo", "algorithm.overlong_buffer=8"],
        "algorithm.overlong_buffer=8 must be below algorithm.max_new_tokens (8)",
    ),
    (
        ["algorithm.kl_in_reward=true", "algorithm.kl_coef=0"],
        "algorithm.kl_in_reward=true with algorithm.kl_coef=0 has no KL to put in the reward",
    ),
    (
        ["algorithm.kl_target=0.1", "algorithm.kl_coef=0"],
        "algorithm.kl_target=0.1 adapts a KL coefficient, but algorithm.kl_coef=0 runs without the reference",
    ),
    (
        ["trainer=megatron", "algorithm.entropy_coef=0.01"],
        "algorithm.entropy_coef=0.01 needs the entropy's gradient, but the megatron trainer's logprobs",
    ),
    (["algorithm.entropy_coef=-1"], "algorithm.entropy_coef=-1"),
    (
        ["algorithm.max_sampling_rounds=3"],
        "algorithm.max_sampling_rounds=3 refills the groups dynamic sampling drops, but algorithm.dynamic_sampling=false",
    ),
    (
        ["algorithm=dapo", "algorithm.max_staleness=1"],
        "algorithm.max_sampling_rounds=10 takes the prompts after the step's, which the overlapped rollouts",
    ),
    (["algorithm.kl_target=0"], "algorithm.kl_target=0: input should be greater than 0"),
    (
        ["algorithm=rloo", "algorithm.samples_per_prompt=1"],
        "algorithm.samples_per_prompt=1: algorithm.advantage=rloo compares the samples of one prompt",
    ),
]


@pytest.mark.parametrize("overrides, message", ALGORITHM_REFUSALS)
def test_an_algorithm_choice_that_does_not_apply_is_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("recipe", ["grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp", "ppo"])
@pytest.mark.parametrize("experiment", ["tiny_grpo", "arithmetic_math"])
def test_shipped_algorithm_recipes_pass_the_schema(recipe, experiment):
    algorithm = load_config([f"algorithm={recipe}", f"experiment={experiment}"]).algorithm
    assert algorithm.loss_spec().kl_coef == (0.0 if algorithm.kl_in_reward else algorithm.kl_coef)


def test_the_default_algorithm_is_grpo_with_the_unbiased_std():
    algorithm = load_config([]).algorithm
    assert (algorithm.advantage, algorithm.policy_loss, algorithm.loss_agg) == (
        "grpo",
        "ppo_clip",
        "token-mean",
    )
    assert algorithm.norm_std and algorithm.std_unbiased and algorithm.kl_coef == 0.01


@pytest.mark.parametrize("overrides, message", BAD_VALUES)
def test_each_bad_value_is_one_line_naming_key_value_and_choices(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(overrides)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "override, added",
    [
        ("nosuchkey=1", None),  # the top level takes no new keys: no hint to add it
        ("cluster.foo=1", None),
        ("rollout.env={CUDA_LAUNCH_BLOCKING:1}", "+rollout.env.CUDA_LAUNCH_BLOCKING=1"),
        ("experiment.tag=1", "+experiment.tag=1"),
    ],
)
def test_the_hint_to_add_a_key_is_given_only_where_the_key_is_read(override, added):
    with pytest.raises(ConfigError) as err:
        load_config([override])
    assert ("a new key is added with" in str(err.value)) == (added is not None)
    if added is not None:
        load_config([added])  # following the hint gives a configuration that reads


def test_a_simulated_npu_on_a_local_cluster_is_refused_with_the_sim_cluster_command(monkeypatch):
    # Before: ROLL_DEVICE=npu-sim roll-device run placed every role on the CPU without a word.
    monkeypatch.setenv("ROLL_DEVICE", "npu-sim")
    for command in ("run", "plan"):
        with pytest.raises(ConfigError) as refused:
            check_simulation(load_config([]), command)
        assert str(refused.value) == (
            "ROLL_DEVICE=npu-sim simulates npu devices in this process only: on cluster=local every role "
            "would run on this machine's CPU; to simulate a run on NPU nodes, use the sim cluster: "
            f"roll-device {command} experiment=mixed_devices cluster=sim"
        )
    check_simulation(load_config(["experiment=mixed_devices", "cluster=sim"]), "run")  # what it advises
    monkeypatch.delenv("ROLL_DEVICE")
    check_simulation(load_config([]), "run")  # the README's `roll-device run`: unaffected


@pytest.mark.parametrize(
    "experiment", ["tiny_grpo", "mixed_devices", "moe", "qwen2_5_7b_gpu8", "qwen2_5_7b_npu8"]
)
def test_shipped_experiments_pass_the_schema(experiment):
    load_config([f"experiment={experiment}"])


@pytest.mark.parametrize("resume", ["true", "false", "latest_valid"])
def test_resume_choices(resume):
    assert load_config([f"resume={resume}"]).resume == {"true": True, "false": False}.get(resume, resume)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "nonexistent", "does not exist: give a directory saved with save_pretrained"),
        (
            lambda p: (p / "weights.bin").write_bytes(b"x") and p / "weights.bin",
            "is a file, not a model directory",
        ),
        (lambda p: p, "has no config.json"),
        (lambda p: "''", "does not exist"),
        (
            lambda p: p / "qwen2.5-1.5b-shaped",
            r"does not exist: make it once with `roll-device make-tiny-model .*qwen2.5-1.5b-shaped --shapes qwen2.5-1.5b`",
        ),
    ],
)
def test_model_path_must_be_a_model_directory(tmp_path, make, message):
    config = load_config([f"model.path={make(tmp_path)}"])  # plan and submit accept paths of other machines
    with pytest.raises(ConfigError, match=message):
        check_model_files(config)


def test_the_shipped_shapes_experiment_without_its_model_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLL_DEVICE_HOME", str(tmp_path))
    config = load_config(["experiment=qwen05b_shapes"])
    made = f"`roll-device make-tiny-model {tmp_path / 'qwen2.5-0.5b-shaped'} --shapes qwen2.5-0.5b`"
    with pytest.raises(ConfigError, match=re.escape(made)):
        check_model_files(config)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.path=/nonexistent"], "model.path='/nonexistent' does not exist"),
        (["resume=true"], "resume=True but"),
        (["resume=latest_valid"], "holds no checkpoint: pass the run's directory with hydra.run.dir=<dir>"),
        (
            ["algorithm=ppo", "critic.model_path=/nonexistent"],
            "critic.model_path=/nonexistent holds no config.json: give a Hugging Face model directory",
        ),
        (
            ["roles.reward.strategy=model", "reward.model_path=/nonexistent"],
            "reward.model_path=/nonexistent does not exist: give a reward model saved with save_pretrained",
        ),
    ],
)
def test_files_and_resume_state_are_refused_before_ray(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run_checked(load_config([*overrides]), tmp_path / "run")
    assert not ray.is_initialized(), "no cluster was started"
    assert not (tmp_path / "run").exists(), "nothing was written"
    assert not (tmp_path / "tiny").exists(), "no model was made"


MEGATRON_PP3 = [
    "trainer=megatron",
    "trainer.pipeline_parallel=3",
    "roles.actor_train.num_devices=3",
    "algorithm.kl_coef=0",
    "data.prompts_per_step=3",
]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (MEGATRON_PP3, "pipeline_parallel=3 must divide the model's num_hidden_layers (2)"),
        (
            ["rollout.kv_cache_bytes=4096"],
            "rollout.kv_cache_bytes=4096 holds 4 tokens of this model's KV cache",
        ),
        (
            ["rollout.max_model_len=512", "algorithm.max_new_tokens=300"],
            "rollout.max_model_len=512 exceeds the model's max_position_embeddings (256",
        ),
        (
            ["trainer.attn_implementation=flash"],  # transformers refused it in the trainer's worker
            "trainer.attn_implementation=flash is not an attention kernel transformers knows: choose one of eager,",
        ),
    ],
    ids=["megatron-layout", "kv-cache", "positions", "attention"],
)
def test_settings_the_model_cannot_take_are_refused_before_ray(tmp_path, tiny_model_path, overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        run_checked(load_config([f"model.path={tiny_model_path}", *overrides]), tmp_path / "run")
    assert not ray.is_initialized()


def test_on_a_remote_cluster_the_default_kv_cache_counts_for_a_role_that_names_its_kind(tmp_path):
    """Before a remote cluster is reached, `auto` says nothing of the kind: only a role that names
    the CPU is held to the CPU engine's default KV cache (256 MiB; this model in the default float32:
    512 KiB a token)."""
    geometry = {
        "num_hidden_layers": 64,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "hidden_size": 1024,
    }
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", **geometry}))
    remote = ["cluster=remote", "cluster.address=192.0.2.1:6379", "rollout.max_model_len=2048"]
    check_model(load_config(remote), str(tmp_path), None)
    with pytest.raises(ConfigError, match=r"^the KV cache of an engine on cpu \(256 MiB"):
        check_model(load_config([*remote, "roles.actor_infer.device=cpu"]), str(tmp_path), None)


def _resumable(tmp_path, *overrides: str):
    """A run directory whose saved configuration (as a run writes it) has `overrides`."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    saved = load_config(list(overrides)).model_dump(mode="json")
    (run_dir / RUN_CONFIG_FILE).write_text(yaml.safe_dump(saved))
    return run_dir


@pytest.mark.parametrize(
    "saved, now, message",
    [
        (
            [],
            ["trainer=megatron"],
            "checkpoints were written by trainer=fsdp, which trainer=megatron cannot read",
        ),
        (
            ["trainer=megatron"],
            [
                "trainer=megatron",
                "trainer.tensor_parallel=2",
                "roles.actor_train.num_devices=2",
                "algorithm.kl_coef=0",
            ],
            (
                "written with trainer.tensor_parallel x trainer.pipeline_parallel = 1 x 1, this run has "
                "trainer.tensor_parallel x trainer.pipeline_parallel = 2 x 1"
            ),
        ),
        (
            ["trainer.lora.rank=8"],
            [],
            (
                "written with trainer.lora.rank=8 and trainer.lora.target_modules=all-linear, this run has "
                "trainer.lora.rank=null"
            ),
        ),
        (
            ["trainer.lora.rank=8"],
            ["trainer.lora.rank=16"],
            (
                "written with trainer.lora.rank=8 and trainer.lora.target_modules=all-linear, this run has "
                "trainer.lora.rank=16 and"
            ),
        ),
    ],
)
def test_a_resumed_run_keeps_the_trainer_that_wrote_its_checkpoints(tmp_path, saved, now, message):
    run_dir = _resumable(tmp_path, *saved)
    with pytest.raises(ConfigError) as refused:
        check_same_trainer(load_config(["resume=true", *now]), run_dir)
    assert message in str(refused.value) and "hydra.run.dir" in str(refused.value)
    check_same_trainer(load_config(["resume=true", *saved]), run_dir)  # the same trainer resumes


def test_a_run_folder_saved_before_the_learning_rate_schedule_keys_still_has_its_trainer_checked(tmp_path):
    run_dir = _resumable(tmp_path)
    saved = yaml.safe_load((run_dir / RUN_CONFIG_FILE).read_text())
    for key in ("lr_schedule", "min_lr_ratio", "schedule_steps"):
        del saved["trainer"][key]
    (run_dir / RUN_CONFIG_FILE).write_text(yaml.safe_dump(saved))
    with pytest.raises(ConfigError, match="checkpoints were written by trainer=fsdp"):
        check_same_trainer(load_config(["resume=true", "trainer=megatron"]), run_dir)


def test_a_resumed_run_keeps_the_model_its_checkpoints_were_written_from(
    tmp_path, tiny_model_path, tiny_moe_path
):
    """The mistake: resuming an experiment=moe run without experiment=moe (the default tiny model)."""
    run_dir = _resumable(tmp_path, "experiment=moe")
    with pytest.raises(ConfigError) as refused:
        check_same_model(load_config(["resume=true"]), tiny_model_path, run_dir)
    message = str(refused.value)
    assert message.startswith(
        f"resume=True: {run_dir}'s checkpoints are of the model at {tiny_moe_path}; this run's, at "
        f"{tiny_model_path}, differs (model_type qwen3_moe -> qwen2, "
    )
    assert (
        message.endswith("or start afresh in another directory (hydra.run.dir=...)") and "\n" not in message
    )
    check_same_model(load_config(["resume=true", "experiment=moe"]), tiny_moe_path, run_dir)
    moved = tmp_path / "moved"  # the same model elsewhere resumes
    moved.mkdir()
    (moved / "config.json").write_text((Path(tiny_moe_path) / "config.json").read_text())
    check_same_model(load_config(["resume=true", f"model.path={moved}"]), str(moved), run_dir)


def test_a_ppo_run_does_not_resume_from_a_checkpoint_without_its_critic(tmp_path):
    checkpoints = Checkpoints(tmp_path / "run")
    staging = checkpoints.staging_dir(2)
    (staging / POLICY_DIR).mkdir()
    written = checkpoints.commit(staging, PipelineState(step=2))
    check_checkpointed_roles(load_config(["resume=true"]), written)  # GRPO restores its policy alone
    with pytest.raises(ConfigError) as refused:
        check_checkpointed_roles(load_config(["resume=true", "algorithm=ppo"]), written)
    assert str(refused.value) == (
        f"resume=True: {written} holds no critic/ for roles.critic (the run that wrote it had no critic): "
        "resume with roles.critic=null, or start a new run"
    )
    (written / "critic").mkdir()
    check_checkpointed_roles(load_config(["resume=true", "algorithm=ppo"]), written)


def test_what_the_local_kind_lacks_is_refused_before_ray_and_the_run_folder(tmp_path):
    config = load_config(["rollout=hf", "rollout.prefill_graphs=true", "roles.actor_infer.device=cpu"])
    with pytest.raises(
        PreflightError, match="rollout.prefill_graphs=true but kind 'cpu' has no device graphs"
    ):
        check_before_start(config, tmp_path / "run", plan_here(config))
    assert not (tmp_path / "run").exists() and not ray.is_initialized()


def test_a_submitted_run_outside_rays_copy_of_the_checkout_only(tmp_path, monkeypatch):
    """A submitted job (`ROLL_DEVICE_SUBMITTED_TO`, set by `submit`) runs in Ray's temporary copy of
    the checkout: a relative run directory, which would lie in it, is refused before anything."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(SUBMITTED_TO_ENV, "http://head:8265")
    with pytest.raises(ConfigError, match=re.escape("hydra.run.dir=runs/a is relative, and a submitted job")):
        run_checked(load_config(["max_steps=1"]), Path("runs/a"))
    assert not (tmp_path / "runs").exists(), "nothing was written"
    check_submitted_run_dir(tmp_path / "run")  # absolute: the head's own folder
    monkeypatch.delenv(SUBMITTED_TO_ENV)
    check_submitted_run_dir(Path("runs/a"))  # a local run: relative to where it starts


@pytest.mark.parametrize("outputs, folder", [(None, "outputs"), ("/shared/runs", "/shared/runs")])
def test_runs_go_under_roll_device_outputs_when_it_is_set(monkeypatch, outputs, folder):
    if outputs is None:
        monkeypatch.delenv(OUTPUTS_ENV, raising=False)
    else:
        monkeypatch.setenv(OUTPUTS_ENV, outputs)
    run_dir = Path(compose([], with_hydra=True).hydra.run.dir)
    assert run_dir.parent.parent == Path(folder), "<outputs>/<date>/<time>"


def _numbers(values: dict, prefix: str = "") -> list[str]:
    """The keys under `values` whose value is a number (not a bool)."""
    found = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            found += _numbers(value, f"{path}.")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            found.append(path)
    return found


@pytest.mark.parametrize("base", [[], ["algorithm=ppo", "experiment=agentic_tools"], ["algorithm=dapo"]])
def test_a_number_key_refuses_a_bool(base):
    """`trainer.lr=true` is a slip, not 1.0: every numeric key of the shipped configs refuses a bool."""
    values = OmegaConf.to_container(compose(base), resolve=True)
    numbers = _numbers(values)
    assert "trainer.lr" in numbers and "algorithm.temperature" in numbers
    for key in numbers:
        cfg = OmegaConf.create(values)
        OmegaConf.update(cfg, key, True)
        with pytest.raises(ConfigError, match=re.escape(f"{key}=True: input should be a valid")):
            read_config(cfg)


@pytest.mark.parametrize("recipe", ["ppo", "reinforce_pp"])
def test_one_sample_a_prompt_is_taken_where_no_estimator_compares_samples(recipe):
    assert (
        load_config([f"algorithm={recipe}", "algorithm.samples_per_prompt=1"]).algorithm.samples_per_prompt
        == 1
    )
