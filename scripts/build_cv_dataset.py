"""Build the shipped code-validation dataset (deterministic for a given seed).

Usage (from the repository root)::

    .venv/bin/python scripts/build_cv_dataset.py                 # rebuild the shipped file
    .venv/bin/python scripts/build_cv_dataset.py --out-dir /tmp/cv --problem cv-001 --problem cv-002
    .venv/bin/python scripts/build_cv_dataset.py --check         # rebuild in memory, compare

Writes ``cv_dataset.jsonl`` and ``cv_manifest.json`` into the output folder (default:
``nip_core/scenarios/code_validation/data``) and prints the counts and build time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nip_core.scenarios.code_validation.dataset.build import (  # noqa: E402
    DATA_DIR,
    DATASET_FILENAME,
    BuildConfig,
    build_dataset,
    serialise_items,
    write_dataset,
)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=BuildConfig().seed, help="build seed")
    parser.add_argument("--out-dir", type=Path, default=DATA_DIR, help="output folder")
    parser.add_argument(
        "--problem", action="append", dest="problems", help="use only this problem id (repeatable)"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="do not write; exit 1 if the build differs from the file in --out-dir",
    )
    parser.add_argument(
        "--workers", type=int, default=2, help="problems built concurrently (never changes the output)"
    )
    parser.add_argument("--quiet", action="store_true", help="no per-problem progress")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s")
    config = BuildConfig(seed=args.seed, problem_ids=args.problems)
    result = build_dataset(config, workers=args.workers)
    counts = result.manifest["counts"]
    summary = {
        "items": result.manifest["num_items"],
        "counts": counts,
        "problems": {k: len(v) for k, v in result.manifest["problems"].items()},
        "mutants_executed": result.mutants_executed,
        "short_of_buggy": result.manifest["problems_short_of_buggy_variants"],
        "build_seconds": round(result.seconds, 1),
    }

    if args.check:
        existing = args.out_dir / DATASET_FILENAME
        fresh = serialise_items(result.items)
        same = existing.is_file() and existing.read_bytes() == fresh
        summary["sha256"] = hashlib.sha256(fresh).hexdigest()
        summary["matches_existing"] = same
        print(json.dumps(summary, indent=2))
        return 0 if same else 1

    dataset_path, manifest_path = write_dataset(result, args.out_dir)
    summary["written"] = [str(dataset_path), str(manifest_path)]
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
