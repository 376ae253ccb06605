"""settings.num_rollout_workers: collection in worker processes (nip_core/trainers/collectors.py)."""

from __future__ import annotations

import copy

import pytest
import torch

from nip_core.runs import RunStore
from nip_core.trainers.collectors import WorkerCollector, collect_shard
from nip_core.trainers.vanilla_ppo import VanillaPpoTrainer
from tests.nip_core.trainers.gi_helpers import params_of, settings_for, tiny_params, tiny_scenario


def build(tmp_path, workers, run_id="r", **rl):
    hp = tiny_params(rl={"num_iterations": 2, **rl})
    settings = settings_for(tmp_path, run_id=run_id, num_rollout_workers=workers)
    run = RunStore(str(tmp_path)).open_run(run_id, hp)
    return VanillaPpoTrainer(hp, settings, run=run, scenario_instance=tiny_scenario(hp, settings))


def train(trainer, start=0, stop=2):
    rewards = []
    collect = trainer.train_collector.collect

    def recording(td):
        batch, td = collect(td)
        rewards.append(batch["next", "agents", "reward"].clone())
        return batch, td

    trainer.train_collector.collect = recording
    try:
        trainer.run_iterations(start, stop)
    finally:
        trainer.close()
    return rewards, params_of(trainer)


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_one_worker_process_is_bit_identical_to_collecting_in_process(tmp_path):
    in_process_rewards, in_process = train(build(tmp_path / "a", 0))
    trainer = build(tmp_path / "b", 1)
    assert isinstance(trainer.train_collector, WorkerCollector)
    worker_rewards, worker = train(trainer)
    assert len(worker_rewards) == 2
    assert all(torch.equal(a, b) for a, b in zip(in_process_rewards, worker_rewards))
    assert same(in_process, worker)


@pytest.mark.slow
def test_two_workers_collect_their_fixed_shards_deterministically_and_resume_exactly(tmp_path):
    trainer = build(tmp_path / "a", 2)
    collector = trainer.train_collector
    # the reference: the two shards collected one after the other in this process
    td = trainer._carried_td
    reference = []
    for k, shard_env in enumerate(collector.shard_envs):
        size = td.batch_size[0] // 2
        request = {"state_dict": trainer.policy_operator.state_dict(), "td": td[k * size:(k + 1) * size],
                   "env_rng": shard_env.get_rng_state(), "torch_rng": collector.torch_rngs[k],
                   "steps": trainer.steps_per_env,
                   "precision": "fp32", "attention_backends": trainer.attention_backends}
        with torch.random.fork_rng(devices=[]):
            reference.append(collect_shard(copy.deepcopy(shard_env), copy.deepcopy(trainer.policy_operator),
                                           request)["batch"])
    rewards, straight = train(trainer)
    expected = torch.cat(reference, 0)["next", "agents", "reward"]
    assert torch.equal(rewards[0], expected)
    # the shards differ from single-shard collection (own seeds), and a resume is exact
    assert not torch.equal(rewards[0], train(build(tmp_path / "c", 0), stop=1)[0][0])
    first = build(tmp_path / "b", 2)
    train(first, 0, 1)
    resumed_rewards, resumed = train(build(tmp_path / "b", 2), 1, 2)
    assert torch.equal(resumed_rewards[0], rewards[1])
    assert same(straight, resumed)


def test_worker_count_must_divide_the_environments(tmp_path):
    with pytest.raises(ValueError, match="settings.num_rollout_workers \\(3\\) must divide"):
        build(tmp_path, 3)
