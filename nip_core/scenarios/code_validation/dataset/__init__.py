"""The offline code-validation dataset: problems, mutations, sandbox, builder, loaders.

Typical use::

    from nip_core.scenarios.code_validation.dataset import CodeValidationDataset

    train = CodeValidationDataset.from_name("nipflow-cv", "train")
    datapoint = train[0]          # CodeValidationDatapoint(question=..., solution=..., y=...)
    train.labels                  # numpy int64 array

Modules: :mod:`.problems` (the problem bank), :mod:`.mutations` (AST mutation
operators), :mod:`.sandbox` (sandboxed execution), :mod:`.build` (the deterministic
builder behind ``scripts/build_cv_dataset.py``), :mod:`.loader` and
:mod:`.buggy_apps` (reading datasets), :mod:`.records` (datapoint model and errors).
"""

from .buggy_apps import read_buggy_apps
from .build import BuildConfig, BuildResult, build_dataset, write_dataset
from .loader import (
    SHIPPED_DATASET_PATH,
    CodeValidationDataset,
    dataset_names,
    load_dataset,
    read_jsonl_dataset,
    register_dataset,
)
from .mutations import MUTATION_OPERATORS, Mutant, MutationOperator, generate_mutants
from .problems import ProblemBankError, ProblemSpec, load_problems, render_question
from .records import (
    CodeValidationDatapoint,
    DatasetError,
    DatasetFormatError,
    InvalidSplitError,
    UnknownDatasetError,
    get_hash_parity,
)
from .sandbox import CheckResult, ExecutionResult, ResourceLimits, TestCase, check_solution, run_solution

__all__ = [
    "MUTATION_OPERATORS",
    "SHIPPED_DATASET_PATH",
    "BuildConfig",
    "BuildResult",
    "CheckResult",
    "CodeValidationDatapoint",
    "CodeValidationDataset",
    "DatasetError",
    "DatasetFormatError",
    "ExecutionResult",
    "InvalidSplitError",
    "Mutant",
    "MutationOperator",
    "ProblemBankError",
    "ProblemSpec",
    "ResourceLimits",
    "TestCase",
    "UnknownDatasetError",
    "build_dataset",
    "check_solution",
    "dataset_names",
    "generate_mutants",
    "get_hash_parity",
    "load_dataset",
    "load_problems",
    "read_buggy_apps",
    "read_jsonl_dataset",
    "register_dataset",
    "render_question",
    "run_solution",
    "write_dataset",
]
