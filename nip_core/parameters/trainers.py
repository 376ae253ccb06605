"""Trainer parameter groups (``rl``, ``ppo``, ``spg``, ``reinforce``, ``solo_agent``, text RL)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from nip_core.parameters.base import BaseRunPreserve, ParamsModel


class RlTrainerParameters(ParamsModel):
    """Common RL settings; pure-text trainers use ``num_iterations``, ``rollouts_per_iteration``,
    ``frames_per_batch`` and ``num_test_iterations`` too."""

    frames_per_batch: int | None = Field(1000, gt=0)
    rollouts_per_iteration: int | None = Field(None, gt=0)
    steps_per_env_per_iteration: int | None = Field(None, gt=0)
    num_iterations: int = Field(1000, ge=0)
    num_epochs: int = Field(4, gt=0)
    minibatch_size: int = Field(64, gt=0)
    lr: float = Field(0.003, ge=0.0)
    anneal_lr: bool = False
    max_grad_norm: float = Field(1.0, gt=0.0)
    loss_critic_type: Literal["smooth_l1", "l1", "l2"] = "smooth_l1"
    clip_value: bool | float = False
    normalize_observations: bool = True
    num_normalization_steps: int = Field(1000, gt=0)
    gamma: float = Field(0.9, ge=0.0, le=1.0)
    lmbda: float = Field(0.95, ge=0.0, le=1.0)
    use_shared_body: bool = True
    num_test_iterations: Annotated[int, BaseRunPreserve("rerun_tests")] = Field(10, ge=0)
    optimizer: Literal["adam", "adamw", "sgd", "rmsprop", "adagrad"] = Field(
        "adam", description="TensorDict trainers' optimiser (the original always used Adam)")
    optimizer_eps: float = Field(1e-5, gt=0.0, description="eps of adam, adamw, rmsprop and adagrad")
    betas: tuple[float, float] = Field((0.9, 0.999), description="adam/adamw moment decay rates")
    momentum: float = Field(0.0, ge=0.0, lt=1.0, description="sgd/rmsprop momentum")
    weight_decay: float = Field(0.0, ge=0.0, description="weight decay (decoupled for adamw, L2 otherwise)")
    gradient_accumulation_steps: int = Field(
        1, gt=0, description="minibatches whose gradients are averaged into one optimiser step")
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
    loss_type: Literal["clip", "kl_penalty"] = "clip"
    clip_epsilon: float = Field(0.2, gt=0.0)
    kl_target: float = Field(0.01, gt=0.0)
    kl_beta: float = Field(1.0, ge=0.0)
    kl_decrement: float = Field(0.5, gt=0.0)
    kl_increment: float = Field(2.0, gt=0.0)
    critic_coef: float = Field(1.0, ge=0.0)
    entropy_eps: float = Field(0.001, ge=0.0)
    normalize_advantage: bool = True


class VanillaPpoParameters(ParamsModel):
    """No settings of its own (kept for parity with the original tree)."""


class SpgParameters(ParamsModel):
    variant: Literal["spg", "pspg", "lola", "pola", "sos", "psos"] = "psos"
    stackelberg_sequence: list[list[str]] | None = None
    additional_lola_term: bool = True
    sos_scaling_factor: float = Field(0.5, gt=0.0, le=1.0)
    sos_threshold_factor: float = Field(0.1, gt=0.0)
    ihvp_variant: Literal["nystrom", "conj_grad"] = Field(
        "nystrom", description="inverse-Hessian-vector product of the Stackelberg variants: Nyström "
                               "(rank ihvp_rank) or conjugate gradients (ihvp_num_iterations steps); the "
                               "original's 'neumann' was never implemented and is refused")
    ihvp_num_iterations: int = Field(5, gt=0, description="conjugate-gradient steps (ihvp_variant='conj_grad')")
    ihvp_rank: int = Field(5, gt=0, description="Hessian rows sampled by the Nyström approximation")
    ihvp_rho: float = Field(0.1, gt=0.0, description="damping ρ of (H + ρI)⁻¹")


class ReinforceParameters(ParamsModel):
    use_advantage_and_critic: bool = False


class SoloAgentParameters(ParamsModel):
    num_epochs: int = Field(100, gt=0)
    batch_size: int = Field(256, gt=0)
    learning_rate: float = Field(0.001, gt=0.0)
    body_lr_factor_override: bool = False


class TextRlParameters(ParamsModel):
    fine_tune_on_all_previous_rollouts: bool = False
    verifier_guess_replacement_proportion: float = Field(0.0, ge=0.0, le=1.0)
    verifier_guess_replacement_annealing: Literal["none", "linear", "exponential"] = "none"
    verifier_guess_replacement_annealing_rate: float = Field(0.1, ge=0.0, le=1.0)
    save_transcripts: bool = True
    transcript_format: Literal["yaml", "json"] = "yaml"
    test_scheme: Annotated[Literal["none", "all", "last", "first_and_last"],
                           BaseRunPreserve("rerun_tests")] = "none"
    test_on_whole_dataset: Annotated[bool, BaseRunPreserve("rerun_tests")] = True
    fine_tune_max_attempts: int = Field(
        3, ge=1, le=20,
        description="jobs per (iteration, group): a failed or cancelled fine-tune job is retried as a new "
                    "attempt until this many have ended badly, then the run fails listing every error")


class PureTextEiParameters(ParamsModel):
    rollout_selection_method: Literal["threshold", "weighted_sampling"] = "threshold"
    reward_threshold: float = 0.9
    weighting_sample_size_factor: float = Field(0.5, gt=0.0)
    weighting_minimum: float | None = None
    weighting_use_replacement: bool = True
    weighting_epsilon: float = Field(0.01, ge=0.0)


class PureTextMaltParameters(ParamsModel):
    num_responses_per_timestep: int = Field(2, ge=2)


class BaseRunParameters(ParamsModel):
    base_run_type: Literal["none", "parameters", "rerun_tests"] = "none"
    run_id: str | None = None
    rerun_tests_force_test_during_training_state: bool = True

    @model_validator(mode="after")
    def _needs_run_id(self) -> "BaseRunParameters":
        if self.base_run_type != "none" and not self.run_id:
            raise ValueError("run_id is required when base_run_type is not 'none'")
        return self
