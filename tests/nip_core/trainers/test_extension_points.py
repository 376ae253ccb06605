"""TensorDictRlTrainer's extension points: a guide-built TorchRL loss drops in; the loop calls every hook."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict
from tensordict.utils import NestedKey
from torchrl.objectives import LossModule, ValueEstimators
from torchrl.objectives.value import GAE

from nip_core.agents.distributions import joint_log_prob_and_entropy
from nip_core.runs import RunStore
from nip_core.trainers.progress import attach_progress_bar
from nip_core.trainers.vanilla_ppo import VanillaPpoTrainer
from tests.nip_core.trainers.gi_helpers import params_of, settings_for, tiny_params, tiny_scenario


class MinimalPpoLoss(LossModule):
    """A PPO-clip loss written as nip's guide describes: plain ``LossModule``, no ``backward``."""

    @dataclass
    class _AcceptedKeys:
        advantage: NestedKey = ("agents", "advantage")
        value_target: NestedKey = ("agents", "value_target")
        value: NestedKey = ("agents", "value")
        reward: NestedKey = ("agents", "reward")
        done: NestedKey = ("agents", "done")
        terminated: NestedKey = ("agents", "terminated")
        sample_log_prob: NestedKey = ("agents", "sample_log_prob")

    default_keys = _AcceptedKeys
    default_value_estimator = ValueEstimators.GAE

    def __init__(self, agents, message_key: str, clip: float = 0.2):
        super().__init__()
        self.agents = agents
        self.message_key = message_key
        self.clip = clip

    def _forward_value_estimator_keys(self, **kwargs) -> None:
        if self._value_estimator is not None:
            keys = self.tensor_keys
            self._value_estimator.set_keys(advantage=keys.advantage, value_target=keys.value_target,
                                           value=keys.value, reward=keys.reward, done=keys.done,
                                           terminated=keys.terminated)

    def make_value_estimator(self, value_type=None, **hyperparams):
        if value_type != ValueEstimators.GAE:
            raise NotImplementedError(value_type)
        self.value_type = value_type
        self._value_estimator = GAE(value_network=None, **hyperparams)
        self._forward_value_estimator_keys()
        return self

    def forward(self, td):
        message_logits, decision_logits, values = self.agents.policy_and_value(td)
        log_prob, entropy = joint_log_prob_and_entropy(message_logits, decision_logits,
                                                       td["agents", self.message_key], td["agents", "decision"])
        ratio = (log_prob - td[self.tensor_keys.sample_log_prob]).exp()
        advantage = td[self.tensor_keys.advantage].squeeze(-1)
        surrogate = torch.minimum(ratio * advantage, ratio.clamp(1 - self.clip, 1 + self.clip) * advantage)
        critic = (values - td[self.tensor_keys.value_target]).pow(2).mean()
        return TensorDict({"loss_objective": -surrogate.mean(), "loss_critic": critic,
                           "entropy": entropy.mean().detach()}, batch_size=[])


class GuideLossTrainer(VanillaPpoTrainer):
    def _get_loss_module_and_gae(self):
        loss = MinimalPpoLoss(self.agents, self.message_key)
        loss.make_value_estimator(ValueEstimators.GAE, gamma=self.hyper_params.rl.gamma,
                                  lmbda=self.hyper_params.rl.lmbda)
        return loss, loss.value_estimator


def build(cls, tmp_path, top=None, **rl):
    hp = tiny_params(rl={"num_iterations": 1, **rl}, **(top or {}))
    settings = settings_for(tmp_path, run_id="r")
    run = RunStore(str(tmp_path)).open_run("r", hp)
    return cls(hp, settings=settings, run=run, scenario_instance=tiny_scenario(hp, settings))


def test_a_plain_torchrl_loss_without_backward_trains(tmp_path):
    trainer = build(GuideLossTrainer, tmp_path)
    assert not hasattr(trainer.loss_module, "backward")
    before = params_of(trainer)
    trainer.run_iterations(0, 1)
    after = params_of(trainer)
    for prefix in ("policy_body.verifier", "policy_head.prover", "value_head.verifier"):
        assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith(prefix)), prefix
    row = trainer.run.read_metrics()[0]
    assert {"loss_objective", "loss_critic", "entropy"} <= set(row)  # the mean loss entries are logged


