"""Trainer parameter groups (``rl``, ``ppo``, ``spg``, ``reinforce``, ``solo_agent``, text RL)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from nip_core.parameters.base import BaseRunPreserve, ParamsModel, unsupported_field


class RlTrainerParameters(ParamsModel):
    """Common RL settings; pure-text trainers use ``num_iterations``, ``rollouts_per_iteration``,
    ``frames_per_batch`` and ``num_test_iterations`` too."""

    frames_per_batch: int | None = Field(
        1000, gt=0, description="TensorDict trainers: environment steps collected per iteration, a multiple "
                                "of the steps per environment (None: from rollouts_per_iteration, else the "
                                "dataset size); text trainers use it as rollouts per iteration when "
                                "rollouts_per_iteration is None.")
    rollouts_per_iteration: int | None = Field(
        None, gt=0, description="Episodes (datapoints) rolled out per iteration: text trainers' batch; "
                                "TensorDict trainers use it when frames_per_batch is None.")
    steps_per_env_per_iteration: int | None = Field(
        None, gt=0, description="TensorDict trainers: steps each parallel environment takes per iteration "
                                "(None: the protocol's max_message_rounds).")
    collection_shards: int = Field(
        1, ge=1, description="TensorDict trainers: number of independent shards of the parallel episodes "
                             "(contiguous slices), each with its own environment seed and action-sampling "
                             "generator derived from (seed, shard). Part of the experiment: like "
                             "frames_per_batch it changes the sample (settings.num_rollout_workers only "
                             "distributes the shards and never changes results). Must divide the number of "
                             "parallel environments (frames_per_batch / steps per environment); 1: a single "
                             "stream from the trainer's own environment and global RNG.")
    num_iterations: int = Field(1000, ge=0, description="Training iterations (collect, then update or "
                                                        "fine-tune) of the RL and text trainers.")
    num_epochs: int = Field(4, gt=0, description="TensorDict trainers: passes over each iteration's batch "
                                                 "in the update.")
    minibatch_size: int = Field(64, gt=0, description="TensorDict trainers: steps per minibatch of the "
                                                      "update (capped at the batch size).")
    lr: float = Field(0.003, ge=0.0, description="TensorDict trainers: base learning rate, scaled by the "
                                                 "agents' learning-rate factors.")
    anneal_lr: bool = Field(False, description="TensorDict trainers: decay the learning rates linearly to 0 "
                                               "over num_iterations.")
    max_grad_norm: float = Field(1.0, gt=0.0, description="TensorDict trainers: clip the gradients' global "
                                                          "norm to this value (> 0).")
    loss_critic_type: Literal["smooth_l1", "l1", "l2"] = Field(
        "smooth_l1", description="TensorDict trainers: loss of the value head against its target.")
    clip_value: bool | float = Field(False, description="TensorDict trainers: clip the value update like "
                                                        "the policy (True: by ppo.clip_epsilon, a float: by "
                                                        "that value; False: no clipping).")
    normalize_observations: bool = Field(True, description="TensorDict trainers: normalise each observation "
                                                           "key by its mean and standard deviation, "
                                                           "estimated from random rollouts before training.")
    num_normalization_steps: int = Field(
        1000, gt=0, description="TensorDict trainers: environment steps used to estimate the observation "
                                "statistics (10 in test runs).")
    gamma: float = Field(0.9, ge=0.0, le=1.0, description="TensorDict trainers: discount factor of the "
                                                          "returns, 0 to 1.")
    lmbda: float = Field(0.95, ge=0.0, le=1.0, description="TensorDict trainers: λ of generalised advantage "
                                                           "estimation, 0 to 1.")
    use_shared_body: bool = Field(True, description="TensorDict trainers with a critic: actor and critic "
                                                    "share one body (without a critic the body is always "
                                                    "shared).")
    num_test_iterations: Annotated[int, BaseRunPreserve("rerun_tests")] = Field(
        10, ge=0, description="Test loop after training: batches collected without training (TensorDict "
                              "trainers), or passes over the test set (text trainers); 0 skips it.")
    optimizer: Literal["adam", "adamw", "sgd", "rmsprop", "adagrad"] = Field(
        "adam", description="TensorDict trainers' optimiser (the original always used Adam)")
    optimizer_eps: float = Field(1e-5, gt=0.0, description="eps of adam, adamw, rmsprop and adagrad")
    betas: tuple[float, float] = Field((0.9, 0.999), description="adam/adamw moment decay rates")
    momentum: float = Field(0.0, ge=0.0, lt=1.0,
                            description="momentum of the sgd and rmsprop optimisers, in [0, 1)")
    weight_decay: float = Field(0.0, ge=0.0, description="weight decay (decoupled for adamw, L2 otherwise)")
    gradient_accumulation_steps: int = Field(
        1, gt=0, description="minibatches whose gradients are averaged into one optimiser step")
    precision: Literal["fp32", "bf16", "auto"] = Field(
        "fp32", description="TensorDict trainers' agent arithmetic: fp32, or bf16 mixed precision (bf16 "
                            "autocast of the agents' forward passes; fp32 weights, optimiser, log-probs, "
                            "ratios and losses), or auto: what a GI iteration measured fastest on this kind "
                            "of device (today fp32 on every CPU and GPU, docs/performance.md); the run's "
                            "metadata and result card say which and why")
    test_greedy: Annotated[bool, BaseRunPreserve("rerun_tests")] = Field(
        False, description="test loop: take each agent's most likely action instead of sampling")

    @model_validator(mode="after")
    def _optimizer_arguments(self) -> "RlTrainerParameters":
        if self.momentum and self.optimizer not in ("sgd", "rmsprop"):
            raise ValueError(f"momentum is an argument of sgd and rmsprop, not of optimizer='{self.optimizer}'")
        if tuple(self.betas) != (0.9, 0.999) and self.optimizer not in ("adam", "adamw"):
            raise ValueError(f"betas are an argument of adam and adamw, not of optimizer='{self.optimizer}'")
        if self.optimizer == "sgd" and self.optimizer_eps != 1e-5:
            raise ValueError("optimizer_eps is not an argument of sgd")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must lie in [0, 1), got {tuple(self.betas)}")
        return self


class CommonPpoParameters(ParamsModel):
    loss_type: Literal["clip", "kl_penalty"] = Field(
        "clip", description="PPO objective: the clipped surrogate ('clip') or the adaptive KL penalty "
                            "('kl_penalty').")
    clip_epsilon: float = Field(0.2, gt=0.0, description="Clipping range ε of the probability ratio (clip "
                                                         "loss; also the value clip when rl.clip_value is "
                                                         "True).")
    kl_target: float = Field(0.01, gt=0.0, description="KL penalty loss: the KL divergence per update that "
                                                       "the adaptive β aims at.")
    kl_beta: float = Field(1.0, ge=0.0, description="KL penalty loss: initial coefficient β of the KL term.")
    kl_decrement: float = Field(0.5, gt=0.0, description="KL penalty loss: factor applied to β when the KL "
                                                         "is below kl_target / 1.5.")
    kl_increment: float = Field(2.0, gt=0.0, description="KL penalty loss: factor applied to β when the KL "
                                                         "is above 1.5 x kl_target.")
    critic_coef: float = Field(1.0, ge=0.0, description="Weight of the value loss in the total loss (PPO "
                                                        "and SPG).")
    entropy_eps: float = Field(0.001, ge=0.0, description="Weight of the entropy bonus in the total loss "
                                                          "(PPO and SPG).")
    normalize_advantage: bool = Field(True, description="Normalise the advantages of each minibatch to zero "
                                                        "mean and unit variance.")


class VanillaPpoParameters(ParamsModel):
    """No settings of its own (kept for parity with the original tree)."""


class SpgParameters(ParamsModel):
    variant: Literal["spg", "pspg", "lola", "pola", "sos", "psos"] = Field(
        "psos", description="Policy-gradient variant: Stackelberg (spg, pspg), opponent shaping (lola, "
                            "pola) or stable opponent shaping (sos, psos); p-variants use the PPO clipped "
                            "surrogate as the gain.")
    stackelberg_sequence: list[list[str]] | None = Field(
        None, description="Groups of agent names from leader to followers (None: the protocol's, verifiers "
                          "first).")
    additional_lola_term: bool = Field(True, description="lola and pola: include the higher-order (second) "
                                                         "LOLA term; always on for sos and psos.")
    sos_scaling_factor: float = Field(
        0.5, gt=0.0, le=1.0, description="sos and psos: a, the scale of the opponent-shaping correction, in "
                                         "(0, 1].")
    sos_threshold_factor: float = Field(
        0.1, gt=0.0, description="sos and psos: b, the threshold below which the correction is not scaled "
                                 "down (> 0).")
    ihvp_variant: Literal["nystrom", "conj_grad"] = Field(
        "nystrom", description="inverse-Hessian-vector product of the Stackelberg variants: Nyström "
                               "(rank ihvp_rank) or conjugate gradients (ihvp_num_iterations steps); the "
                               "original's 'neumann' was never implemented and is refused")
    ihvp_num_iterations: int = Field(5, gt=0, description="conjugate-gradient steps (ihvp_variant='conj_grad')")
    ihvp_rank: int = Field(5, gt=0, description="Hessian rows sampled by the Nyström approximation")
    ihvp_rho: float = Field(0.1, gt=0.0, description="damping ρ of (H + ρI)⁻¹")


class ReinforceParameters(ParamsModel):
    use_advantage_and_critic: bool = Field(False, description="Train a critic and weight the "
                                                              "log-probabilities by the normalised GAE "
                                                              "advantage instead of the return.")


class SoloAgentParameters(ParamsModel):
    num_epochs: int = Field(100, gt=0, description="Supervised training epochs of each agent alone.")
    batch_size: int = Field(256, gt=0, description="Datapoints per supervised training step.")
    learning_rate: float = Field(0.001, gt=0.0, description="Learning rate of the supervised training, "
                                                            "scaled by the agents' learning-rate factors.")
    body_lr_factor_override: bool = Field(False, description="Train the body at the plain learning rate, "
                                                             "ignoring the agents' body_lr_factor.")


class TextRlParameters(ParamsModel):
    fine_tune_on_all_previous_rollouts: bool = Field(
        False, description="Fine-tune on the rollouts of every iteration so far instead of the current one "
                           "only.")
    verifier_guess_replacement_proportion: float = Field(
        0.0, ge=0.0, le=1.0, description="Expert iteration: proportion (0 to 1) of the verifier's training "
                                         "examples whose guess is replaced by the true label.")
    verifier_guess_replacement_annealing: Literal["none", "linear", "exponential"] = Field(
        "none", description="How the replacement proportion decays over iterations i: none, linear (p - i x "
                            "rate) or exponential (p (1 - rate)^i).")
    verifier_guess_replacement_annealing_rate: float = Field(
        0.1, ge=0.0, le=1.0, description="Rate (0 to 1) of the annealing of the replacement proportion.")
    save_transcripts: bool = Field(True, description="Write a readable transcript of each iteration's "
                                                     "rollouts to the run store.")
    transcript_format: Literal["yaml", "json"] = Field("yaml", description="File format of the transcripts.")
    test_scheme: Annotated[Literal["none", "all", "last", "first_and_last"],
                           BaseRunPreserve("rerun_tests")] = Field(
        "none", description="Which iterations' models are tested: none, all, the last, or the first and the "
                            "last.")
    test_on_whole_dataset: Annotated[bool, BaseRunPreserve("rerun_tests")] = Field(
        True, description="Test on every test datapoint (x num_test_iterations); False: "
                          "rollouts_per_iteration datapoints.")
    fine_tune_n_epochs: Annotated[int, Field(gt=0, le=100)] | Literal["auto"] = Field(
        "auto", description="Epochs of every fine-tune job (the API's n_epochs hyperparameter): 'auto' leaves "
                            "them to the API (OpenAI picks by dataset size; nipflow's transformers engine "
                            "trains 3 below 1,000 examples). On a CPU an epoch of a real model is most of an "
                            "iteration's time.")
    fine_tune_max_attempts: int = Field(
        3, ge=1, le=20,
        description="jobs per (iteration, group): a failed or cancelled fine-tune job is retried as a new "
                    "attempt until this many have ended badly, then the run fails listing every error")


class PureTextEiParameters(ParamsModel):
    rollout_selection_method: Literal["threshold", "weighted_sampling"] = Field(
        "threshold", description="Which rollouts an agent is fine-tuned on: those with reward >= "
                                 "reward_threshold, or a reward-weighted sample.")
    reward_threshold: float = Field(0.9, description="threshold: the minimum episode reward of a rollout "
                                                     "kept for fine-tuning.")
    weighting_sample_size_factor: float = Field(
        0.5, gt=0.0, description="weighted_sampling: sample size as a fraction of the rollouts (> 0).")
    weighting_minimum: float | None = Field(None, description="weighted_sampling: reward subtracted before "
                                                              "weighting, weights clipped at 0 (None: the "
                                                              "lowest reward).")
    weighting_use_replacement: bool = Field(True, description="weighted_sampling: sample with replacement.")
    weighting_epsilon: float = Field(
        0.01, ge=0.0, description="weighted_sampling: weight added to every rollout (divided by their "
                                  "number), so each can be drawn.")


class PureTextMaltParameters(ParamsModel):
    num_responses_per_timestep: int = Field(
        2, ge=2, description="Replies sampled per unfinished node of the rollout tree in each round (>= 2).")


class BaseRunParameters(ParamsModel):
    base_run_type: Literal["none", "parameters", "rerun_tests"] = Field(
        "none", description="Start from another run: none; parameters (take its hyper-parameters); "
                            "rerun_tests (its hyper-parameters and models, testing again).")
    run_id: str | None = Field(None, description="The base run's id (required unless base_run_type is none).")
    rerun_tests_force_test_during_training_state: bool = unsupported_field(
        True, "rerun_tests: re-run the tests of the iterations before the last too.",
        "rerun_tests tests the iterations that text_rl.test_scheme names, like any run.")

    @model_validator(mode="after")
    def _needs_run_id(self) -> "BaseRunParameters":
        if self.base_run_type != "none" and not self.run_id:
            raise ValueError("run_id is required when base_run_type is not 'none'")
        return self
