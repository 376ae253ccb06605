"""rl.collection_shards and settings.num_rollout_workers (nip_core/trainers/collectors.py).

The shard count is part of the experiment; the worker count only decides where the shards
are collected, so for a given shard count every worker count gives the same batches,
statistics, parameters and checkpoints.
"""

from __future__ import annotations

import pytest
import torch

from nip_core.runs import RunStore
from nip_core.trainers.collectors import InProcessCollector, ShardedCollector, shard_seed
from nip_core.trainers.vanilla_ppo import VanillaPpoTrainer
from tests.nip_core.trainers.gi_helpers import params_of, settings_for, tiny_params, tiny_scenario

# tiny_params: frames_per_batch 32, 4 steps per environment -> 8 parallel environments


def build(tmp_path, workers, shards=1, run_id="r"):
    hp = tiny_params(rl={"num_iterations": 2, "collection_shards": shards})
    settings = settings_for(tmp_path, run_id=run_id, num_rollout_workers=workers)
    run = RunStore(str(tmp_path)).open_run(run_id, hp)
    return VanillaPpoTrainer(hp, settings=settings, run=run, scenario_instance=tiny_scenario(hp, settings))


def train(trainer, start=0, stop=2):
    """Run iterations ``[start, stop)``; the collected rewards, final weights and logged stats."""
    rewards, stats = [], []
    collect, log_stats = trainer.train_collector.collect, trainer.log_stats

    def recording_collect(td):
        batch, td = collect(td)
        rewards.append(batch["next", "agents", "reward"].clone())
        return batch, td

    def recording_log_stats(values, iteration):
        stats.append({k: v for k, v in values.items() if not k.startswith("time_")})
        return log_stats(values, iteration)

    trainer.train_collector.collect = recording_collect
    trainer.log_stats = recording_log_stats
    try:
        trainer.run_iterations(start, stop)
    finally:
        trainer.close()
    return rewards, params_of(trainer), stats


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def assert_same_run(first, second, iterations=2):
    (rewards_a, params_a, stats_a), (rewards_b, params_b, stats_b) = first, second
    assert len(rewards_a) == len(rewards_b) == iterations
    assert all(torch.equal(a, b) for a, b in zip(rewards_a, rewards_b))
    assert len(stats_a) == len(stats_b) == iterations and stats_a == stats_b
    assert same(params_a, params_b)


@pytest.mark.slow
def test_one_worker_process_is_bit_identical_to_collecting_in_process(tmp_path):
    # (a trainer is built right before it trains: building seeds the global RNG)
    in_process = build(tmp_path / "a", 0)
    assert isinstance(in_process.train_collector, InProcessCollector)
    in_process_run = train(in_process)
    worker = build(tmp_path / "b", 1)
    assert isinstance(worker.train_collector, ShardedCollector)
    assert worker.train_collector.state_dict() is None  # one shard: the trainer's own RNG
    assert_same_run(in_process_run, train(worker))


def test_shards_run_in_process_with_their_own_seeds_and_leave_the_trainer_rng_alone(tmp_path):
    trainer = build(tmp_path, 0, shards=2)
    collector = trainer.train_collector
    assert isinstance(collector, ShardedCollector) and collector.num_workers == 0
    assert [e.base_env.num_envs for e in collector.shard_envs] == [4, 4]
    seeded = torch.Generator().manual_seed(shard_seed(trainer.hyper_params.seed, 1)).get_state()
    assert torch.equal(collector.torch_rngs[1], seeded)
    before = torch.get_rng_state()
    batch, td = collector.collect(trainer._carried_td)
    assert batch.batch_size == torch.Size([8, 4]) and td.batch_size == torch.Size([8])
    assert torch.equal(torch.get_rng_state(), before)  # the trainer's global RNG did not move
    assert not torch.equal(collector.torch_rngs[1], seeded)  # the shard's did
    # the state of a checkpoint: both shards' environment and torch RNG states
    state = collector.state_dict()
    assert len(state["env_rng"]) == len(state["torch_rng"]) == 2
    trainer.close()


@pytest.mark.slow
def test_two_shards_give_the_same_run_with_zero_one_or_two_workers(tmp_path):
    in_process = train(build(tmp_path / "w0", 0, shards=2))
    assert_same_run(in_process, train(build(tmp_path / "w2", 2, shards=2)))
    assert_same_run(in_process, train(build(tmp_path / "w1", 1, shards=2)))
    # the shard count is part of the experiment: one shard is a different sample
    one_shard_rewards = train(build(tmp_path / "s1", 0, shards=1), stop=1)[0]
    assert not torch.equal(one_shard_rewards[0], in_process[0][0])


@pytest.mark.slow
def test_a_run_checkpointed_with_two_workers_resumes_identically_in_process(tmp_path):
    straight = train(build(tmp_path / "a", 0, shards=2))
    first = build(tmp_path / "b", 2, shards=2)
    train(first, 0, 1)
    assert len(first.checkpoint_state()["collector"]["torch_rng"]) == 2
    resumed = build(tmp_path / "b", 0, shards=2)
    resumed_rewards, resumed_params, resumed_stats = train(resumed, 1, 2)
    assert torch.equal(resumed_rewards[0], straight[0][1])
    assert resumed_stats == straight[2][1:]
    assert same(resumed_params, straight[1])


def test_worker_count_must_divide_the_shard_count(tmp_path):
    with pytest.raises(ValueError, match=r"settings.num_rollout_workers \(3\) must be 0 or divide "
                                         r"rl.collection_shards \(4\)"):
        build(tmp_path / "a", 3, shards=4)
    with pytest.raises(ValueError, match=r"settings.num_rollout_workers \(2\) must be 0 or divide "
                                         r"rl.collection_shards \(1\)"):
        build(tmp_path / "b", 2)


def test_shard_count_must_divide_the_environments(tmp_path):
    with pytest.raises(ValueError, match=r"rl.collection_shards \(3\) must divide the number of parallel "
                                         r"environments \(8,"):
        build(tmp_path, 0, shards=3)


def test_a_checkpoint_of_another_shard_count_is_refused(tmp_path):
    trainer = build(tmp_path / "a", 0, shards=2)
    state = trainer.train_collector.state_dict()
    trainer.close()
    with pytest.raises(ValueError, match=r"collected with 1 shard\(s\), but rl.collection_shards is 2"):
        trainer.train_collector.load_state_dict(None)
    one_shard = build(tmp_path / "b", 0)
    with pytest.raises(ValueError, match=r"collected with 2 shards, but rl.collection_shards is 1"):
        one_shard.train_collector.load_state_dict(state)
    one_shard.close()