POINTS = ("_add_normalization_transforms", "_build_operators", "_get_loss_module_and_gae",
          "_get_optimizer_and_param_freezer", "_get_data_collectors",
          "_get_replay_buffer", "_build_train_context", "_build_test_context", "_run_train_loop",
          "_run_test_loop", "_train_on_replay_buffer", "_get_log_stats")


def recording(name):
    def method(self, *args, **kwargs):
        self.calls.append(name)
        return getattr(VanillaPpoTrainer, name)(self, *args, **kwargs)
    return method


class RecordingTrainer(VanillaPpoTrainer):
    locals().update({name: recording(name) for name in POINTS})

    def __init__(self, *args, **kwargs):
        self.calls = []
        super().__init__(*args, **kwargs)


def test_the_default_loop_calls_every_extension_point(tmp_path):
    trainer = build(RecordingTrainer, tmp_path, num_iterations=2, num_test_iterations=1)
    assert trainer.calls == ["_add_normalization_transforms", "_build_operators", "_get_loss_module_and_gae",
                             "_get_optimizer_and_param_freezer", "_get_data_collectors"]
    trainer.calls.clear()
    trainer.train()
    per_iteration = ["_get_replay_buffer", "_train_on_replay_buffer", "_get_log_stats"]
    assert trainer.calls == (["_build_train_context", "_run_train_loop"] + 2 * per_iteration
                             + ["_build_test_context", "_run_test_loop", "_get_log_stats"])


class Overriding(VanillaPpoTrainer):
    """Overrides change what the loop does: extra stats, an extra train context, a smaller buffer."""

    def _get_log_stats(self, rollouts, mean_loss_vals=None, *, train=True):
        stats = super()._get_log_stats(rollouts, mean_loss_vals, train=train)
        stats["num_frames"] = float(rollouts.numel())
        return stats

    def _build_train_context(self, stack):
        contexts = super()._build_train_context(stack)
        self.grad_enabled_in_loop = torch.is_grad_enabled()
        stack.enter_context(torch.autograd.set_detect_anomaly(False))
        return contexts

    def _build_test_context(self, stack):
        contexts = super()._build_test_context(stack)
        self.eval_mode_in_test = not self.agents.training
        return contexts

    def _train_on_replay_buffer(self):  # nip's signature: the buffer is self.replay_buffer
        self.buffer_sizes = getattr(self, "buffer_sizes", []) + [len(self.replay_buffer)]
        return super()._train_on_replay_buffer()


def test_overrides_take_effect(tmp_path):
    trainer = build(Overriding, tmp_path, num_iterations=2)
    trainer.train()
    rows = trainer.run.read_metrics()
    assert [r["num_frames"] for r in rows if r["kind"] == "train"] == [32.0, 32.0]
    assert [r["num_frames"] for r in rows if r["kind"] == "test"] == [32.0]
    assert trainer.buffer_sizes == [32, 32]
    assert trainer.grad_enabled_in_loop and trainer.eval_mode_in_test
    assert trainer.agents.training  # the test context put the train mode back


def test_the_replay_buffer_hands_minibatches_on_the_trainers_device(tmp_path):
    # torchrl's LazyTensorStorage keeps its data on the CPU unless told otherwise: a CUDA
    # trainer got CPU minibatches and failed with a device mismatch in the first update
    # (found on an H200). "meta" stands in for a device other than the CPU here.
    trainer = build(VanillaPpoTrainer, tmp_path)
    trainer.settings = trainer.settings.model_copy(update={"device": "meta"})
    buffer = trainer._get_replay_buffer()
    buffer.extend(TensorDict({"obs": torch.zeros(32, 3)}, batch_size=[32]))
    assert buffer.sample()["obs"].device.type == "meta"


def test_nipflows_losses_sample_minibatches_without_the_next_step_and_a_foreign_loss_gets_it(tmp_path):
    """The update's minibatches: nipflow's loss modules read nothing under "next" (the advantages are
    in by then), so the buffer leaves it out; a loss module from elsewhere gets the whole batch."""
    for cls, has_next in ((VanillaPpoTrainer, False), (GuideLossTrainer, True)):
        trainer = build(cls, tmp_path / cls.__name__)
        trainer.run_iterations(0, 1)
        minibatch = trainer.replay_buffer.sample()
        assert ("next" in minibatch.keys()) is has_next, cls.__name__
        assert {"x", "adjacency", ("agents", "advantage"), ("agents", "sample_log_prob")} <= set(
            minibatch.keys(include_nested=True, leaves_only=True))


