"""Deterministic builder of the shipped code-validation dataset.

For every problem of the bank:

1. every correct solution is executed on all tests and must pass them (else the bank
   is broken and the build stops with :class:`ProblemBankError`);
2. all single-site mutants of all correct solutions are generated and put in a seeded
   order that alternates between mutation operators (diversity first);
3. mutants are executed in that order until there are as many buggy variants as
   correct solutions. A mutant counts as buggy only if it fails at least one test and
   never exceeds the CPU limit; subtle ones (passing at least ``min_pass_fraction`` of
   the tests) are preferred, blunt ones (and ones crashing on every test: never) are
   used only to fill up.

Problems are split into train/test by problem (never both), and each split is
shuffled with the seed. Same seed and same bank give byte-identical output: all
randomness comes from ``random.Random`` seeded with strings, endless loops are caught
by a CPU-time limit (insensitive to machine load) rather than a wall-clock one, and
the child interpreters run with a pinned hash seed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from pydantic import BaseModel, ConfigDict, Field

from nip_core.utils.fileio import atomic_write_bytes

from .mutations import MUTATION_OPERATORS, Mutant, generate_mutants
from .problems import ProblemBankError, ProblemSpec, load_problems, render_question
from .records import CodeValidationDatapoint, get_hash_parity
from .sandbox import ResourceLimits, check_solution

__all__ = [
    "BuildConfig",
    "BuildResult",
    "DATA_DIR",
    "DATASET_FILENAME",
    "MANIFEST_FILENAME",
    "build_dataset",
    "serialise_items",
    "write_dataset",
]

logger = logging.getLogger(__name__)

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
DATASET_FILENAME = "cv_dataset.jsonl"
MANIFEST_FILENAME = "cv_manifest.json"
FORMAT_VERSION = 1
_BATCH = 4  # concurrent test runs per mutant batch


class BuildConfig(BaseModel):
    """Parameters of a dataset build (all of them are recorded in the manifest).

    Attributes
    ----------
    seed : int
        Seeds the split, the mutant order and the item order.
    test_fraction : float
        Fraction of the problems put in the test split.
    cpu_limit_s : int
        Per-test CPU-time limit for mutants; exceeding it counts as a timeout (and
        rejects the mutant). CPU time, unlike wall-clock time, does not depend on the
        machine's load, so the build gives the same result on a busy machine.
    timeout_s : float
        Per-test wall-clock back-stop (also the limit for the correct solutions).
    min_pass_fraction : float
        Mutants passing fewer tests than this are only used when too few subtle ones
        exist.
    max_candidates_per_problem : int
        Upper bound on mutants executed per problem.
    problem_ids : list of str, optional
        Build from these problems only (default: the whole bank).
    """

    model_config = ConfigDict(frozen=True)

    seed: int = 20250101
    test_fraction: float = Field(default=0.2, gt=0.0, lt=1.0)
    cpu_limit_s: int = 1
    timeout_s: float = 20.0
    min_pass_fraction: float = 0.25
    max_candidates_per_problem: int = 40
    problem_ids: list[str] | None = None


class BuildResult(BaseModel):
    """Items and manifest of a build, plus statistics that are not persisted."""

    items: list[CodeValidationDatapoint]
    manifest: dict
    seconds: float
    mutants_executed: int


class _Variant(BaseModel):
    solution: str
    y: int
    mutation: str | None = None
    mutation_description: str | None = None
    pass_fraction: float = 1.0


def _check_correct(problem: ProblemSpec, config: BuildConfig) -> None:
    for k, solution in enumerate(problem.solutions):
        result = check_solution(solution, problem.tests, timeout_s=config.timeout_s)
        if not result.all_passed:
            raise ProblemBankError(
                f"problem {problem.id}: solution #{k} does not pass its tests "
                f"(outcomes {result.outcomes})"
            )


def _ordered_candidates(problem: ProblemSpec, seed: int) -> list[Mutant]:
    """Mutants of all correct solutions, interleaved across operators, seeded."""
    rng = random.Random(f"{seed}:mutants:{problem.id}")
    correct = set(problem.solutions)
    by_op: dict[str, list[Mutant]] = defaultdict(list)
    seen: set[str] = set()
    for solution in problem.solutions:
        for mutant in generate_mutants(solution):
            if mutant.code in correct or mutant.code in seen:
                continue
            seen.add(mutant.code)
            by_op[mutant.operator].append(mutant)
    op_names = [op.name for op in MUTATION_OPERATORS if op.name in by_op]
    rng.shuffle(op_names)
    for name in op_names:
        rng.shuffle(by_op[name])
    ordered: list[Mutant] = []
    while any(by_op[name] for name in op_names):
        for name in op_names:
            if by_op[name]:
                ordered.append(by_op[name].pop())
    return ordered


def _run_until_timeout(
    code: str, problem: ProblemSpec, config: BuildConfig
) -> tuple[list[str], float] | None:
    """Per-test outcomes and longest run of a mutant; ``None`` once any test times out.

    Tests run in small concurrent batches so that a mutant that hangs does not
    burn the full timeout on every remaining test. The first (example) test runs
    alone: most endless-loop mutants hang on every input, so one CPU-limited run
    rejects them.
    """
    limits = ResourceLimits(cpu_seconds=config.cpu_limit_s)
    batches = [problem.tests[:1]] + [
        problem.tests[k : k + _BATCH] for k in range(1, len(problem.tests), _BATCH)
    ]
    outcomes: list[str] = []
    longest = 0.0
    for batch in batches:
        result = check_solution(
            code, batch, timeout_s=config.timeout_s, max_workers=min(len(batch), _BATCH), limits=limits
        )
        if result.timeouts:
            return None
        outcomes.extend(result.outcomes)
        longest = max(longest, result.max_duration_s)
    return outcomes, longest


def _select_buggy(problem: ProblemSpec, config: BuildConfig, wanted: int) -> tuple[list[_Variant], int]:
    """Execute candidates until ``wanted`` verified-buggy variants are found."""
    subtle: list[_Variant] = []
    blunt: list[_Variant] = []
    executed = 0
    for mutant in _ordered_candidates(problem, config.seed)[: config.max_candidates_per_problem]:
        if len(subtle) >= wanted:
            break
        executed += 1
        run = _run_until_timeout(mutant.code, problem, config)
        if run is None:
            logger.debug("%s: timeout: %s", problem.id, mutant.description)
            continue
        outcomes, longest = run
        summary = "".join(o[0] for o in outcomes)  # e.g. "ppfpe": pass, fail, error
        logger.debug("%s: %.3fs %s %s", problem.id, longest, summary, mutant.description)
        if all(o == "pass" for o in outcomes):
            continue  # equivalent to a correct solution on these tests
        if all(o == "error" for o in outcomes):
            continue  # crashes on every input: not a plausible candidate
        pass_fraction = outcomes.count("pass") / len(outcomes)
        variant = _Variant(
            solution=mutant.code,
            y=0,
            mutation=mutant.operator,
            mutation_description=mutant.description,
            pass_fraction=pass_fraction,
        )
        (subtle if pass_fraction >= config.min_pass_fraction else blunt).append(variant)
    chosen = (subtle + blunt)[:wanted]
    return chosen, executed


def _split_problems(problem_ids: list[str], config: BuildConfig) -> dict[str, str]:
    ids = sorted(problem_ids)
    random.Random(f"{config.seed}:split").shuffle(ids)
    n_test = min(len(ids) - 1, max(1, round(len(ids) * config.test_fraction))) if len(ids) > 1 else 0
    return {pid: ("test" if k < n_test else "train") for k, pid in enumerate(ids)}


def _variants_of(problem: ProblemSpec, config: BuildConfig) -> tuple[list[_Variant], list[_Variant], int]:
    """(correct, buggy, mutants executed) for one problem; independent of the others."""
    _check_correct(problem, config)
    correct = [_Variant(solution=s, y=1) for s in problem.solutions]
    buggy, executed = _select_buggy(problem, config, wanted=len(correct))
    logger.info("%s: %d correct, %d buggy (%d mutants run)", problem.id, len(correct), len(buggy), executed)
    return correct, buggy, executed


def build_dataset(
    config: BuildConfig | None = None,
    problems: list[ProblemSpec] | None = None,
    *,
    workers: int = 2,
) -> BuildResult:
    """Build the dataset: verify, mutate, execute, split and order.

    Parameters
    ----------
    config : BuildConfig, optional
        Build parameters (defaults reproduce the shipped file).
    problems : list of ProblemSpec, optional
        The bank (default: :func:`load_problems`), filtered by ``config.problem_ids``.
    workers : int
        Problems processed concurrently. Each problem's result depends only on the
        problem and the seed, so this changes the speed, never the output.

    Returns
    -------
    BuildResult
        Items (ids assigned, train first), manifest (without the file hash, which
        :func:`write_dataset` adds) and timing.

    Raises
    ------
    ProblemBankError
        If a correct solution fails its tests or a requested problem id is unknown.
    """
    config = config or BuildConfig()
    start = time.monotonic()
    bank = problems if problems is not None else load_problems()
    if config.problem_ids is not None:
        known = {p.id for p in bank}
        missing = sorted(set(config.problem_ids) - known)
        if missing:
            raise ProblemBankError(f"unknown problem ids: {missing}")
        bank = [p for p in bank if p.id in set(config.problem_ids)]
    bank = sorted(bank, key=lambda p: p.id)
    split_of = _split_problems([p.id for p in bank], config)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = list(pool.map(lambda p: _variants_of(p, config), bank))

    rows: dict[str, list[dict]] = {"train": [], "test": []}
    short = [p.id for p, (correct, buggy, _) in zip(bank, results) if len(buggy) < len(correct)]
    executed_total = sum(executed for _, _, executed in results)
    buggy_pass_fractions = [v.pass_fraction for _, buggy, _ in results for v in buggy]
    for problem, (correct, buggy, _) in zip(bank, results):
        question = render_question(problem)
        for variant in correct + buggy:
            rows[split_of[problem.id]].append(
                dict(
                    problem_id=problem.id,
                    question=question,
                    solution=variant.solution,
                    y=variant.y,
                    split=split_of[problem.id],
                    prover_stance=get_hash_parity(variant.solution),
                    mutation=variant.mutation,
                    mutation_description=variant.mutation_description,
                    difficulty=problem.difficulty,
                )
            )

    items: list[CodeValidationDatapoint] = []
    for split in ("train", "test"):
        random.Random(f"{config.seed}:order:{split}").shuffle(rows[split])
        items.extend(CodeValidationDatapoint(id=len(items), **row) for row in rows[split])

    manifest = _manifest(items, config, split_of, executed_total, short)
    if buggy_pass_fractions:
        # how subtle the bugs are: the share of its tests a buggy solution still passes
        manifest["buggy_tests_passed_fraction"] = {
            "mean": round(sum(buggy_pass_fractions) / len(buggy_pass_fractions), 4),
            "min": round(min(buggy_pass_fractions), 4),
        }
    return BuildResult(
        items=items,
        manifest=manifest,
        seconds=time.monotonic() - start,
        mutants_executed=executed_total,
    )


def _manifest(
    items: list[CodeValidationDatapoint],
    config: BuildConfig,
    split_of: dict[str, str],
    executed: int,
    short: list[str],
) -> dict:
    counts: dict[str, dict[str, int]] = {}
    for split in ("train", "test"):
        labels = Counter(item.y for item in items if item.split == split)
        counts[split] = {"correct": labels[1], "buggy": labels[0], "total": labels[0] + labels[1]}
    return {
        "format_version": FORMAT_VERSION,
        "dataset_file": DATASET_FILENAME,
        "build_seed": config.seed,
        "build_config": config.model_dump(),
        "num_items": len(items),
        "counts": counts,
        "problems": {
            split: sorted(pid for pid, s in split_of.items() if s == split) for split in ("train", "test")
        },
        "mutation_counts": dict(sorted(Counter(i.mutation for i in items if i.mutation).items())),
        "problems_short_of_buggy_variants": short,
        "mutants_executed": executed,
    }


def serialise_items(items: list[CodeValidationDatapoint]) -> bytes:
    """The JSONL bytes of ``items`` (one compact JSON object per line, UTF-8)."""
    lines = [json.dumps(item.model_dump(), ensure_ascii=False) for item in items]
    return ("\n".join(lines) + "\n").encode("utf-8")


def write_dataset(result: BuildResult, out_dir: str | Path = DATA_DIR) -> tuple[Path, Path]:
    """Write the JSONL file and its manifest atomically.

    Parameters
    ----------
    result : BuildResult
        Output of :func:`build_dataset`.
    out_dir : str or Path
        Target folder (default: the package's ``data`` folder).

    Returns
    -------
    (Path, Path)
        Paths of the dataset file and the manifest.
    """
    out_dir = Path(out_dir)
    data = serialise_items(result.items)
    manifest = dict(result.manifest, sha256=hashlib.sha256(data).hexdigest())
    dataset_path = out_dir / DATASET_FILENAME
    manifest_path = out_dir / MANIFEST_FILENAME
    atomic_write_bytes(dataset_path, data)
    atomic_write_bytes(manifest_path, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    return dataset_path, manifest_path
