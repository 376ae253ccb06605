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


def build(cls, tmp_path, **rl):
    hp = tiny_params(rl={"num_iterations": 1, **rl})
    settings = settings_for(tmp_path, run_id="r")
    run = RunStore(str(tmp_path)).open_run("r", hp)
    return cls(hp, settings, run=run, scenario_instance=tiny_scenario(hp, settings))


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


POINTS = ("_get_loss_module_and_gae", "_get_optimizer_and_param_freezer", "_get_data_collectors",
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
    assert trainer.calls == ["_get_loss_module_and_gae", "_get_optimizer_and_param_freezer", "_get_data_collectors"]
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

    def _train_on_replay_buffer(self, replay_buffer, active):
        self.buffer_sizes = getattr(self, "buffer_sizes", []) + [len(replay_buffer)]
        return super()._train_on_replay_buffer(replay_buffer, active)


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