class GuideLoops(VanillaPpoTrainer):
    """The loops overridden with the guide's signatures: ``(self, iteration_context)``."""

    @attach_progress_bar(lambda self: self.hyper_params.rl.num_iterations)
    def _run_train_loop(self, iteration_context):
        iteration_context.set_description("Training")
        self.train_contexts = getattr(self, "train_contexts", []) + [(iteration_context.total,
                                                                      self._memory_iteration)]
        return super()._run_train_loop(iteration_context=iteration_context)

    @attach_progress_bar(lambda self: self.hyper_params.rl.num_test_iterations)
    def _run_test_loop(self, iteration_context):
        iteration_context.set_description("Testing")
        self.test_contexts = getattr(self, "test_contexts", []) + [iteration_context.total]
        return super()._run_test_loop(iteration_context=iteration_context)


def test_loops_overridden_with_the_guides_signature_run_in_train_and_in_iteration_ranges(tmp_path):
    trainer = build(GuideLoops, tmp_path, num_iterations=3, num_test_iterations=1)
    trainer.run_iterations(0, 2)  # the range an RL block trains
    assert trainer._memory_iteration == 2 and trainer.train_contexts == [(3, 0)]
    trainer.train()  # resumes at iteration 2, then tests
    assert trainer._memory_iteration == 3 and trainer.train_contexts == [(3, 0), (3, 2)]
    assert trainer.test_contexts == [1]
    assert [r["iteration"] for r in trainer.run.read_metrics() if r["kind"] == "train"] == [0, 1, 2]


class NipMethods(VanillaPpoTrainer):
    """nip's ``_train_and_test``, ``_pretrain_agents`` and ``_get_metadata``, overridden."""

    def _train_and_test(self):
        self.order = getattr(self, "order", []) + ["train_and_test"]
        super()._train_and_test()

    def _pretrain_agents(self):
        self.order = getattr(self, "order", []) + ["pretrain"]
        super()._pretrain_agents()

    def _get_metadata(self):
        return {**super()._get_metadata(), "lab": "nip"}


def test_nips_train_and_test_pretrain_and_metadata_hooks_are_used(tmp_path):
    trainer = build(NipMethods, tmp_path, top={"pretrain_agents": True}, num_iterations=1, num_test_iterations=1)
    assert (trainer.num_agents, trainer.max_message_rounds) == (2, trainer.protocol_handler.max_message_rounds)
    trainer.train()
    assert trainer.order == ["train_and_test", "pretrain"]
    assert [r["kind"] for r in trainer.run.read_metrics()] == ["pretrain", "train", "test"]
    manifest = trainer.run.read_json("checkpoints/iter_000001.json")
    assert manifest["metadata"]["lab"] == "nip" and manifest["metadata"]["package_name"] == "nipflow"
    assert manifest["metadata"]["git_sha"] is None or len(manifest["metadata"]["git_sha"]) == 40


class TorchRLCollectors(VanillaPpoTrainer):
    """``_get_data_collectors`` returning TorchRL's own collectors, as nip's trainers do."""

    def _get_data_collectors(self):
        from torchrl.collectors import Collector

        self.made = [Collector(env, self.policy_operator, frames_per_batch=self.frames_per_batch, total_frames=-1,
                               auto_register_policy_transforms=False)
                     for env in (self.train_env, self.test_env)]
        return tuple(self.made)


def test_torchrl_collectors_returned_by_an_override_collect_the_batches(tmp_path):
    trainer = build(TorchRLCollectors, tmp_path, num_iterations=2, num_test_iterations=1)
    assert [c.collector for c in (trainer.train_collector, trainer.test_collector)] == trainer.made
    trainer.train()
    rows = trainer.run.read_metrics()
    assert [r["kind"] for r in rows] == ["train", "train", "test"]
    assert all("verifier.mean_step_reward" in r and "loss_objective" in r for r in rows[:2])
    # the TorchRL collectors ran: their frame counters moved (two train batches, one test batch)
    assert [c._frames for c in trainer.made] == [2 * trainer.frames_per_batch, trainer.frames_per_batch]
    assert trainer.run.exists("checkpoints/iter_000002.json")
    trainer.close()
